"""The table's index layout, kept by the reconciler: the online migration of a table an earlier release
wrote, and the upkeep that follows it (store/layout.py has the phases, store/migration.py the steps).

The lead shard runs `keep_layout` once per cycle, after the workers' own steps, within a budget of
items and of the invocation's time, so the migration never delays reconciling:

- migrating: once the bucket indexes answer, gate every pool, then walk the legacy listing of workers
  (`KIND#WORKER`) page by page from the marker's cursor, counting each worker not counted yet. A pass
  that changed nothing and was refused nothing proves every worker counted: the marker says `done`, and
  from then on every reader uses the bucket indexes and the counters.
- done: keep the pools' gates in step with the pools, and once the grace is over, walk the legacy
  listings again to remove the legacy attributes from workers and re-key instances, so that the legacy
  partitions empty; with nothing left this costs one empty query per listing and cycle, and repairs
  whatever a process of the earlier release still wrote (during a deploy, or after a rollback).

Progress is in the cycle's counters (`layout_*`) and in the `layout` stats scope of GET /api/v1/stats.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.models import utcnow
from fleetkeeper.observability import logger
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.services.context import Context
from fleetkeeper.store.layout import LEGACY_GRACE, LayoutPhase, LayoutState

STATS_SCOPE = "layout"
# Items one cycle looks at, and how many per page: the backfill's bound per cycle. At one cycle a
# minute, 100,000 workers are counted in under an hour (plus the pass that confirms it).
ITEMS_PER_CYCLE = 2_000
PAGE_ITEMS = 200
# The migration's writes are independent items: they run on this many threads.
PARALLELISM = 16
# Leave the invocation at least this much time after the last page.
RESERVE_SECONDS = 20.0


def keep_layout(ctx: Context, counters: Counter[str], *, time_left: Callable[[], float]) -> None:
    """One cycle's share of the migration or of the upkeep, within ITEMS_PER_CYCLE and the time left."""
    store = ctx.store
    read = store.layout_state()
    state = read.model_copy()
    now = utcnow()
    if state.started_at is None:
        state.started_at = now
    budget = _Budget(ITEMS_PER_CYCLE, time_left)
    if state.phase == LayoutPhase.MIGRATING:
        _migrate(ctx, state, counters, budget)
    else:
        _gate_pools(ctx, state, counters)
        if state.legacy_until is None or now >= state.legacy_until:
            _clean(ctx, state, counters, budget)
    if state != read:
        try:
            state = store.save_layout_state(read, state)
        except StaleWrite:
            # Another cycle (of another split, during a deploy) moved the marker: its progress stands;
            # what this one wrote to items is found again by the next pass.
            counters["layout_marker_contended"] += 1
            return
    _publish(ctx, state)


class _Budget:
    def __init__(self, items: int, time_left: Callable[[], float]) -> None:
        self.items = items
        self._time_left = time_left

    def more(self) -> bool:
        return self.items > 0 and self._time_left() > RESERVE_SECONDS


def _migrate(ctx: Context, state: LayoutState, counters: Counter[str], budget: _Budget) -> None:
    store = ctx.store
    if not state.indexes_ready:
        if not store.bucket_indexes_ready():
            # A deploy adds one index at a time (docs/deploy.md): until both answer, nothing moves.
            counters["layout_waiting_for_indexes"] += 1
            return
        state.indexes_ready = True
    if state.cursor is None and not state.pass_changed and not state.pass_refused:
        _gate_pools(ctx, state, counters)
    finished = _walk(ctx, state, "WORKER", counters, budget, legacy=True)
    if not finished:
        return
    clean = not state.pass_changed and not state.pass_refused
    if clean and not store.pools_without_gates(store.list_pools()):
        state.phase = LayoutPhase.DONE
        state.done_at = utcnow()
        state.legacy_until = state.done_at + LEGACY_GRACE
        counters["layout_done"] += 1
        logger.info("table layout migrated", workers_counted=state.workers_counted, passes=state.passes + 1)
    state.passes += 1
    state.pass_changed = state.pass_refused = 0


def _clean(ctx: Context, state: LayoutState, counters: Counter[str], budget: _Budget) -> None:
    """Empty the legacy listings: workers first, then instances, pass after pass."""
    while budget.more():
        kind = state.walking
        finished = _walk(ctx, state, kind, counters, budget, legacy=False)
        if not finished:
            return
        state.walking = "INSTANCE" if kind == "WORKER" else "WORKER"
        state.pass_changed = state.pass_refused = 0
        if kind == "INSTANCE":
            return


def _walk(
    ctx: Context, state: LayoutState, kind: str, counters: Counter[str], budget: _Budget, *, legacy: bool
) -> bool:
    """Pages of one legacy listing from the marker's cursor, each item brought to the bucket layout;
    True when the listing's end was reached (the cursor is then back at its start)."""
    store = ctx.store
    while budget.more():
        items, cursor = store.legacy_page(kind, state.cursor, min(PAGE_ITEMS, budget.items))
        budget.items -= max(len(items), 1)
        if kind == "WORKER":
            outcomes = _each(lambda entry: store.relayout_worker(entry, legacy=legacy), items)
        else:
            outcomes = _each(store.rekey_instance, items)
        changed, refused = outcomes["changed"], outcomes["refused"]
        state.pass_changed += changed
        state.pass_refused += refused
        if kind == "WORKER" and legacy:
            state.workers_counted += changed
            counters["layout_workers_counted"] += changed
        elif kind == "WORKER":
            state.workers_cleaned += changed
            counters["layout_workers_cleaned"] += changed
        else:
            state.instances_rekeyed += changed
            counters["layout_instances_rekeyed"] += changed
        counters["layout_refused"] += refused
        state.cursor = cursor
        if cursor is None:
            return True
    return False


def _each(step: Callable[[Any], str], items: list[Any]) -> Counter[str]:
    if not items:
        return Counter()
    with ContextThreadPool(max_workers=min(PARALLELISM, len(items))) as pool:
        return Counter(pool.map(step, items))


def _gate_pools(ctx: Context, state: LayoutState, counters: Counter[str]) -> None:
    store = ctx.store
    for pool in store.pools_without_gates(store.list_pools()):
        if store.gate_pool(pool):
            state.pools_gated += 1
            counters["layout_pools_gated"] += 1


def _publish(ctx: Context, state: LayoutState) -> None:
    """The migration's progress in GET /api/v1/stats (scope `layout`)."""
    timestamps = {"started_at": state.started_at} if state.started_at else {}
    if state.done_at is not None:
        timestamps["done_at"] = state.done_at
    ctx.stats.record(
        STATS_SCOPE,
        gauges={
            "done": int(state.phase == LayoutPhase.DONE),
            "passes": state.passes,
            "workers_counted": state.workers_counted,
            "pools_gated": state.pools_gated,
            "workers_cleaned": state.workers_cleaned,
            "instances_rekeyed": state.instances_rekeyed,
        },
        timestamps=timestamps or None,
    )
