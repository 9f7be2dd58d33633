"""Replacing expired workers: a RUNNING worker older than its template's `max_lifetime_hours` gets a new
worker of the same template, pool and region, and is drained with `then=terminate` (docs/rollouts.md).

Each replacement is a voluntary disruption of reason `expired`, admitted by the door for disruption
(services/admission.py) before anything is made, and made surge-first as services/reconcile/replacement.py
says: one held back waits for a later cycle, and one someone else holds (an active rollout's) is left to
them. The drain starts at once, without waiting for the replacement to run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Final

from fleetkeeper.domain.admission import Ask
from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.models import Drift, DriftReason, Worker
from fleetkeeper.observability import logger
from fleetkeeper.services import admission
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile import replacement
from fleetkeeper.services.reconcile.actions import ACTOR, Work
from fleetkeeper.services.reconcile.replacement import may_replace

# Expired workers one cycle (one shard) replaces at most; the others wait for the next cycle, oldest
# first. Each costs a read of its pool for the admission, a worker and a drain.
MAX_REPLACEMENTS_PER_CYCLE: Final = 10
EXPIRED_REASON: Final = "expired: older than its template's max_lifetime_hours"
EXPIRY_ACTOR: Final = ACTOR
PURPOSE: Final = "expired"


def replacement_id(worker_id: str, attempt: int = 0) -> str:
    """The id of the worker that replaces `worker_id` on its `attempt`-th try: the same on every cycle."""
    return replacement.replacement_id(worker_id, PURPOSE, attempt)


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
            and may_replace(worker)
        ):
            found.append((drift.since, worker))
    return [worker for _, worker in sorted(found, key=lambda pair: (pair[0], pair[1].id))]


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
    plan = replacement.Replacement(
        ask=Ask(DisruptionReason.EXPIRED, EXPIRY_ACTOR, ahead=True),
        purpose=PURPOSE,
        counted_as="expiry",
        reason=EXPIRED_REASON,
    )
    with admission.door(ctx, now) as door:
        for worker in expired[:MAX_REPLACEMENTS_PER_CYCLE]:
            if time_left() < margin_seconds:
                counters["expiry_deferred"] += 1
                continue
            try:
                replacement.replace(ctx, door, worker.id, plan, counters, now=now)
            except Exception:  # one worker's replacement, never the cycle
                logger.exception("replacing an expired worker failed", worker_id=worker.id)
                counters["expiry_errors"] += 1
