"""The steady reconcile cycle as the fleet grows, the largest fleet one cycle serves, and the shards past it.

Steady fleet: every worker RUNNING on a running (emulated) instance, nothing to change, built as in
bench/reconcile_bench.py. Each figure is the median of REPEATS cycles after one warm-up cycle.

- Scaling curve: one cycle over the whole fleet at 1,000, 10,000 and 30,000 workers, with where its time
  goes (the status read: the index, the workers by key and the counters; the EC2 read, the metrics
  read, the rest: planning, the drain sweep and the stats write). A straight line through the points
  gives the largest fleet one cycle serves within HEADROOM of the schedule period.
- Shards: fleets of SHARD_STEP, 2 x SHARD_STEP and 3 x SHARD_STEP workers with 1, 2 and 3 shards. On
  AWS each shard is its own Lambda invocation; here each shard's cycle runs alone, so the wall time is
  what one invocation sees, not the emulators' share of this 2-core machine among parallel shards. The
  goal: the slowest shard at 3 x SHARD_STEP within FLAT_GOAL of the single cycle at SHARD_STEP. Every
  worker must be handled by exactly one shard (the shards' worker counts add up to the fleet, and each
  is the number of ids its bucket range owns).

moto's tag filter, instance-id filter and launches scan every instance of the region per call; the
benchmark swaps them for dict and set lookups (same answers, `fleet_stack` in bench/reconcile_bench.py)
so that the wall times show fleetkeeper's cost, not the emulator's.

Run: `make bench` or `python -m bench reconcile_scale`.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any
from unittest.mock import patch

from bench.reconcile_bench import build_fleet, fleet_stack, steady, warmed_up
from fleetkeeper.domain.sharding import Shard, shard_of
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile import cycle, reconcile_fleet
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.stack import LocalStack

SIZES = (1_000, 10_000, 30_000)
SHARD_STEP = 10_000
SHARD_COUNTS = (1, 2, 3)
REPEATS = 3
PERIOD_SECONDS = 60  # the reconcile schedule's default rate
# A cycle should end within this share of its period: room for a slow EC2 page, a burst of launches.
HEADROOM = 0.5
FLAT_GOAL = 1.25
PHASES = ("status read", "EC2 read", "metrics read")


class PhaseClock:
    """Seconds spent in the cycle's batched reads, timed by wrapping the functions the cycle calls."""

    def __init__(self) -> None:
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def _timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started

        return wrapper

    @contextmanager
    def attached(self) -> Iterator[None]:
        with (
            patch.object(cycle, "_observe", self._timed("EC2 read", cycle._observe)),
            patch.object(cycle, "_collect_metrics", self._timed("metrics read", cycle._collect_metrics)),
            patch.object(FleetStore, "reconcile_read", self._timed("status read", FleetStore.reconcile_read)),
        ):
            yield

    def take(self) -> defaultdict[str, float]:
        taken, self.seconds = self.seconds, defaultdict(float)
        return taken


def timed_cycles(ctx: Context, shard: Shard, clock: PhaseClock) -> dict[str, Any]:
    """Median wall time (and phases) of REPEATS cycles of one shard, after a warm-up cycle, on a stage
    configured for that shard's split."""
    ctx = warmed_up(ctx, shard)
    walls: list[float] = []
    phases: list[defaultdict[str, float]] = []
    workers = 0
    for _ in range(REPEATS):
        clock.take()
        started = time.perf_counter()
        with clock.attached():
            report = reconcile_fleet(ctx, shard=shard)
        walls.append(time.perf_counter() - started)
        steady(report)
        phases.append(clock.take())
        workers = report.workers
    middle = sorted(range(REPEATS), key=lambda n: walls[n])[REPEATS // 2]
    return {"seconds": statistics.median(walls), "phases": phases[middle], "workers": workers}


def measure(stack: LocalStack, clock: PhaseClock) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The curve's single cycles and the shard runs, building each fleet size once."""
    curve: list[dict[str, Any]] = []
    shards: list[dict[str, Any]] = []
    sizes = sorted(set(SIZES) | {SHARD_STEP * count for count in SHARD_COUNTS})
    for size in sizes:
        ctx, fleet = build_fleet(stack, size)
        whole = None
        if size in SIZES:
            whole = timed_cycles(ctx, Shard(), clock)
            curve.append({"size": size, **whole})
            print(f"reconcile {size:>6} workers, one cycle: {whole['seconds']:.2f} s {dict(whole['phases'])}")
        count, remainder = divmod(size, SHARD_STEP)
        if remainder or count not in SHARD_COUNTS:
            continue
        owned = Counter(shard_of(worker.id, count) for worker in fleet)
        runs = (
            [whole]
            if count == 1 and whole
            else [timed_cycles(ctx, Shard(i, count), clock) for i in range(count)]
        )
        handled = [run["workers"] for run in runs]
        row = {
            "size": size,
            "shards": count,
            "per_shard": [run["seconds"] for run in runs],
            "handled": handled,
            "exact": handled == [owned[index] for index in range(count)] and sum(handled) == size,
        }
        shards.append(row)
        print(f"reconcile {size:>6} workers, {count} shards: {row}", flush=True)
    return curve, shards


def fit(rows: list[dict[str, Any]]) -> tuple[float, float]:
    """Least squares seconds = fixed + per_worker * size."""
    xs = [float(r["size"]) for r in rows]
    ys = [float(r["seconds"]) for r in rows]
    if len(set(xs)) < 2:
        return 0.0, ys[0] / xs[0]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mean_x) ** 2 for x in xs
    )
    return mean_y - slope * mean_x, slope


def section(curve: list[dict[str, Any]], shards: list[dict[str, Any]]) -> str:
    fixed, per_worker = fit(curve)
    budget = PERIOD_SECONDS * HEADROOM
    largest = int((budget - fixed) / per_worker) if per_worker > 0 else 0
    largest_rounded = largest // 1_000 * 1_000
    base = shards[0]["per_shard"][0]
    slowest = max(shards[-1]["per_shard"])
    flat = slowest / base
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    lines = [
        "## Reconcile scaling and shards (bench/reconcile_scale_bench.py)",
        "",
        f"Steady fleet (every worker RUNNING, nothing to change); median of {REPEATS} cycles after a",
        f"warm-up; {machine}, {when}. Phases: the status read (the shard's buckets of the status index, its",
        "workers by key, the counters), the EC2 and CloudWatch batched reads; the rest is planning, the",
        "drain sweep and the stats write.",
        "",
        "### One cycle as the fleet grows",
        "",
        "| workers | cycle | status read | EC2 read | metrics read | rest | per 1,000 workers |",
        "|--------:|------:|------------------:|---------:|-------------:|-----:|------------------:|",
    ]
    for row in curve:
        phases = row["phases"]
        rest = max(0.0, row["seconds"] - phases["EC2 read"] - phases["metrics read"])
        lines.append(
            f"| {row['size']:,} | {row['seconds']:.2f} s | {phases['status read']:.2f} s | "
            f"{phases['EC2 read']:.2f} s | {phases['metrics read']:.2f} s | {rest:.2f} s | "
            f"{row['seconds'] / row['size'] * 1000:.2f} s |"
        )
    met = "met" if largest >= SIZES[1] else "not met"
    lines += [
        "",
        f"Fit: {fixed:.2f} s + {per_worker * 1000:.3f} s per 1,000 workers. Goal: one cycle serves at least "
        f"{SIZES[1]:,} workers within {HEADROOM:.0%} of the {PERIOD_SECONDS} s period ({budget:.0f} s): "
        f"**{met}**, largest fleet for one cycle on this machine about **{largest_rounded:,} workers**. "
        "The status read is not where the time goes; the emulators' EC2 answer and the per-worker "
        "planning are, and both are faster on AWS, so this bound is conservative. Past it, set "
        "`schedules.reconcile_shards` to ceil(fleet / that size) (docs/operations.md, "
        '"Sharding the reconciler").',
        "",
        "### Shards: wall time per shard as the fleet grows",
        "",
        "| workers | shards | wall time per shard (each alone, as its own invocation) | workers per shard "
        "| every worker once |",
        "|--------:|-------:|------------------------------------|------------------|---------|",
    ]
    for row in shards:
        per_shard = ", ".join(f"{s:.2f} s" for s in row["per_shard"])
        handled = ", ".join(f"{h:,}" for h in row["handled"])
        once = "yes" if row["exact"] else "NO"
        lines.append(f"| {row['size']:,} | {row['shards']} | {per_shard} | {handled} | {once} |")
    flat_met = "met" if flat <= FLAT_GOAL else "not met"
    lines += [
        "",
        f"Goal: the slowest shard at {SHARD_STEP * SHARD_COUNTS[-1]:,} workers / {SHARD_COUNTS[-1]} shards "
        f"within {FLAT_GOAL}x the single cycle at {SHARD_STEP:,}: {slowest:.2f} s / {base:.2f} s = "
        f"**{flat:.2f}x, {flat_met}**. Each shard reads only its own buckets of the status index and the "
        "fleet-wide counts from the counters, so its reads, the EC2 and metrics reads and the per-worker "
        "work all split with the buckets (100,000 workers on 10 shards: section of bench/shards_bench.py).",
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    with fleet_stack() as stack:
        clock = PhaseClock()
        curve, shards = measure(stack, clock)
    return section(curve, shards)


if __name__ == "__main__":
    print(run())
