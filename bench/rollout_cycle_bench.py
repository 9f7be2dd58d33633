"""One reconcile cycle that advances 20 active rollouts over a pool of 10,000 RUNNING workers, against the
cycle's time budget.

The pool holds 20 templates of 500 workers each, every worker on its own emulated machine (written
straight to the table, as bench/reconcile_bench.py builds its fleets); 20 `drain_first` rollouts, one per
template, `max_unavailable` 25, are started through the service the API calls (each claims its first 200
workers). Then, each with the calls made and the items read:

- the baseline: a cycle of the same fleet before any rollout starts (in the same run: the machine is
  shared and its pace changes);
- the first cycle after the starts: each rollout's step claims 200 more workers and asks for its first
  wave's 25 drains;
- the next cycle: the last 100 claims of each, and the drains waiting.

Each cycle is given all the time it needs, so that it does its whole work on a slow machine too (on AWS
the function stops starting rollout steps 10 s before its end), and its wall time is set against the
function's time on AWS (`CYCLE_BUDGET_SECONDS`) and against the baseline. Drain executions are recorded
by moto, not run.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Final

import boto3
from botocore.config import Config

from bench.reconcile_bench import fleet_stack, launch_machines, write_fleet
from bench.rollout_step_bench import POOL, Reads, bench_pool, drain_plane_without_executions, quiet, reads
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.rollouts import RolloutRequest, RolloutStrategy
from fleetkeeper.services import rollouts
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper.services.rollouts.step import MAX_ROLLOUTS_PER_CYCLE
from fleetkeeper_local.stack import LOCAL_REGION

ROLLOUTS: Final = MAX_ROLLOUTS_PER_CYCLE
WAVE: Final = 25
# The reconcile function's timeout at the default 1-minute rate (infra/functions.py: 55 s a minute).
CYCLE_BUDGET_SECONDS: Final = 55.0


def per_template() -> int:
    """Workers of each template: 500 (10,000 in all) unless `ROLLOUT_CYCLE_BENCH_PER_TEMPLATE` says."""
    return int(os.environ.get("ROLLOUT_CYCLE_BENCH_PER_TEMPLATE", "500"))


def _templates() -> list[str]:
    return [f"bench-{n:02d}" for n in range(ROLLOUTS)]


def _fleet(ctx: Context) -> int:
    """per_template() workers of each template in the pool, each on its own emulated machine."""
    ec2 = boto3.client("ec2", config=Config(read_timeout=900, retries={"total_max_attempts": 1}))
    image = ec2.register_image(Name="bench-2026.01", RootDeviceName="/dev/sda1")["ImageId"]
    bench_pool(ctx, _templates(), "10%")
    now = utcnow()
    fleet: list[Worker] = []
    for n, template in enumerate(_templates()):
        for raw in launch_machines(ec2, image, per_template(), template=template):
            fleet.append(
                Worker(
                    id=f"w-{len(fleet):016x}",
                    template=template,
                    pool=POOL,
                    region=LOCAL_REGION,
                    status=WorkerStatus.RUNNING,
                    ec2_instance_id=raw["InstanceId"],
                    private_ip=raw.get("PrivateIpAddress"),
                    capacity=4,
                    ec2_state="running",
                    ec2_observed_at=now,
                    image_id=image,
                    instance_type="m5.large",
                    launched_at=now,
                    version=3,
                )
            )
        print(f"template {n + 1}/{ROLLOUTS} written", flush=True)
    write_fleet(ctx, fleet)
    return len(fleet)


@dataclass
class Cycle:
    label: str
    seconds: float
    reads: Reads
    counters: dict[str, int]


def _cycle(label: str) -> Cycle:
    with reads() as seen:
        ctx = default_context()
        started = time.monotonic()
        report = reconcile_fleet(ctx)
        seconds = time.monotonic() - started
    counters = dict(report.counters)
    print(f"{label}: {seconds:.1f} s, {seen.service('dynamodb')} DynamoDB requests, {counters}", flush=True)
    return Cycle(label, seconds, seen, counters)


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def section(size: int, cycles: list[Cycle]) -> str:
    base = cycles[0]
    lines = [
        "## A reconcile cycle with 20 active rollouts",
        "",
        f"{size:,} RUNNING workers on emulated machines in pool `{POOL}`, {ROLLOUTS} templates of "
        f"{per_template():,}; {ROLLOUTS} `drain_first` rollouts (one per template, `max_unavailable` "
        f"{WAVE}, a pool budget of 10% for `rollout`), each started through the service the API "
        "calls. Each cycle runs with all the time it needs (on AWS the function stops starting steps "
        f"10 s before its {CYCLE_BUDGET_SECONDS:.0f} s end); the baseline is a cycle of the same fleet "
        "before the starts, in the same run. Drain executions are recorded by moto, not run.",
        "",
        "| cycle | wall s | x baseline | rollout steps | deferred | DynamoDB requests | index items "
        "| other calls | DynamoDB by operation |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for c in cycles:
        others = ", ".join(
            f"{name} {n}" for name, n in sorted(c.reads.calls.items()) if not name.startswith("dynamodb:")
        )
        lines.append(
            f"| {c.label} | {c.seconds:.1f} | {c.seconds / base.seconds:.1f} "
            f"| {c.counters.get('rollout_steps', 0)} | {c.counters.get('rollouts_deferred', 0)} "
            f"| {c.reads.service('dynamodb'):,} | {c.reads.index_items:,} | {others} | {c.reads.shown()} |"
        )
    lines += ["", "| goal | figure | result |", "|---|---|---|"]
    for c in cycles[1:]:
        served = c.counters.get("rollout_steps", 0)
        lines.append(
            f"| {c.label}: within the cycle's {CYCLE_BUDGET_SECONDS:.0f} s | {c.seconds:.1f} s "
            f"| {_met(c.seconds <= CYCLE_BUDGET_SECONDS)} |"
        )
        lines.append(
            f"| {c.label}: every rollout takes its step | {served} of {ROLLOUTS} "
            f"| {_met(served == ROLLOUTS)} |"
        )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [
        "",
        f"Load average (1, 5, 15 minutes) at the end of the run: {load}.",
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    with quiet(), fleet_stack() as stack:
        drain_plane_without_executions(stack)
        ctx = default_context()
        size = _fleet(ctx)
        reconcile_fleet(ctx)  # warm-up: first touches, cold client pools
        cycles = [_cycle("baseline, no rollout")]
        ctx = default_context()
        for template in _templates():
            request = RolloutRequest(
                template=template, pool=POOL, max_unavailable=WAVE, strategy=RolloutStrategy.DRAIN_FIRST
            )
            rollouts.start(ctx, request, actor="bench")
        cycles.append(_cycle("first after the starts"))
        cycles.append(_cycle("second"))
    return section(size, cycles)


if __name__ == "__main__":
    print(run())
