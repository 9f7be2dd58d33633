"""A rollout's rollback, advanced by the leading reconcile shard one step per cycle, like the rollout
itself (docs/rollouts.md, "Rollback").

The rollback walks the workers of every wave the rollout reached, in waves of `max_unavailable`, with
its own progress. For each worker whose replacement still lives:

- the old worker still serves (a surge stopped before its drain): the replacement is drained, nothing
  is launched;
- the rollout drained the old worker: a worker pinned to the old one's image and instance type is
  launched first (`restoration_id`, derived like the replacement's id), and once it is RUNNING the
  replacement is drained.

Drains go through the pools' disruption budgets (reason `rollout`) with `then: terminate`, requested
by `rollout:<id>`; only the current rollback wave's replacements are drained, so never more than
`max_unavailable` at once. Each step writes the rollout back under its version.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import Any

from fleetkeeper.domain.errors import PoolFull
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.rollouts import (
    MAX_RESTORATION_ATTEMPTS,
    RollbackAction,
    Rollout,
    RolloutStatus,
    WorkerPhase,
    replacement_id,
    restoration_id,
    rollback_action,
)
from fleetkeeper.domain.values import MAX_REASON_LENGTH
from fleetkeeper.services import admission
from fleetkeeper.services.context import Context
from fleetkeeper.services.rollouts.commands import emit
from fleetkeeper.services.rollouts.step import (
    DISRUPTED,
    FAILED,
    GONE,
    LAUNCHING,
    LEAVING,
    Step,
    Turn,
    drained_by,
    serve_in_turn,
)


def advance_rollbacks(
    ctx: Context,
    counters: Counter[str],
    *,
    time_left: Callable[[], float],
    margin_seconds: float,
    now: datetime | None = None,
) -> None:
    """One step of each ROLLING_BACK rollout (at most MAX_ROLLOUTS_PER_CYCLE, in turn), within the time
    left."""
    now = now or utcnow()
    serve_in_turn(
        ctx,
        RolloutStatus.ROLLING_BACK,
        counters,
        "rollback step",
        partial(_step_rollback, ctx, now=now, counters=counters),
        time_left=time_left,
        margin_seconds=margin_seconds,
    )


def _step_rollback(ctx: Context, rollout_id: str, *, now: datetime, counters: Counter[str]) -> None:
    rollout = ctx.rollouts.find(rollout_id)
    if rollout is None or rollout.status != RolloutStatus.ROLLING_BACK:
        return
    step_rollback(ctx, rollout, now)
    counters["rollback_steps"] += 1


def _reason(rollout: Rollout) -> str:
    text = f"rollback of rollout {rollout.id}"
    return (text + (f": {rollout.rollback_reason}" if rollout.rollback_reason else ""))[:MAX_REASON_LENGTH]


def _taken_out(rollout: Rollout, old: Worker | None) -> bool:
    """Whether the rollout's own drain took the old worker out of service (one whose drain an operator
    cancelled serves again)."""
    return old is not None and old.status in (DISRUPTED | GONE) and drained_by(rollout, old)


def _live(worker: Worker | None) -> bool:
    return worker is not None and worker.status not in FAILED


def step_rollback(ctx: Context, rollout: Rollout, now: datetime) -> Rollout:
    """Advance one ROLLING_BACK rollout by what is due now, and write it back (StaleWrite if it moved)."""
    with admission.door(ctx, now) as door:
        work = Step(
            ctx, rollout, now, door, progress=rollout.rollback_progress, drain_reason=_reason(rollout)
        )
        return _step_rollback_with(ctx, rollout, work)


def _step_rollback_with(ctx: Context, rollout: Rollout, work: Step) -> Rollout:
    if rollout.rollback_wave < rollout.rollback_wave_count and not rollout.rollback_progress:
        # The rollback's waves are the rollout's waves 0..through, recut the same (rollback_scope).
        for worker_id in ctx.rollouts.wave_ids(rollout, rollout.rollback_wave):
            work.set(worker_id, WorkerPhase.WAITING)
    current = [w for w, p in work.progress.items() if p.phase not in (WorkerPhase.DONE, WorkerPhase.SKIPPED)]
    # The forward wave the rollout stopped in may still be draining its old workers: they are out of
    # placement too, so the rollback's drains wait for room beside them.
    through = rollout.rollback_through_wave
    forward = (
        ctx.rollouts.wave_ids(rollout, through)
        if through is not None and through < rollout.wave_count
        else []
    )
    wanted = [*current, *forward]
    wanted += [replacement_id(rollout.id, w) for w in current]
    wanted += [restoration_id(rollout.id, w, a) for w in current for a in range(MAX_RESTORATION_ATTEMPTS)]
    found = {w.id: w for w in ctx.store.get_workers(wanted)}
    forward_out = sum(
        1
        for w in forward
        if (old := found.get(w)) is not None and old.status in LEAVING and drained_by(rollout, old)
    )
    rollback_out = sum(1 for p in work.progress.values() if p.phase == WorkerPhase.DRAINING)
    work.room = rollout.max_unavailable - forward_out - rollback_out
    for worker_id in current:
        _advance(work, worker_id, found)
    return _finish(ctx, rollout, work)


def _restoring(
    rollout: Rollout, worker_id: str, found: dict[str, Worker]
) -> tuple[str | None, Worker | None]:
    """The id of the worker restoring `worker_id` and that worker if it exists: the first attempt not
    ended (one that failed to launch gives its place to the next); (None, None) once every attempt
    has failed."""
    for attempt in range(MAX_RESTORATION_ATTEMPTS):
        new_id = restoration_id(rollout.id, worker_id, attempt)
        worker = found.get(new_id)
        if worker is None or worker.status not in FAILED:
            return new_id, worker
    return None, None


def _advance(work: Step, worker_id: str, found: dict[str, Worker]) -> None:
    rollout = work.rollout
    old = found.get(worker_id)
    replacement = found.get(replacement_id(rollout.id, worker_id))
    restoring_id, restored = _restoring(rollout, worker_id, found)
    phase = work.progress[worker_id].phase
    if phase == WorkerPhase.WAITING:
        if replacement is not None and replacement.status in DISRUPTED and drained_by(rollout, replacement):
            # Its drain was started by a step whose write was lost.
            work.set(worker_id, WorkerPhase.DRAINING)
            return
        action = rollback_action(
            old_drained_by_rollout=_taken_out(rollout, old),
            replacement_serving=_live(replacement)
            and replacement is not None
            and replacement.status not in DISRUPTED,
            # Drained by an operator or its expiry: not this rollback's to undo.
            replacement_taken_elsewhere=replacement is not None
            and replacement.drain is not None
            and not drained_by(rollout, replacement),
        )
        if old is not None:
            # The old worker stays: an admission the forward wave made for its drain is given back.
            work.release(old)
        if action == RollbackAction.NOTHING:
            work.set(worker_id, WorkerPhase.SKIPPED)
            return
        if action == RollbackAction.DRAIN:
            phase = WorkerPhase.REPLACING  # nothing to launch: straight to the replacement's drain
        elif old is None or old.image_id is None or old.instance_type is None:
            # Launched before workers recorded their launch: restoring it would launch the template's
            # newest image, the one being rolled back. Its replacement stays; counted as skipped.
            work.set(worker_id, WorkerPhase.SKIPPED)
            return
        elif restoring_id is None:
            _fail_restoration(work, worker_id)
            return
        elif restored is None:
            if not work.may_start():
                return  # the next cycle launches it
            try:
                new_id = work.create_replacement(old, new_id=restoring_id, pinned=True)
            except PoolFull as full:
                # A restoration surges too; in a full pool it waits for a place.
                work.block("capacity", f"worker {worker_id}: {full.message}")
                return
            if new_id is not None:
                work.set(worker_id, WorkerPhase.REPLACING, new_id)
            return
        else:
            work.set(worker_id, WorkerPhase.REPLACING, restored.id)
            phase = WorkerPhase.REPLACING
    if phase == WorkerPhase.REPLACING:
        _undo(work, worker_id, old, replacement, (restoring_id, restored))
    elif phase == WorkerPhase.DRAINING:
        _undone(work, worker_id, replacement)


def _undo(
    work: Step,
    worker_id: str,
    old: Worker | None,
    replacement: Worker | None,
    restoring: tuple[str | None, Worker | None],
) -> None:
    """The worker restoring the old one runs (when one was needed): its replacement drains."""
    rollout = work.rollout
    restoring_id, restored = restoring
    if _taken_out(rollout, old):
        if restoring_id is None:
            _fail_restoration(work, worker_id)
            return
        if restored is None:
            # The one launched failed: the next attempt is launched from the waiting phase.
            work.set(worker_id, WorkerPhase.WAITING)
            return
        if restored.status != WorkerStatus.RUNNING:
            work.block("capacity", f"worker {restored.id} restoring {worker_id} is {restored.status}")
            return
    if not _live(replacement) or replacement is None:
        work.set(worker_id, WorkerPhase.DONE)
        return
    if replacement.status in LAUNCHING:
        work.block("capacity", f"replacement {replacement.id} of {worker_id} is {replacement.status}")
        return
    if replacement.status != WorkerStatus.RUNNING and not drained_by(rollout, replacement):
        # Leaving for another reason (an operator's drain, its expiry): not this rollback's to drain.
        work.set(worker_id, WorkerPhase.SKIPPED)
        return
    turn = work.drain(replacement)
    if turn != Turn.WAITING:
        # Someone else holds it (an operator's drain): not this rollback's to drain.
        work.set(worker_id, WorkerPhase.DRAINING if turn == Turn.STARTED else WorkerPhase.SKIPPED)


def _undone(work: Step, worker_id: str, replacement: Worker | None) -> None:
    if replacement is None or replacement.status == WorkerStatus.RUNNING:
        # An operator cancelled the replacement's drain: the rollback leaves it.
        work.set(worker_id, WorkerPhase.SKIPPED)
    elif replacement.status not in GONE:
        work.block("drain_waiting", f"replacement {replacement.id} of {worker_id} is {replacement.status}")
    else:
        work.set(worker_id, WorkerPhase.DONE)


def _fail_restoration(work: Step, worker_id: str) -> None:
    work.fail(f"every worker restoring {worker_id} failed to launch ({MAX_RESTORATION_ATTEMPTS} tried)")


def _finish(ctx: Context, rollout: Rollout, work: Step) -> Rollout:
    now = work.now
    progress = work.progress
    done = sum(1 for p in progress.values() if p.phase == WorkerPhase.DONE)
    skipped = sum(1 for p in progress.values() if p.phase == WorkerPhase.SKIPPED)
    wave_over = bool(progress) and done + skipped == len(progress)
    blocked = work.blocked_now()
    changes: dict[str, Any] = {"rollback_progress": progress, "blocked": blocked}
    if work.failed is not None:
        changes |= {"status": RolloutStatus.FAILED, "finished_at": now}
        saved = ctx.rollouts.save(
            rollout, changes, actor=work.actor, action="RolloutFailed", reason=work.failed
        )
        emit(ctx, "RolloutFailed", saved, reason=work.failed)
        return saved
    if wave_over or not progress:
        changes |= {
            "rolled_back": rollout.rolled_back + done,
            "rollback_skipped": rollout.rollback_skipped + skipped,
            "rollback_progress": {},
            "blocked": None,
        }
        if rollout.rollback_wave + 1 >= rollout.rollback_wave_count:
            changes |= {"status": RolloutStatus.ROLLED_BACK, "finished_at": now}
            saved = ctx.rollouts.save(
                rollout, changes, actor=work.actor, action="RolloutRolledBack", reason=rollout.rollback_reason
            )
            emit(ctx, "RolloutRolledBack", saved, rolled_back=saved.rolled_back)
            return saved
        changes |= {"rollback_wave": rollout.rollback_wave + 1}
        return ctx.rollouts.save(rollout, changes, actor=work.actor)
    if progress == rollout.rollback_progress and blocked == rollout.blocked:
        return rollout  # nothing changed: no write
    return ctx.rollouts.save(rollout, changes, actor=work.actor)
