"""Placing instances on workers."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from fleetkeeper.domain.errors import CapacityUnavailable, Conflict, InvalidInput, StaleWrite
from fleetkeeper.domain.lifecycle import PoolStatus
from fleetkeeper.domain.models import Instance, WorkerSummary, new_id
from fleetkeeper.domain.placement import PlacementStrategy, W, rank_candidates, refusal_reason
from fleetkeeper.store.repository import FleetStore

# How many candidates one request tries before giving up; each try is one transaction.
MAX_PLACEMENT_TRIES = 8


def place_instance(
    store: FleetStore,
    *,
    actor: str,
    template: str | None = None,
    pool: str | None = None,
    worker_id: str | None = None,
    strategy: PlacementStrategy = PlacementStrategy.PACK,
    timeslot_start: datetime | None = None,
    timeslot_end: datetime | None = None,
    instance_id: str | None = None,
) -> Instance:
    """Place a new instance on a worker that can take it, or raise why none can."""
    if timeslot_start and timeslot_end and timeslot_end <= timeslot_start:
        raise InvalidInput("timeslot_end", "must be after timeslot_start")
    instance = Instance(
        id=instance_id or new_id("i"),
        worker_id="",
        timeslot_start=timeslot_start,
        timeslot_end=timeslot_end,
    )
    if worker_id is not None:
        worker = store.get_worker(worker_id)
        # A worker_id picks the worker; a template or pool beside it is a claim about that worker, and a
        # claim that does not hold is the client's mistake, never silently overridden by the worker's.
        for field, asked, actual in (("template", template, worker.template), ("pool", pool, worker.pool)):
            if asked is not None and asked != actual:
                raise InvalidInput(field, f"worker {worker.id} has {field} {actual or 'none'}, not {asked}")
        pool_record = store.find_pool(worker.pool) if worker.pool else None
        reason = refusal_reason(worker, pool_record)
        if reason is not None:
            raise Conflict("worker", worker.id, worker.status, reason)
        return store.place_instance(instance, worker, actor=actor)

    if template is None and pool is None:
        raise InvalidInput("template", "give a template, a pool or a worker_id")
    if template is not None and store.find_template(template) is None:
        raise InvalidInput("template", f"unknown template '{template}'")
    if pool is not None:
        pool_record = store.find_pool(pool)
        if pool_record is None:
            raise InvalidInput("pool", f"unknown pool '{pool}'")
        if pool_record.status != PoolStatus.ACTIVE:
            raise CapacityUnavailable(f"pool {pool} is {pool_record.status} and accepts no instances")
    candidates = candidate_workers(store, template=template, pool=pool)
    scope = " and ".join(f"{k} {v}" for k, v in (("template", template), ("pool", pool)) if v)
    return place_on(store, instance, candidates, strategy=strategy, actor=actor, scope=scope)


def place_on(
    store: FleetStore,
    instance: Instance,
    candidates: Sequence[WorkerSummary],
    *,
    strategy: PlacementStrategy,
    actor: str,
    scope: str,
) -> Instance:
    """Place `instance` (new, or a booking waiting for capacity) on the first of the ranked, healthy
    `candidates` whose transaction takes it; CapacityUnavailable when none does. A booking that moved
    meanwhile (placed or ended) raises StaleWrite at once."""
    ranked = rank_candidates(candidates, strategy)
    tried = healthy_first(store, ranked, MAX_PLACEMENT_TRIES)
    if not tried:
        why = "no RUNNING worker" if not candidates else "every RUNNING worker is full or unhealthy"
        raise CapacityUnavailable(f"{why} for {scope}")
    last_refusal: Conflict | None = None
    for candidate in tried:
        try:
            return store.place_instance(instance, candidate, actor=actor)
        except StaleWrite:
            raise
        except Conflict as refusal:
            # A failed condition: this worker's last slot went to someone else, or it started draining.
            # Try the next one. A transaction conflict or throttling is not a refusal: the store retried
            # it and raises Unavailable (retryable) if it persists, rather than report "no capacity".
            last_refusal = refusal
    raise CapacityUnavailable(
        f"no worker accepted the instance after {len(tried)} tries"
        + (f"; last refusal: {last_refusal.message}" if last_refusal else "")
    )


def healthy_first(store: FleetStore, ranked: Sequence[W], limit: int) -> list[W]:
    """The first `limit` ranked candidates whose health does not say they are sick, their health read
    a chunk of `limit` at a time, as far down the ranking as it takes."""
    chosen: list[W] = []
    for start in range(0, len(ranked), limit):
        chunk = ranked[start : start + limit]
        sick = store.unhealthy_workers([w.id for w in chunk])
        chosen += [w for w in chunk if w.id not in sick]
        if len(chosen) >= limit:
            break
    return chosen[:limit]


def candidate_workers(store: FleetStore, *, template: str | None, pool: str | None) -> list[WorkerSummary]:
    """The RUNNING workers of the pool (and template, if given), or of the template anywhere.

    Read through indexes, which may lag and hold only a summary of each worker: a worker listed here
    may be full or draining by now. That is safe only because the placing (or moving) transaction
    re-checks status and capacity on the item.
    """
    return store.placement_candidates(template=template, pool=pool)
