"""The reconcile cycle's repairs: the due ones proposed to the door, surge-first as expiry's
(services/reconcile/replacement.py), a pool's brake judged over all its members, whichever shard
holds them, from the exact counts (docs/repair.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Final

from aws_lambda_powertools.metrics import MetricUnit

from fleetkeeper.domain.admission import Held, WaitReason
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.models import Worker
from fleetkeeper.domain.repair import (
    Brake,
    Health,
    HealthSource,
    RepairPlan,
    RepairPolicy,
    brake,
    plan_repair,
    repair_due,
)
from fleetkeeper.domain.scale_down import protected_from_disruption
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services import admission
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile import replacement
from fleetkeeper.services.repair import ask_for, repairing

PURPOSE: Final = "repair"
# A worker in no pool has no share of a pool to be held by.
NO_BRAKE: Final = Brake(unhealthy=0, members=0, max_percent=0)
# Repairs one cycle (one shard) starts or advances at most, scheduled events first by their date.
MAX_REPAIRS_PER_CYCLE: Final = 10
# Pools whose brake held a repair this cycle; the RepairBlocked alarm watches it.
METRIC_REPAIR_BLOCKED: Final = "RepairBlocked"


def _candidates(
    workers: Iterable[Worker], policies: Callable[[str | None], RepairPolicy], now: datetime
) -> list[tuple[Worker, Health]]:
    """The workers a repair is due for with their health, scheduled events first by their date, then
    the longest sick."""
    due = [
        (w, w.health)
        for w in workers
        if w.health is not None and replacement.may_replace(w) and repair_due(w.health, policies(w.pool), now)
    ]

    def order(pair: tuple[Worker, Health]) -> tuple[int, datetime, str]:
        worker, health = pair
        event = health.event
        if health.scheduled and event is not None and event.not_before is not None:
            return 0, event.not_before, worker.id
        return 1, health.since, worker.id

    return sorted(due, key=order)


def repair_workers(
    ctx: Context,
    workers: Sequence[Worker],
    now: datetime,
    counters: Counter[str],
    *,
    time_left: Callable[[], float],
    margin_seconds: float,
) -> dict[str, str]:
    """Propose the cycle's due repairs to the door, each isolated, at most MAX_REPAIRS_PER_CYCLE of
    those the brake lets through; the brake is judged per pool over all its members. Returns the pools
    whose brake held a repair, with the brake's words."""
    pools: dict[str | None, RepairPolicy] = {}
    templates: dict[str, int] = {}

    def policy(name: str | None) -> RepairPolicy:
        if name not in pools:
            found = ctx.store.find_pool(name) if name else None
            pools[name] = found.repair if found is not None else RepairPolicy()
        return pools[name]

    def drain_timeout(name: str) -> int:
        if name not in templates:
            found = ctx.store.find_template(name)
            templates[name] = found.drain_timeout_seconds if found is not None else 4 * 3600
        return templates[name]

    candidates = _candidates(workers, policy, now)
    # The brake over each pool with a due repair, from the exact counts of the whole fleet, read once
    # and strongly consistent: a shard's share of a pool is no measure of it, nor is a lagging index.
    due_pools = sorted({w.pool for w, _ in candidates if w.pool is not None})
    for pool in due_pools:
        _count_health(ctx, pool, counters)
    counts = ctx.store.health_counts(due_pools) if due_pools else FleetCounts()
    brakes = {pool: brake(*counts.in_pool(pool), policy(pool)) for pool in due_pools}
    blocked: dict[str | None, str] = {}
    started = 0
    with admission.door(ctx, now) as door:
        for worker, health in candidates:
            held = brakes.get(worker.pool or "", NO_BRAKE)
            plan = plan_repair(health, held, drain_timeout(worker.template), now)
            ask = ask_for(plan)
            # Before the cap: a braked pool's repairs take none of the cycle's places.
            if plan.braked:
                blocked[worker.pool] = held.detail
                counters[f"repair_held_{WaitReason.REPAIR_BRAKE}"] += 1
                door.record_held(worker, ask, Held(WaitReason.REPAIR_BRAKE, held.detail), "drain")
                if repairing(worker):
                    door.release(worker.id, ask)  # an admission made before the brake held
                continue
            if started >= MAX_REPAIRS_PER_CYCLE or time_left() < margin_seconds:
                counters["repair_deferred"] += 1
                continue
            started += 1
            if plan.imposed:
                counters["repair_imposed"] += 1
            try:
                replacement.replace(
                    ctx,
                    door,
                    worker.id,
                    replacement.Replacement(
                        ask=ask,
                        purpose=PURPOSE,
                        counted_as=PURPOSE,
                        reason=_drain_reason(worker, health, plan, now),
                        timeout_seconds=plan.timeout_seconds,
                        wait_running=True,
                        start_by=plan.start_by,
                        expect=_still_sick(health),
                        episode_since=health.sick_since,
                    ),
                    counters,
                    now=now,
                )
            except Exception:  # one worker's repair, never the cycle
                logger.exception("repairing a worker failed", worker_id=worker.id)
                counters["repair_errors"] += 1
    counters["repair_blocked_pools"] += len(blocked)
    metrics.add_metric(name=METRIC_REPAIR_BLOCKED, unit=MetricUnit.Count, value=len(blocked))
    return {pool: detail for pool, detail in blocked.items() if pool is not None}


def _count_health(ctx: Context, pool: str, counters: Counter[str]) -> None:
    """Before the brake first reads a pool's counters, count the workers that fell sick before cells
    said health among its unhealthy (store/workers.count_health); once per pool, one read after."""
    moved = ctx.store.count_health(pool)
    if moved is None:
        counters["repair_health_recount_deferred"] += 1
    elif moved:
        counters["repair_health_recounted"] += moved


def _still_sick(decided: Health) -> admission.Expect:
    """The repair's check on the worker its admitting and draining writes read: the signal it was
    decided on still counts (same source, same `since`); a report withdrawn or an event closed since
    the cycle read the worker stops it before the write."""

    def check(worker: Worker) -> str | None:
        health = worker.health
        if (
            health is not None
            and health.unhealthy
            and (health.source, health.since)
            == (
                decided.source,
                decided.since,
            )
        ):
            return None
        return "its health changed since the repair was decided"

    return check


def _drain_reason(worker: Worker, health: Health, plan: RepairPlan, now: datetime) -> str:
    """What the drain's audit says: the signal, and for a scheduled event whether its date forced it."""
    event = health.event
    if health.scheduled and event is not None:
        when = event.not_before.isoformat() if event.not_before is not None else "an unknown date"
        text = f"repair: EC2 scheduled event {event.code} not before {when}"
        if plan.imposed:
            text += ", imposed: its date forced it"
            if protected_from_disruption(worker, now):
                text += "; do_not_disrupt overridden"
        return text[:500]
    source = {
        HealthSource.STATUS_CHECK: "failed status check",
        HealthSource.UNREACHABLE: "machine not answering",
        HealthSource.CONNECTION_LOST: "SSM agent not answering",
        HealthSource.REPORTED: "reported unhealthy",
    }.get(health.source, str(health.source))
    return f"repair: {source}: {health.reason or '-'}"[:500]
