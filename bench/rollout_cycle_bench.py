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
- the next cycle given the function's time (`CYCLE_BUDGET_SECONDS`), as on AWS: the last 100 claims of
  each rollout and the drains waiting, as far as the time goes; the steps it leaves are deferred.

The baseline and the first cycle are given all the time they need, so that they do their whole work on a
slow machine too; their wall times are set against the function's time and against each other. Drain
executions are recorded by moto, not run.
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
from fleetkeeper.services.reconcile.cycle import SAFETY_MARGIN_SECONDS
from fleetkeeper.services.rollouts.step import CLAIM_THREADS, CLAIMS_PER_STEP, MAX_ROLLOUTS_PER_CYCLE
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
    # Workers the rollouts claimed in the cycle.
    claims: int = 0

    @property
    def steps(self) -> int:
        return self.counters.get("rollout_steps", 0)

    @property
    def deferred(self) -> int:
        """Rollout steps and worker steps left for the next cycle for want of time."""
        return self.counters.get("rollouts_deferred", 0) + self.counters.get("deferred", 0)


def _cycle(label: str, budget: float | None = None) -> Cycle:
    """One reconcile cycle, with `budget` seconds as the function's time left (all it needs if None)."""
    with reads() as seen:
        ctx = default_context()
        started = time.monotonic()
        left = None if budget is None else (lambda: budget - (time.monotonic() - started))
        report = reconcile_fleet(ctx, time_left=left)
        seconds = time.monotonic() - started
    counters = dict(report.counters)
    print(f"{label}: {seconds:.1f} s, {seen.service('dynamodb')} DynamoDB requests, {counters}", flush=True)
    return Cycle(label, seconds, seen, counters)


def _claimed(rollout_ids: list[str]) -> int:
    ctx = default_context()
    return sum(ctx.rollouts.get(rollout_id).claimed for rollout_id in rollout_ids)


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _extra(cycle: Cycle, base: Cycle) -> str:
    """The calls a cycle made beyond the baseline's, by operation, most first."""
    more = cycle.reads.calls - base.reads.calls
    return ", ".join(f"{name} +{n:,}" for name, n in more.most_common())


def section(size: int, cycles: list[Cycle]) -> str:
    base, first, budgeted = cycles
    lines = [
        "## A reconcile cycle with 20 active rollouts",
        "",
        f"{size:,} RUNNING workers on emulated machines in pool `{POOL}`, {ROLLOUTS} templates of "
        f"{per_template():,}; {ROLLOUTS} `drain_first` rollouts (one per template, `max_unavailable` "
        f"{WAVE}, a pool budget of 10% for `rollout`), each started through the service the API "
        f"calls (a start claims {CLAIMS_PER_STEP} workers). The baseline is a cycle of the same fleet "
        "before the starts, in the same run; it and the first cycle after the starts run with all the "
        "time they need. The next cycle is given the function's "
        f"{CYCLE_BUDGET_SECONDS:.0f} s, as on AWS: it stops starting worker and rollout steps "
        f"{SAFETY_MARGIN_SECONDS:.0f} s before the end and defers the rest. Drain executions are recorded "
        "by moto, not run.",
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
            f"| {c.label} | {c.seconds:.1f} | {c.seconds / base.seconds:.1f} | {c.steps} | {c.deferred} "
            f"| {c.reads.service('dynamodb'):,} | {c.reads.index_items:,} | {others} | {c.reads.shown()} |"
        )
    share = first.seconds - base.seconds
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [
        "",
        "| goal | figure | result |",
        "|---|---|---|",
        f"| {first.label}: its whole work within the cycle's {CYCLE_BUDGET_SECONDS:.0f} s "
        f"| {first.seconds:.1f} s | {_met(first.seconds <= CYCLE_BUDGET_SECONDS)} |",
        f"| {first.label}: every rollout takes its step | {first.steps} of {ROLLOUTS} "
        f"| {_met(first.steps == ROLLOUTS)} |",
        f"| {budgeted.label}: ends within the {CYCLE_BUDGET_SECONDS:.0f} s | {budgeted.seconds:.1f} s "
        f"| {_met(budgeted.seconds <= CYCLE_BUDGET_SECONDS)} |",
        f"| {budgeted.label}: every rollout takes its step | {budgeted.steps} of {ROLLOUTS} "
        f"({budgeted.counters.get('rollouts_deferred', 0)} deferred) | {_met(budgeted.steps == ROLLOUTS)} |",
        "",
        f"What the rollouts add to the first cycle: {share:.1f} s, {share / max(first.steps, 1):.1f} s a "
        f"step, and these calls beyond the baseline's: {_extra(first, base)}. A step claims "
        f"{CLAIMS_PER_STEP} workers (a GetItem and a conditional write each, {CLAIM_THREADS} at once) and "
        f"asks the door for its wave's {WAVE} drains (a drain start each): this cycle claimed "
        f"{first.claims:,} workers and started {first.reads.calls['sfn:StartExecution']:,} "
        f"drains. The baseline alone takes {base.seconds:.1f} s here, "
        f"{'over' if base.seconds > CYCLE_BUDGET_SECONDS else 'within'} the budget: a cycle first reads "
        "the fleet (the status index, DescribeInstances and GetMetricData, answered by the in-process "
        "moto server), and only what comes after that read is deferred when time runs short; the cycle "
        f"given {CYCLE_BUDGET_SECONDS:.0f} s shows what that read alone costs on this machine. The times "
        f"follow the shared machine's load (1, 5 and 15 minute averages at the end of the run: {load}), "
        "the call counts do not.",
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
        started = [
            rollouts.start(
                ctx,
                RolloutRequest(
                    template=template, pool=POOL, max_unavailable=WAVE, strategy=RolloutStrategy.DRAIN_FIRST
                ),
                actor="bench",
            ).id
            for template in _templates()
        ]
        for label, budget in (
            ("first after the starts", None),
            (f"next, given {CYCLE_BUDGET_SECONDS:.0f} s", CYCLE_BUDGET_SECONDS),
        ):
            before = _claimed(started)
            cycles.append(_cycle(label, budget))
            cycles[-1].claims = _claimed(started) - before
    return section(size, cycles)


if __name__ == "__main__":
    print(run())
