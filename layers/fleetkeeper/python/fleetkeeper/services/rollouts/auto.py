"""`auto_rollout`: a template that asks for it gets a rollout started by the reconciler when its RUNNING
workers drift by `image` or `instance_type` (docs/rollouts.md, "Drift").

The leading shard alone starts them, once its workers' steps have written their drift. A template is
looked at only when one of the cycle's workers of it is RUNNING and drifted that way (so a steady fleet
reads nothing more); then its RUNNING workers are read fleet-wide, those someone holds (an active
rollout, a disruption under way: their owner), those a rollback pinned and those of an auto rollout that
failed, was cancelled or was rolled back are left out, and one rollout is started over the first
AUTO_ROLLOUT_MAX_WORKERS of the others by id, with the default settings, through
services/rollouts.start. A start refused because an active rollout covers one of them (409) means they
are covered.

A start runs inside the reconcile cycle, so it is bounded twice: one covers at most
AUTO_ROLLOUT_MAX_WORKERS workers (the next cycles start others over the rest), and it begins only while
the cycle has START_ALLOWANCE_SECONDS left beyond its margin.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Final

from fleetkeeper.domain.errors import Conflict, InvalidInput
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Drift, DriftReason, Worker, WorkerTemplate
from fleetkeeper.domain.rollouts import MAX_ROLLOUT_WORKERS, RolloutRequest, RolloutStatus
from fleetkeeper.observability import logger
from fleetkeeper.services import admission, rollouts
from fleetkeeper.services.context import Context

AUTO_REASON: Final = "auto: drift"
# Who starts them: the reconcile cycle.
ACTOR: Final = "reconciler"
# The drift a rollout fixes; `expired` has its own replacement (services/reconcile/expiry.py).
ROLLED_REASONS: Final = frozenset({DriftReason.IMAGE, DriftReason.INSTANCE_TYPE})
# The workers one auto rollout covers: the engine takes them wave by wave, and a start reads them all
# inside the reconcile cycle.
AUTO_ROLLOUT_MAX_WORKERS: Final = min(2_000, MAX_ROLLOUT_WORKERS)
# What a start of AUTO_ROLLOUT_MAX_WORKERS may take, with room: none begins with less left in the cycle.
START_ALLOWANCE_SECONDS: Final = 15.0
# An auto rollout that ended so holds its workers back from the next one until an operator rolls them.
HELD: Final = frozenset({RolloutStatus.FAILED, RolloutStatus.CANCELLED, RolloutStatus.ROLLED_BACK})


def _rolled(drift: Drift | None) -> bool:
    return drift is not None and bool(ROLLED_REASONS.intersection(drift.reasons))


def _candidate(worker: Worker) -> bool:
    # A worker a rollback restored is pinned to the launch it had: rolling it forward again would undo
    # the rollback; an operator's rollout (by --worker) moves it.
    return (
        worker.status == WorkerStatus.RUNNING
        and worker.pinned_image_id is None
        and worker.pinned_instance_type is None
        and _rolled(worker.drift)
    )


def _uncovered(ctx: Context, workers: Sequence[Worker], counters: Counter[str]) -> list[str]:
    """The workers nobody holds (their owner, domain/admission.holds: no active rollout, no disruption
    under way), and not those of an auto rollout that failed, was cancelled or rolled back (an operator
    decides what next: starting another each cycle would fail again, or undo what the operator did)."""
    door = admission.Door(ctx)
    free = []
    for worker in workers:
        if door.holder(worker) is not None:
            continue
        last = worker.owner.rollout_id if worker.owner is not None else None
        rollout = ctx.rollouts.find(last) if last is not None else None
        if rollout is not None and rollout.started_by == ACTOR and rollout.status in HELD:
            counters["auto_rollout_held"] += 1
        else:
            free.append(worker.id)
    return free


def start_auto_rollouts(
    ctx: Context,
    planned: Sequence[Worker],
    counters: Counter[str],
    *,
    time_left: Callable[[], float],
    margin_seconds: float,
) -> None:
    """At most one rollout start per `auto_rollout` template whose workers drifted by image or type, as
    the cycle's steps leave its workers (`planned`)."""
    names = sorted({w.template for w in planned if w.status == WorkerStatus.RUNNING and _rolled(w.drift)})
    if not names:
        return
    catalogue: dict[str, WorkerTemplate] = {t.name: t for t in ctx.store.list_templates()}
    for name in names:
        template = catalogue.get(name)
        if template is None or not template.auto_rollout:
            continue
        if time_left() < margin_seconds + START_ALLOWANCE_SECONDS:
            counters["auto_rollout_deferred"] += 1
            return
        try:
            _start_one(ctx, name, counters)
        except Exception:  # one template's start, not the others'
            logger.exception("auto rollout failed", template=name)
            counters["auto_rollout_errors"] += 1


def _start_one(ctx: Context, template: str, counters: Counter[str]) -> None:
    running = sorted({w.id for w in ctx.store.placement_candidates(template=template, pool=None)})
    drifted = [w for w in ctx.store.get_workers(running) if _candidate(w)]
    scope = _uncovered(ctx, drifted, counters) if drifted else []
    if not scope:
        counters["auto_rollout_covered"] += 1
        return
    if len(scope) > AUTO_ROLLOUT_MAX_WORKERS:
        # The rest wait for the next cycles' starts, each over the next ids no rollout covers.
        counters["auto_rollout_workers_waiting"] += len(scope) - AUTO_ROLLOUT_MAX_WORKERS
    request = RolloutRequest(worker_ids=scope[:AUTO_ROLLOUT_MAX_WORKERS], reason=AUTO_REASON)
    try:
        # Its whole scope claimed now: the next cycle's start must find these workers held.
        started = rollouts.start(ctx, request, actor=ACTOR, claim=AUTO_ROLLOUT_MAX_WORKERS)
    except Conflict:
        # An active rollout took one of them since they were read: they are covered.
        counters["auto_rollout_covered"] += 1
        return
    except InvalidInput as error:
        # One of them left RUNNING since it was read: the next cycle reads them again.
        counters["auto_rollout_changed"] += 1
        logger.info("auto rollout waits a cycle", template=template, reason=str(error))
        return
    counters["auto_rollouts_started"] += 1
    logger.info("auto rollout started", template=template, rollout_id=started.id, workers=started.total)
