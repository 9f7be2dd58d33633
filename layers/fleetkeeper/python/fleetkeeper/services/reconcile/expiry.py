"""Replacing expired workers: a RUNNING worker older than its template's `max_lifetime_hours` gets a new
worker of the same template, pool and region, and is drained with `then=terminate` (docs/rollouts.md).

Each replacement is a voluntary disruption of reason `expired`, admitted through the pool's disruption
budgets (services/disruption.py `admit`) before anything is written; a refused one waits for a later
cycle. The new worker's id is derived from the expired worker's, so an attempt repeated after a crash
or a refused drain finds the replacement it already made (Conflict) instead of making a second: each
expired worker has at most one live replacement, whatever happens between the two writes. A replacement
that has ended meanwhile (its launch failed, it was terminated) does not count: the next id of the
sequence is tried, at most MAX_REPLACEMENT_ATTEMPTS of them, and the worker is never drained without a
live one. A worker an active rollout covers is left to that rollout.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Final

from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainThen, Drift, DriftReason, Worker
from fleetkeeper.domain.scale_down import protected_from_disruption
from fleetkeeper.observability import logger
from fleetkeeper.services import disruption, drain_hooks, workers
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.actions import ACTOR, Work

# Expired workers one cycle (one shard) replaces at most; the others wait for the next cycle, oldest
# first. Each costs a read of its pool for the admission, a worker and a drain.
MAX_REPLACEMENTS_PER_CYCLE: Final = 10
EXPIRED_REASON: Final = "expired: older than its template's max_lifetime_hours"
# Replacements of one expired worker that may end before it is drained; then it waits for an operator.
MAX_REPLACEMENT_ATTEMPTS: Final = 3
# A replacement in one of these can no longer take the expired worker's place.
_ENDED: Final = frozenset({WorkerStatus.FAILED, WorkerStatus.TERMINATING, WorkerStatus.TERMINATED})


def replacement_id(worker_id: str, attempt: int = 0) -> str:
    """The id of the worker that replaces `worker_id` on its `attempt`-th try: the same on every cycle."""
    key = f"{worker_id}#expired" if attempt == 0 else f"{worker_id}#expired#{attempt}"
    return "w-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _planned_drift(item: Work) -> Drift | None:
    planned = item.step.changes.get("drift", item.worker.drift)
    return planned if isinstance(planned, Drift) else None


def expired_workers(work: Sequence[Work], now: datetime) -> list[Worker]:
    """The RUNNING workers of the cycle found expired, oldest drift first, that may be disrupted."""
    found: list[tuple[datetime, Worker]] = []
    for item in work:
        worker, drift = item.worker, _planned_drift(item)
        if (
            item.error is None
            and item.step.target is None
            and drift is not None
            and DriftReason.EXPIRED in drift.reasons
            and _may_replace(worker, now)
        ):
            found.append((drift.since, worker))
    return [worker for _, worker in sorted(found, key=lambda pair: (pair[0], pair[1].id))]


def _may_replace(worker: Worker, now: datetime) -> bool:
    """RUNNING, no drain running, no other status asked for, and not protected from disruption."""
    return (
        worker.status == WorkerStatus.RUNNING
        and (worker.drain is None or worker.drain.outcome != DrainOutcome.RUNNING)
        and worker.desired_status in {None, WorkerStatus.RUNNING}
        and not protected_from_disruption(worker, now)
    )


def replace_expired(
    ctx: Context,
    work: Sequence[Work],
    now: datetime,
    counters: Counter[str],
    *,
    time_left: Callable[[], float],
    margin_seconds: float,
) -> None:
    """Admit, replace and drain (then terminate) the cycle's expired workers, each isolated."""
    expired = expired_workers(work, now)
    if len(expired) > MAX_REPLACEMENTS_PER_CYCLE:
        counters["expiry_deferred"] += len(expired) - MAX_REPLACEMENTS_PER_CYCLE
    for worker in expired[:MAX_REPLACEMENTS_PER_CYCLE]:
        if time_left() < margin_seconds:
            counters["expiry_deferred"] += 1
            continue
        try:
            _replace(ctx, worker, now, counters)
        except Exception:  # one worker's replacement, never the cycle
            logger.exception("replacing an expired worker failed", worker_id=worker.id)
            counters["expiry_errors"] += 1


def _replace(ctx: Context, seen: Worker, now: datetime, counters: Counter[str]) -> None:
    # The cycle read the worker before its steps ran: an operator may have protected it, drained it or
    # asked for another status since. Read afresh, so nothing is made or drained against that.
    worker = ctx.store.get_worker(seen.id)
    if not _may_replace(worker, now):
        counters["expiry_changed"] += 1
        return
    if _in_active_rollout(ctx, worker.id):
        # The rollout replaces it: a second replacement here would be one too many.
        counters["expiry_in_rollout"] += 1
        return
    if worker.pool is not None:
        pool = ctx.store.find_pool(worker.pool)
        if pool is not None and pool.status != PoolStatus.ACTIVE:
            # A pool being drained or put out of service takes no new worker; its drain ends this one.
            counters["expiry_pool_inactive"] += 1
            return
    refusal = disruption.admit(ctx, worker.id, DisruptionReason.EXPIRED, now=now)
    if refusal is not None:
        counters["expiry_waiting"] += 1
        logger.info("expired worker waits for its budget", worker_id=worker.id, guard=str(refusal.guard))
        return
    if not _ensure_replacement(ctx, worker, counters):
        counters["expiry_replacement_failed"] += 1
        logger.error("every replacement of an expired worker ended; it is not drained", worker_id=worker.id)
        return
    started = drain_hooks.start_drain(
        ctx, worker.id, actor=ACTOR, reason=EXPIRED_REASON, then=DrainThen.TERMINATE
    )
    counters["expiry_drains" if started else "expiry_drain_refused"] += 1


def _in_active_rollout(ctx: Context, worker_id: str) -> bool:
    """Whether a RUNNING, PAUSED or ROLLING_BACK rollout covers the worker, or one is taking its lock
    right now, read from its lock item (the base table): the same rule that keeps two rollouts off one
    worker."""
    return ctx.rollouts.covers(worker_id)


def _ensure_replacement(ctx: Context, worker: Worker, counters: Counter[str]) -> bool:
    """Make the worker's replacement, or find the live one an earlier attempt made; False when every
    attempt's replacement has ended."""
    for attempt in range(MAX_REPLACEMENT_ATTEMPTS):
        new_id = replacement_id(worker.id, attempt)
        try:
            workers.create_worker(
                ctx.store,
                template=worker.template,
                region=worker.region,
                pool=worker.pool,
                actor=ACTOR,
                worker_id=new_id,
                # A worker a rollback pinned to an older launch keeps that launch: its expiry must not
                # bring back the image the rollback took out.
                pinned_image_id=worker.pinned_image_id,
                pinned_instance_type=worker.pinned_instance_type,
            )
        except Conflict:
            found = ctx.store.find_worker(new_id)
            if found is not None and found.status in _ENDED:
                continue  # it cannot take the place: the next id of the sequence
            counters["expiry_replacement_exists"] += 1  # an earlier attempt made it
            return True
        counters["expiry_replacements"] += 1
        return True
    return False
