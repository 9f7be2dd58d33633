"""Replacing expired workers: a RUNNING worker older than its template's `max_lifetime_hours` gets a new
worker of the same template, pool and region, and is drained with `then=terminate` (docs/rollouts.md).

Each replacement is a voluntary disruption of reason `expired`, admitted by the door for disruption
(services/admission.py) before anything is made: the admission owns the worker (nobody else replaces
or drains it meanwhile) and counts it in its pool's budgets; one held back waits for a later cycle, and
one someone else holds (an active rollout's) is left to them.

The new worker's id is derived from the expired worker's, so an attempt repeated after a crash or a
refused drain finds the replacement it already made (Conflict) instead of making a second: each expired
worker has at most one live replacement, whatever happens between the two writes. A replacement that
has ended meanwhile (its launch failed, it was terminated) does not count: the next id of the sequence
is tried, at most MAX_REPLACEMENT_ATTEMPTS of them, and the worker is never drained without a live one.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Final

from fleetkeeper.domain.admission import Ask, Held
from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainThen, Drift, DriftReason, Worker
from fleetkeeper.observability import logger
from fleetkeeper.services import admission, drains, workers
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.actions import ACTOR, Work

# Expired workers one cycle (one shard) replaces at most; the others wait for the next cycle, oldest
# first. Each costs a read of its pool for the admission, a worker and a drain.
MAX_REPLACEMENTS_PER_CYCLE: Final = 10
EXPIRED_REASON: Final = "expired: older than its template's max_lifetime_hours"
EXPIRY_ACTOR: Final = ACTOR
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
            and _may_replace(worker)
        ):
            found.append((drift.since, worker))
    return [worker for _, worker in sorted(found, key=lambda pair: (pair[0], pair[1].id))]


def _may_replace(worker: Worker) -> bool:
    """RUNNING, no drain running and no other status asked for: what expiry proposes; whether it may go
    is the door's to say."""
    return (
        worker.status == WorkerStatus.RUNNING
        and (worker.drain is None or worker.drain.outcome != DrainOutcome.RUNNING)
        and worker.desired_status in {None, WorkerStatus.RUNNING}
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
    with admission.door(ctx, now) as door:
        for worker in expired[:MAX_REPLACEMENTS_PER_CYCLE]:
            if time_left() < margin_seconds:
                counters["expiry_deferred"] += 1
                continue
            try:
                _replace(ctx, door, worker, counters)
            except Exception:  # one worker's replacement, never the cycle
                logger.exception("replacing an expired worker failed", worker_id=worker.id)
                counters["expiry_errors"] += 1


def _replace(ctx: Context, door: admission.Door, seen: Worker, counters: Counter[str]) -> None:
    # The cycle read the worker before its steps ran: an operator may have drained it or asked for
    # another status since. The door reads it afresh; its admission holds it while the replacement is made.
    ask = Ask(DisruptionReason.EXPIRED, EXPIRY_ACTOR, ahead=True)
    admitted = admission.hold_ahead(ctx, door, seen.id, ask)
    if isinstance(admitted, Held):
        counters[f"expiry_held_{admitted.why}"] += 1
        return
    if not _may_replace(admitted):
        counters["expiry_changed"] += 1
        door.release(admitted, ask)
        return
    if not _ensure_replacement(ctx, admitted, counters):
        counters["expiry_replacement_failed"] += 1
        logger.error("every replacement of an expired worker ended; it is not drained", worker_id=seen.id)
        door.release(admitted, ask)
        return
    started = drains.open_drain(
        ctx, door, seen.id, ask, actor=EXPIRY_ACTOR, reason=EXPIRED_REASON, then=DrainThen.TERMINATE
    )
    counters["expiry_drain_refused" if isinstance(started, Held) else "expiry_drains"] += 1


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
                actor=EXPIRY_ACTOR,
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
