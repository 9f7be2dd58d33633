"""What one rollout step reads: a `drain_first` rollout over a pool of 20, 80 and 1,000 RUNNING workers
(written straight to the table), `max_unavailable` 10, and the engine's first step after its start, the
one that begins wave 0 and asks the door for its 10 drains.

Figures: DynamoDB requests by operation, and the items the step reads from the table's indexes (each
Query's `ScannedCount`), against the goal of at most twice the pool's size. The drain executions are
started on moto's Step Functions with its execution of state machines off, so the drains' own work is
not in the figures (it is the drain bench's). `reads` is also what bench/rollout_cycle_bench.py and
bench/rollout_start_bench.py count with.
"""

from __future__ import annotations

import contextvars
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Final

from botocore import handlers

from bench.reconcile_bench import write_fleet
from bench.stack import bench_stack, use_table
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.rollouts import RolloutRequest, RolloutStrategy
from fleetkeeper.observability import logger
from fleetkeeper.services import catalog, rollouts
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.rollouts.engine import step
from fleetkeeper.services.rollouts.step import CLAIMS_PER_STEP
from fleetkeeper_local.controlplane import activate, provision, refresh_process_caches
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack

POOL_SIZES: Final = (20, 80, 1_000)
DRAINS: Final = 10
POOL: Final = "bench"
# What the earlier release's step made and read, measured the same way, at pool sizes 20 and 80.
EARLIER: Final = {20: (242, 350), 80: (242, 1_240)}

# Set inside `reads`: calls made on any other thread (an emulator's, a drain's) are not the measured ones.
_measured: contextvars.ContextVar[bool] = contextvars.ContextVar("bench_measured", default=False)


@dataclass
class Reads:
    """AWS calls by `<service>:<Operation>`, and DynamoDB's Queries and the items they read, by index
    (`table` for the base table's)."""

    calls: Counter[str] = field(default_factory=Counter)
    queries: Counter[str] = field(default_factory=Counter)
    items: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def index_queries(self) -> int:
        return sum(n for name, n in self.queries.items() if name != "table")

    @property
    def index_items(self) -> int:
        return sum(n for name, n in self.items.items() if name != "table")

    def service(self, name: str) -> int:
        return sum(n for call, n in self.calls.items() if call.startswith(f"{name}:"))

    def shown(self, service: str = "dynamodb") -> str:
        return ", ".join(
            f"{call.partition(':')[2]} {n}"
            for call, n in sorted(self.calls.items())
            if call.startswith(service)
        )

    def others(self) -> str:
        """The calls to services other than DynamoDB."""
        return ", ".join(
            f"{call} {n}" for call, n in sorted(self.calls.items()) if not call.startswith("dynamodb:")
        )


@contextmanager
def reads() -> Iterator[Reads]:
    """Count the calls this thread (and the pools it hands work to, which copy its context) makes through
    clients created inside the block, and the items each Query reads. The process's clients and default
    context are rebuilt on the way in and out: build the context inside."""
    seen = Reads()

    def before(event_name: str, **_: Any) -> None:
        if _measured.get():
            parts = event_name.split(".")
            with seen._lock:
                seen.calls[f"{parts[1]}:{parts[-1]}"] += 1

    def remember(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["bench_index"] = params.get("IndexName") or "table"

    def after(parsed: dict[str, Any], context: dict[str, Any], model: Any, **_: Any) -> None:
        if _measured.get() and model.name in ("Query", "Scan"):
            index = context.get("bench_index", "table")
            with seen._lock:
                seen.queries[index] += 1
                seen.items[index] += int(parsed.get("ScannedCount", 0))

    specs = [
        ("before-call", before),
        ("before-parameter-build.dynamodb", remember),
        ("after-call.dynamodb", after),
    ]
    handlers.BUILTIN_HANDLERS.extend(specs)
    refresh_process_caches()
    token = _measured.set(True)
    try:
        yield seen
    finally:
        _measured.reset(token)
        for spec in specs:
            handlers.BUILTIN_HANDLERS.remove(spec)
        refresh_process_caches()


@contextmanager
def quiet() -> Iterator[None]:
    """The logger at WARNING for the block: it is made at import, before bench_stack sets the level, and
    a line per worker moved would only slow what is timed."""
    level = logger.log_level
    logger.setLevel("WARNING")
    try:
        yield
    finally:
        logger.setLevel(level)


def workers_of(template: str, pool: str, count: int, *, first: int = 0) -> list[Worker]:
    """`count` RUNNING workers of the template in the pool, ids in order from `first`."""
    now = utcnow()
    return [
        Worker(
            id=f"w-{n:016x}",
            template=template,
            pool=pool,
            region=LOCAL_REGION,
            status=WorkerStatus.RUNNING,
            capacity=4,
            image_id="ami-bench",
            instance_type="m5.large",
            launched_at=now,
            version=3,
        )
        for n in range(first, first + count)
    ]


def bench_pool(ctx: Context, templates: list[str], budget: str) -> None:
    """The templates and pool `bench`, whose one budget for `rollout` allows `budget`."""
    for name in templates:
        catalog.put_template(
            ctx.store,
            WorkerTemplate(name=name, instance_type="m5.large", ami_name_filter="bench-*", capacity=4),
            actor="bench",
        )
    catalog.put_pool(
        ctx.store,
        POOL,
        actor="bench",
        disruption=DisruptionPolicy(budgets=[Budget(max=budget, reasons=[DisruptionReason.ROLLOUT])]),
    )


def drain_plane_without_executions(stack: LocalStack) -> None:
    """The drain state machine, the bus and the topic made the process's own; moto records the drain
    executions a step starts and runs none of them. (moto keeps the state machines of each mode apart:
    the mode is set first.)"""
    stack.configure_moto({"stepfunctions": {"execute_state_machine": False}, "lambda": {"use_docker": False}})
    activate(provision(stack, f"fk-bench-{uuid.uuid4().hex[:8]}"))


@dataclass
class Row:
    size: int
    reads: Reads
    seconds: float
    drained: int


def measure(stack: LocalStack, size: int) -> Row:
    use_table(stack, f"bench-step-{size}")
    ctx = default_context()
    bench_pool(ctx, ["bench"], "50%")
    write_fleet(ctx, workers_of("bench", POOL, size))
    request = RolloutRequest(
        template="bench", pool=POOL, max_unavailable=DRAINS, strategy=RolloutStrategy.DRAIN_FIRST
    )
    started = rollouts.start(ctx, request, actor="bench")
    with reads() as seen:
        ctx = default_context()
        begun = time.perf_counter()
        step(ctx, ctx.rollouts.get(started.id), utcnow())
        seconds = time.perf_counter() - begun
    wave = ctx.rollouts.wave_ids(started, 0)
    drained = sum(1 for w in ctx.store.get_workers(wave) if w.status == WorkerStatus.DRAINING)
    print(
        f"pool {size}: {seconds:.2f} s, {seen.service('dynamodb')} DynamoDB requests ({seen.shown()}), "
        f"{seen.index_items} index items, {drained} drains",
        flush=True,
    )
    return Row(size=size, reads=seen, seconds=seconds, drained=drained)


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def section(rows: list[Row]) -> str:
    lines = [
        "## One rollout step's reads",
        "",
        f"A `drain_first` rollout of every RUNNING worker of pool `{POOL}` (one template), `max_unavailable`",
        f"{DRAINS}, and the engine's first step after its start: it begins wave 0 and asks the door for its",
        f"{DRAINS} drains (a pool budget of 50% for `rollout` admits them all). Index items are each Query's",
        "`ScannedCount` on an index; the base table's Queries (the fleet's counters, read once per door) are",
        "counted apart. Drain executions are started on moto with its execution of state machines off.",
        "",
        "| pool size | DynamoDB requests | by operation | index Queries | index items (goal <= 2 x pool) "
        "| base-table Query items | other calls | drains started | wall s |",
        "|---:|---:|---|---:|---:|---:|---|---:|---:|",
    ]
    for row in rows:
        r = row.reads
        lines.append(
            f"| {row.size:,} | {r.service('dynamodb')} | {r.shown()} | {r.index_queries} "
            f"| {r.index_items:,} | {r.items['table']:,} | {r.others()} | {row.drained} | {row.seconds:.2f} |"
        )
    lines += ["", "| goal | figure | result |", "|---|---|---|"]
    for row in rows:
        lines.append(
            f"| pool {row.size:,}: index items within 2 x the pool ({2 * row.size:,}) "
            f"| {row.reads.index_items:,} | {_met(row.reads.index_items <= 2 * row.size)} |"
        )
        lines.append(
            f"| pool {row.size:,}: the step starts its {DRAINS} drains | {row.drained} "
            f"| {_met(row.drained == DRAINS)} |"
        )
    earlier = ", ".join(
        f"{queries} Queries and {items:,} index items at {size}" for size, (queries, items) in EARLIER.items()
    )
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [
        "",
        f"The earlier release's step, which read the pool's view from its indexes: {earlier}. Now the step",
        "reads no index: the door reads each pool's counts (`DISRUPTING#<pool>` and the fleet's, one",
        "BatchGetItem) and the fleet's counters (a Query of each of the 8 counter partitions of the base",
        "table) once, and each worker it decides on by key (GetItem). Up to 80 workers the start has",
        "claimed the whole scope, so the step's requests do not grow with the pool; at 1,000 the step also",
        f"claims the next {CLAIMS_PER_STEP} workers (a GetItem and a conditional write each), the only part",
        "that grows, and it is bounded per step whatever the pool. Wall times follow the shared machine's",
        f"load (1, 5 and 15 minute averages at the end of the run: {load}); the counts do not.",
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    rows: list[Row] = []
    with quiet(), bench_stack() as stack:
        drain_plane_without_executions(stack)
        for size in POOL_SIZES:
            rows.append(measure(stack, size))
    return section(rows)


if __name__ == "__main__":
    print(run())
