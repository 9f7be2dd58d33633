"""100,000 workers on 10 shards, against the 10,000-worker single cycle of the same run.

Steady fleets as in bench/reconcile_bench.py (every worker RUNNING on a running emulated instance,
nothing to change), written in the bucket layout with their counters. Each figure is the median of
REPEATS cycles after one warm-up cycle; each shard's cycles run alone, as its own invocation would on
AWS, so the wall time is what one invocation sees, not the emulators' share of this 2-core machine.

- Time: the slowest shard's cycle at FLEET / SHARDS against the single cycle at SINGLE workers.
  Goal: at most TIME_GOAL times.
- Read units: every DynamoDB read of a cycle (the status index, the workers by key, the counters, the
  lease and stats items), counted from DynamoDB Local's ConsumedCapacity (asked for on every read, in
  a botocore hook). Goal: each shard within READ_GOAL times (FLEET / SHARDS) / SINGLE times the single
  cycle's units.

moto's tag and instance-id filters and its launches scan every instance of the region per call; the
benchmark swaps them for dict and set lookups (same answers, `fleet_stack` in bench/reconcile_bench.py)
so that the wall times show fleetkeeper's cost, not the emulator's, and building the fleet is linear.

Run: `python -m bench shards` (most of it building the fleet: see the build rate in the section).
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

from bench.reconcile_bench import build_fleet, fleet_stack, steady, warmed_up
from fleetkeeper.domain.sharding import Shard, shard_of
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper_local.stack import LocalStack

SINGLE = int(os.environ.get("FLEETKEEPER_BENCH_SHARD_SINGLE", "10000"))
FLEET = int(os.environ.get("FLEETKEEPER_BENCH_SHARD_FLEET", "100000"))
SHARDS = 10
REPEATS = 3
GOAL_SHAPE = (100_000, 10_000)  # the goal's fleet and single cycle, in workers
TIME_GOAL = 1.15
READ_GOAL = 1.1
_READS = frozenset({"GetItem", "BatchGetItem", "Query", "TransactGetItems", "Scan"})


class ReadUnits:
    """DynamoDB read capacity consumed through one client, from the ConsumedCapacity of every read."""

    def __init__(self, dynamodb: Any) -> None:
        self.client = dynamodb
        self.units = 0.0
        self.calls: Counter[str] = Counter()
        events = dynamodb.meta.events
        # One client can outlive a fleet (clients are cached per process): each counter its own ids.
        events.register(
            "before-parameter-build.dynamodb.*", self._ask, unique_id=f"bench-read-ask-{id(self)}"
        )
        events.register("after-call.dynamodb.*", self._count, unique_id=f"bench-read-count-{id(self)}")

    @staticmethod
    def _ask(params: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name in _READS:
            params.setdefault("ReturnConsumedCapacity", "TOTAL")

    def _count(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        if model.name not in _READS:
            return
        consumed = parsed.get("ConsumedCapacity")
        entries = consumed if isinstance(consumed, list) else [consumed] if consumed else []
        self.units += sum(float(e.get("CapacityUnits", 0.0)) for e in entries)
        self.calls[model.name] += 1

    def take(self) -> tuple[float, Counter[str]]:
        taken = (self.units, self.calls)
        self.units, self.calls = 0.0, Counter()
        return taken


def timed_cycles(ctx: Context, shard: Shard, reads: ReadUnits) -> dict[str, Any]:
    """Median wall time, read units and status read of REPEATS cycles of one shard, after a warm-up."""
    ctx = warmed_up(ctx, shard)
    runs: list[dict[str, Any]] = []
    original = ctx.store.reconcile_read
    spent = {"read": 0.0}

    def timed_read(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent["read"] += time.perf_counter() - started

    ctx.store.reconcile_read = timed_read  # type: ignore[method-assign]
    try:
        for _ in range(REPEATS):
            spent["read"] = 0.0
            reads.take()
            started = time.perf_counter()
            report = reconcile_fleet(ctx, shard=shard)
            wall = time.perf_counter() - started
            units, calls = reads.take()
            steady(report)
            runs.append(
                {
                    "seconds": wall,
                    "units": units,
                    "calls": calls,
                    "read": spent["read"],
                    "workers": report.workers,
                }
            )
    finally:
        ctx.store.reconcile_read = original  # type: ignore[method-assign]
    middle = sorted(runs, key=lambda r: r["seconds"])[REPEATS // 2]
    return {**middle, "units": statistics.median(r["units"] for r in runs)}


def measure(stack: LocalStack) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any]]:
    load_before = os.getloadavg()
    ctx, _ = build_fleet(stack, SINGLE)
    reads = ReadUnits(ctx.store._client)
    single = timed_cycles(ctx, Shard(), reads)
    print(f"single cycle, {SINGLE:,} workers: {single}", flush=True)
    built = time.perf_counter()
    ctx, fleet = build_fleet(stack, FLEET)
    build_seconds = time.perf_counter() - built
    print(f"built {FLEET:,} workers in {build_seconds:.0f} s", flush=True)
    owned = Counter(shard_of(worker.id, SHARDS) for worker in fleet)
    if ctx.store._client is not reads.client:
        reads = ReadUnits(ctx.store._client)
    shards: list[dict[str, Any]] = []
    for index in range(SHARDS):
        run = timed_cycles(ctx, Shard(index, SHARDS), reads)
        run["owned"] = owned[index]
        shards.append(run)
        print(f"shard {index + 1}/{SHARDS} of {FLEET:,}: {run}", flush=True)
    return single, shards, {"build_seconds": build_seconds, "load": (load_before, os.getloadavg())}


def section(single: dict[str, Any], shards: list[dict[str, Any]], extra: dict[str, Any]) -> str:
    slowest = max(run["seconds"] for run in shards)
    time_ratio = slowest / single["seconds"]
    share = (FLEET / SHARDS) / SINGLE
    read_ratios = [run["units"] / (share * single["units"]) for run in shards]
    exact = [run["workers"] for run in shards] == [run["owned"] for run in shards] and sum(
        run["workers"] for run in shards
    ) == FLEET
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    start, end = (" / ".join(f"{value:.1f}" for value in load) for load in extra["load"])
    build_rate = FLEET / (extra["build_seconds"] / 60)
    time_met = "met" if time_ratio <= TIME_GOAL else "not met"
    read_met = "met" if max(read_ratios) <= READ_GOAL else "not met"
    lines = [
        f"## {FLEET:,} workers on {SHARDS} shards (bench/shards_bench.py)",
        "",
        f"Steady fleets (every worker RUNNING, nothing to change) in the bucket layout; median of {REPEATS}",
        f"cycles after a warm-up, each shard alone as its own invocation; {machine}, {when}; load average",
        f"(1 / 5 / 15 min) {start} at the start of the run, {end} at its end. Read units: every DynamoDB",
        "read of one cycle,",
        "from DynamoDB Local's ConsumedCapacity. Status read: the shard's bucket range of the status index,",
        "then its workers by key (BatchGetItem), then the counters.",
        "",
        "| cycle | workers | wall time | status read | read units | reads (Query / BatchGetItem / GetItem) |",
        "|---|--:|--:|--:|--:|---|",
    ]

    def row(name: str, run: dict[str, Any]) -> str:
        calls = run["calls"]
        return (
            f"| {name} | {run['workers']:,} | {run['seconds']:.2f} s | {run['read']:.2f} s | "
            f"{run['units']:,.1f} | {calls['Query']} / {calls['BatchGetItem']} / {calls['GetItem']} |"
        )

    lines.append(row(f"single, {SINGLE:,} workers", single))
    for index, run in enumerate(shards):
        lines.append(row(f"shard {index + 1} of {SHARDS}, {FLEET:,} workers", run))
    lines += [
        "",
        f"- Every worker handled by exactly one shard (each shard's count is the number of ids its bucket "
        f"range owns, and they add up to {FLEET:,}): **{'yes' if exact else 'NO'}**.",
        f"- Time: the slowest shard {slowest:.2f} s against the single cycle's {single['seconds']:.2f} s = "
        f"**{time_ratio:.2f}x**; goal at most {TIME_GOAL}x: **{time_met}**.",
        f"- Read units: each shard against ({FLEET:,} / {SHARDS}) / {SINGLE:,} x {single['units']:,.1f} = "
        f"{share * single['units']:,.1f}: from {min(read_ratios):.2f}x to **{max(read_ratios):.2f}x**; goal "
        f"within {READ_GOAL}x: **{read_met}**.",
        f"- Building the {FLEET:,}-worker fleet (emulated instances and items) took "
        f"{extra['build_seconds'] / 60:.0f} min, {build_rate:,.0f} workers a minute.",
    ]
    if (FLEET, SINGLE) != GOAL_SHAPE:
        lines.append(
            f"- Scale: this run is the goal's shape at {FLEET / GOAL_SHAPE[0]:.0%} of its size ({FLEET:,} "
            f"workers on {SHARDS} shards against the single cycle at {SINGLE:,}, set by "
            "`FLEETKEEPER_BENCH_SHARD_FLEET` and `FLEETKEEPER_BENCH_SHARD_SINGLE`), not the goal's own "
            f"{GOAL_SHAPE[0]:,} against {GOAL_SHAPE[1]:,}: the goal is not measured by this run."
        )
    lines += [
        "",
        "A shard reads its own bucket range of each status (one Query per write shard the range touches, "
        "docs/data-model.md), its workers by key, and the counters (one Query per counter partition), so "
        "its reads and its time follow its own share, not the fleet: before the bucket layout every shard "
        'read the whole status index, which grew with the fleet (section "Reconcile scaling and shards").',
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    with fleet_stack() as stack:
        single, shards, extra = measure(stack)
    return section(single, shards, extra)


if __name__ == "__main__":
    print(run())
