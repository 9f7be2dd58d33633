"""Discovery's status read at fleet scale: DescribeInstanceStatus and DescribeInstanceInformation calls
per sweep, and what the read adds to the sweep's wall time against the same sweep without it, in the same
run.

Steady fleet of `STATUS_SWEEP_BENCH_WORKERS` (default 10,000) RUNNING workers, each on its own emulated
machine, built as bench/reconcile_bench.py `build_fleet` builds them (machines launched 1,000 a
RunInstances, workers written with BatchWriteItem) on `fleet_stack` (moto's region-wide scans swapped for
lookups, DescribeInstances paged as AWS pages it). moto answers DescribeInstanceStatus in one page
whatever MaxResults says; here it pages as AWS does, at most MaxResults statuses a page, so that the
calls counted are the ones AWS would serve. RETIRING_SHARE of the machines carry a simulated retirement
(local/fleetkeeper_local/health.py), which the emulator lists among their status lines. The stage runs
the dev catalogue's operations, collect-system-info on every worker, so every worker uses operations and
its SSM agent counts too: every machine is registered with the emulated Systems Manager, and
AGENT_LOST_SHARE of them have lost their connection. The sweep lists the region's lost agents in one
paged DescribeInstanceInformation filtered on ConnectionLost, and reads by id only the agents of the
workers whose lost connection stands (from the second sweep on).

1. A warm-up sweep: it tags the machines (`build_fleet` leaves out the worker id tag) and records the
   retirements, one health write each. A second, untimed, runs MIGRATION_SETTLE later on the clock, so
   that the machine-key backfill of the freshly written table marks the region done
   (store/machine_keys.py), as it is on any table older than a quarter of an hour.
2. REPEATS pairs, alternating: the sweep, and the same sweep with the status read left out (discovery's
   `_sweep_health` made a no-op), the baseline. Medians of each; their ratio.

Calls are counted through botocore before-call hooks on the clients the services use.

Run: `python -m bench status_sweep` (`STATUS_SWEEP_BENCH_WORKERS=1000` for a short run).
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from unittest.mock import patch

import boto3

from bench.reconcile_bench import CallCounter, build_fleet, counted_clients, fleet_stack, fmt_calls
from fleetkeeper.cloud.clients import client
from fleetkeeper.cloud.ec2 import DESCRIBE_PAGE_SIZE
from fleetkeeper.cloud.ssm import INFORMATION_PAGE_SIZE
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.repair import HealthSource
from fleetkeeper.observability import logger
from fleetkeeper.services import discovery
from fleetkeeper.services.context import Context
from fleetkeeper.services.discovery import DiscoveryReport, discover_and_collect
from fleetkeeper.store.machine_keys import MIGRATION_SETTLE
from fleetkeeper_local.controlplane import local_operations_catalogue
from fleetkeeper_local.health import AGENT_LOST_TAG, EVENT_TAG, event_tag
from fleetkeeper_local.stack import LOCAL_ACCOUNT, LOCAL_REGION

DEFAULT_WORKERS: Final = 10_000
REPEATS: Final = 3
# One machine in a hundred is retiring: enough for the read to find something, few enough to be a fleet.
RETIRING_SHARE: Final = 0.01
# One machine in two hundred has an SSM agent that stopped answering.
AGENT_LOST_SHARE: Final = 0.005
# The status read may add at most half the sweep's own time: discovery runs every 300 s and must stay a
# small part of its period at 10,000 machines.
TIME_GOAL: Final = 1.5
STATUS_CALL: Final = "ec2:DescribeInstanceStatus"
AGENT_CALL: Final = "ssm:DescribeInstanceInformation"
Sweep = tuple[float, Counter[str], DiscoveryReport]


def workers_wanted() -> int:
    return int(os.environ.get("STATUS_SWEEP_BENCH_WORKERS", DEFAULT_WORKERS))


def page_moto_instance_status_like_aws() -> None:
    """Make moto page DescribeInstanceStatus as AWS does: at most MaxResults statuses a page, the rest
    behind a NextToken (moto returns every status in one page). The answers, page by page, are moto's."""
    from moto.ec2.responses.instances import ActionResult, InstanceResponse  # type: ignore[attr-defined]

    def describe_instance_status(self: Any) -> Any:
        found = self.ec2_backend.describe_instance_status(
            self._get_param("InstanceIds", []),
            self._get_bool_param("IncludeAllInstances", False),
            [{"name": k, "values": v} for k, v in self._filters_from_querystring().items()],
        )
        start = int(self._get_param("NextToken") or 0)
        limit = int(self._get_param("MaxResults", DESCRIBE_PAGE_SIZE))
        more = start + limit < len(found)
        return ActionResult(
            {
                "InstanceStatuses": found[start : start + limit],
                "NextToken": str(start + limit) if more else None,
            }
        )

    InstanceResponse.describe_instance_status = describe_instance_status  # type: ignore[method-assign]


def retire(fleet: list[Worker], share: float) -> list[Worker]:
    """Simulate a retirement on every 1/share-th machine of the fleet, a week away."""
    ec2 = boto3.client("ec2")
    step = max(1, round(1 / share))
    retiring = fleet[::step]
    not_before = datetime.now(UTC) + timedelta(days=7)
    for worker in retiring:
        instance_id = worker.ec2_instance_id or ""
        value = event_tag(
            "instance-retirement", not_before, f"instance-event-{instance_id.removeprefix('i-')}"
        )
        ec2.create_tags(Resources=[instance_id], Tags=[{"Key": EVENT_TAG, "Value": value}])
    return retiring


def register_agents(fleet: list[Worker], share: float) -> list[Worker]:
    """Every machine registered with the emulated Systems Manager, as a launch with the stage's instance
    profile registers it (moto gives a launch's profile to its first machine only), and the agent of
    every 1/share-th one disconnected; the disconnected ones."""
    from moto.ec2.models import ec2_backends

    backend = ec2_backends[LOCAL_ACCOUNT][LOCAL_REGION]
    profile = {"Arn": f"arn:aws:iam::{LOCAL_ACCOUNT}:instance-profile/bench-worker", "Id": "bench-worker"}
    for reservation in backend.reservations.values():
        for instance in reservation.instances:
            instance.iam_instance_profile = profile
    lost = fleet[1 :: max(1, round(1 / share))]
    last_ping = datetime.now(UTC).isoformat()
    for worker in lost:
        backend.create_tags([worker.ec2_instance_id or ""], {AGENT_LOST_TAG: last_ping})
    return lost


def sweep(ctx: Context, counter: CallCounter, *, status_read: bool) -> Sweep:
    """One discovery sweep, timed, with its calls; without the status read when asked."""
    counter.take()
    started = time.perf_counter()
    if status_read:
        report = discover_and_collect(ctx)
    else:
        with patch.object(discovery, "_sweep_health", lambda *_, **__: None):
            report = discover_and_collect(ctx)
    return time.perf_counter() - started, counter.take(), report


def measure(size: int) -> dict[str, Any]:
    page_moto_instance_status_like_aws()
    with fleet_stack() as stack:
        # The dev stage's catalogue: its workers collect their system information, so they use operations.
        os.environ["OPERATIONS_CATALOGUE"] = json.dumps(local_operations_catalogue())
        build_started = time.perf_counter()
        ctx, fleet = build_fleet(stack, size)
        retiring = retire(fleet, RETIRING_SHARE)
        lost = register_agents(fleet, AGENT_LOST_SHARE)
        built = time.perf_counter() - build_started
        print(
            f"status sweep: {size:,} workers built in {built:.0f} s, {len(retiring)} retiring, "
            f"{len(lost)} agents lost",
            flush=True,
        )
        counter = CallCounter()
        counter.attach(*counted_clients(), client("ssm", LOCAL_REGION))
        warm_seconds, warm_calls, warm = sweep(ctx, counter, status_read=True)
        print(f"warm-up sweep {warm_seconds:.2f} s: {fmt_calls(warm_calls)}", flush=True)
        discover_and_collect(ctx, now=utcnow() + MIGRATION_SETTLE)
        healths = [w.health for w in ctx.store.iter_workers_by_status([WorkerStatus.RUNNING]) if w.health]
        recorded = sum(1 for h in healths if h.scheduled)
        recorded_lost = sum(1 for h in healths if HealthSource.CONNECTION_LOST in h.standing())
        with_read: list[Sweep] = []
        without: list[Sweep] = []
        for _ in range(REPEATS):
            with_read.append(sweep(ctx, counter, status_read=True))
            without.append(sweep(ctx, counter, status_read=False))
            print(
                f"sweep {with_read[-1][0]:.2f} s ({fmt_calls(with_read[-1][1])}); "
                f"without the status read {without[-1][0]:.2f} s ({fmt_calls(without[-1][1])})",
                flush=True,
            )
    return {
        "size": size,
        "retiring": len(retiring),
        "recorded": recorded,
        "lost": len(lost),
        "recorded_lost": recorded_lost,
        "warm": (warm_seconds, warm_calls, warm),
        "with": with_read,
        "without": without,
    }


def _median_run(
    runs: list[Sweep],
) -> Sweep:
    return sorted(runs, key=lambda run: run[0])[len(runs) // 2]


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def section(result: dict[str, Any]) -> str:
    size = result["size"]
    warm_seconds, warm_calls, warm = result["warm"]
    seconds, calls, report = _median_run(result["with"])
    base_seconds, base_calls, _ = _median_run(result["without"])
    ratio = seconds / base_seconds
    pairs = [w[0] / b[0] for w, b in zip(result["with"], result["without"], strict=True)]
    status_calls = max(r[1][STATUS_CALL] for r in result["with"])
    allowed = math.ceil(size / DESCRIBE_PAGE_SIZE)
    agent_calls = max(r[1][AGENT_CALL] for r in result["with"])
    # The lost agents' pages, and the standing ones by id, 50 a call each.
    lost_pages = max(1, math.ceil(result["lost"] / INFORMATION_PAGE_SIZE))
    agents_allowed = 2 * lost_pages
    steady_writes = max(r[2].counters["health_changed"] for r in result["with"])
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    lines = [
        f"## Discovery's status read at {size:,} workers (bench/status_sweep_bench.py)",
        "",
        f"{size:,} RUNNING workers on emulated machines in one region, {result['retiring']} of them with a "
        f"simulated retirement and {result['lost']} with an SSM agent ConnectionLost; every worker uses "
        f"operations (the dev catalogue's collect-system-info); {machine}, {when}. A warm-up sweep, then "
        f"{REPEATS} pairs of sweeps, "
        "alternating the sweep and the same sweep with the status read left out (the baseline); medians. "
        "moto pages DescribeInstanceStatus as AWS does here (it returns everything in one page otherwise), "
        "so the calls are AWS's; the machines are launched and the workers written as the other "
        "10,000-worker benches do.",
        "",
        "| sweep | wall time (median) | DescribeInstanceStatus calls | DescribeInstanceInformation calls "
        "| DescribeInstances calls (AWS pages) | health writes |",
        "|---|--:|--:|--:|--:|--:|",
        f"| warm-up (tags the machines, records the signals) | {warm_seconds:.2f} s | "
        f"{warm_calls[STATUS_CALL]} | {warm_calls[AGENT_CALL]} | "
        f"{warm_calls['ec2:DescribeInstances (AWS pages)']} | {warm.counters['health_changed']} |",
        f"| with the status read | {seconds:.2f} s | {calls[STATUS_CALL]} | {calls[AGENT_CALL]} | "
        f"{calls['ec2:DescribeInstances (AWS pages)']} | {report.counters['health_changed']} |",
        f"| without it (baseline) | {base_seconds:.2f} s | {base_calls[STATUS_CALL]} | "
        f"{base_calls[AGENT_CALL]} | {base_calls['ec2:DescribeInstances (AWS pages)']} | - |",
        "",
        "| goal | figure | result |",
        "|---|---|---|",
        f"| at most one DescribeInstanceStatus per 1,000 machines per region: ceil({size:,} / 1,000) = "
        f"{allowed} | {status_calls} a sweep | {_met(status_calls <= allowed)} |",
        f"| DescribeInstanceInformation by the lost agents, not by the fleet: one page per "
        f"{INFORMATION_PAGE_SIZE} lost agents of the region, and one by-id call per {INFORMATION_PAGE_SIZE} "
        f"workers whose lost connection stands: 2 x ceil({result['lost']} / {INFORMATION_PAGE_SIZE}) = "
        f"{agents_allowed} (it was ceil({size:,} / {INFORMATION_PAGE_SIZE}) = "
        f"{math.ceil(size / INFORMATION_PAGE_SIZE)} by id) | {agent_calls} a sweep | "
        f"{_met(agent_calls <= agents_allowed)} |",
        f"| the status read adds at most {TIME_GOAL - 1:.0%} to the sweep (ratio to the baseline <= "
        f"{TIME_GOAL}x) | {seconds:.2f} s / {base_seconds:.2f} s = {ratio:.2f}x (pair by pair "
        f"{min(pairs):.2f}x to {max(pairs):.2f}x) "
        f"| {_met(ratio <= TIME_GOAL)} |",
        f"| a steady sweep writes no health (only a change is written) | {steady_writes} writes | "
        f"{_met(steady_writes == 0)} |",
        f"| every retirement recorded by the first sweep | {result['recorded']} of {result['retiring']} | "
        f"{_met(result['recorded'] == result['retiring'])} |",
        f"| every lost agent recorded by the first sweep | {result['recorded_lost']} of {result['lost']} | "
        f"{_met(result['recorded_lost'] == result['lost'])} |",
        "",
        f"Calls of the median sweep: {fmt_calls(calls)}.",
        "",
        "DescribeInstanceStatus filters on no tag: it lists every machine of the account's region, so a "
        "region that also runs machines fleetkeeper does not manage pays for them too (one call per 1,000 "
        "of all of them). DescribeInstanceInformation combines no tag filter with another, so its read "
        "filtered on ConnectionLost lists the lost agents of the account's whole region too, 50 a page; "
        "the workers whose lost connection stands are asked by id, 50 a call, to see them answer again.",
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    # The logger is made at import, before bench_stack sets the level: a line per sweep is noise here.
    level = logger.log_level
    logger.setLevel("WARNING")
    try:
        return section(measure(workers_wanted()))
    finally:
        logger.setLevel(level)


if __name__ == "__main__":
    print(run())
