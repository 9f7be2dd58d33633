"""The rollout engine: the leading reconcile shard advances each RUNNING rollout one step per cycle
(docs/rollouts.md, "How a rollout advances").

A step claims the next workers of its scope (services/rollouts/step.py), reads the workers of its
current wave, does what is due (ask the door for disruption for each old worker, create replacements
held by the rollout, start drains), and writes the rollout back under a condition on the version it
read: a step that loses to an operator's pause or cancel is dropped, its effects are found again next
cycle (a drain already started, a replacement with the id the step chose).

Out of placement at once: only the current wave's workers are ever drained, and a wave is at most
`max_unavailable` workers; the next wave starts once every worker of this one is done.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from fleetkeeper.domain.admission import Held
from fleetkeeper.domain.errors import PoolFull, StaleWrite
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.rollouts import (
    Blocked,
    Rollout,
    RolloutStatus,
    RolloutStrategy,
    WorkerPhase,
    checkpoint_reached,
    percent_done,
    replacement_id,
)
from fleetkeeper.observability import logger
from fleetkeeper.services import admission
from fleetkeeper.services.context import Context
from fleetkeeper.services.rollouts.alarms import held_by_alarms
from fleetkeeper.services.rollouts.commands import emit
from fleetkeeper.services.rollouts.step import (
    ACTOR_PREFIX,
    DISRUPTED,
    FAILED,
    GONE,
    Step,
    Turn,
    drained_by,
    serve_in_turn,
)


def advance_rollouts(
    ctx: Context,
    counters: Counter[str],
    *,
    time_left: Callable[[], float],
    margin_seconds: float,
    now: datetime | None = None,
) -> None:
    """One step of each RUNNING rollout, the end of the checkpoint waits that have passed, and the
    rollback of those whose alarms fired."""
    now = now or utcnow()
    if not serve_in_turn(
        ctx,
        RolloutStatus.PAUSED,
        counters,
        "paused rollout check",
        partial(_check_paused, ctx, now=now, counters=counters),
        time_left=time_left,
        margin_seconds=margin_seconds,
    ):
        return
    serve_in_turn(
        ctx,
        RolloutStatus.RUNNING,
        counters,
        "rollout step",
        partial(_step_running, ctx, now=now, counters=counters),
        time_left=time_left,
        margin_seconds=margin_seconds,
    )


def _check_paused(ctx: Context, rollout_id: str, *, now: datetime, counters: Counter[str]) -> None:
    paused = ctx.rollouts.find(rollout_id)
    if paused is None or paused.status != RolloutStatus.PAUSED or held_by_alarms(ctx, paused, counters):
        return
    _resume_after_delay(ctx, paused, now, counters)


def _step_running(ctx: Context, rollout_id: str, *, now: datetime, counters: Counter[str]) -> None:
    rollout = ctx.rollouts.find(rollout_id)
    if rollout is None or rollout.status != RolloutStatus.RUNNING or held_by_alarms(ctx, rollout, counters):
        return
    step(ctx, rollout, now)
    counters["rollout_steps"] += 1


def _resume_after_delay(ctx: Context, rollout: Rollout, now: datetime, counters: Counter[str]) -> None:
    if (
        rollout.paused_at_checkpoint is None
        or rollout.checkpoint_delay_seconds is None
        or rollout.paused_at is None
        or now < rollout.paused_at + timedelta(seconds=rollout.checkpoint_delay_seconds)
    ):
        return
    passed = sorted({*rollout.checkpoints_passed, rollout.paused_at_checkpoint})
    try:
        saved = ctx.rollouts.save(
            rollout,
            {
                "status": RolloutStatus.RUNNING,
                "paused_at": None,
                "paused_at_checkpoint": None,
                "checkpoints_passed": passed,
                "blocked": None,
            },
            actor=ACTOR_PREFIX + rollout.id,
            action="RolloutResumed",
            reason=f"checkpoint {rollout.paused_at_checkpoint}% waited {rollout.checkpoint_delay_seconds} s",
        )
    except StaleWrite:
        counters["rollout_step_conflicts"] += 1
        return
    emit(ctx, "RolloutResumed", saved, actor=ACTOR_PREFIX + rollout.id)
    counters["rollouts_resumed"] += 1


def step(ctx: Context, rollout: Rollout, now: datetime) -> Rollout:
    """Advance one RUNNING rollout by what is due now, and write it back (StaleWrite if it moved)."""
    with admission.door(ctx, now) as door:
        return _step(ctx, rollout, Step(ctx, rollout, now, door))


def _step(ctx: Context, rollout: Rollout, work: Step) -> Rollout:
    work.claim_ahead()
    starting = rollout.wave < rollout.wave_count and not rollout.progress
    if starting:
        # The wave's ids are read once, as it begins: from then on they are its progress's keys.
        for worker_id in ctx.rollouts.wave_ids(rollout, rollout.wave):
            work.set(worker_id, WorkerPhase.WAITING)
    current = [w for w, p in work.progress.items() if p.phase not in (WorkerPhase.DONE, WorkerPhase.SKIPPED)]
    found = {w.id: w for w in ctx.store.get_workers(current)}
    for worker_id in current:
        _advance_worker(work, worker_id, found.get(worker_id))
    saved = _finish_step(ctx, rollout, work)
    if starting and saved.version != rollout.version:
        # Announced once the step that began the wave is stored: a dropped step announces nothing.
        emit(ctx, "RolloutWaveStarted", saved, wave=rollout.wave, workers=rollout.wave_size(rollout.wave))
    return saved


def _advance_worker(work: Step, worker_id: str, old: Worker | None) -> None:
    phase = work.progress[worker_id].phase
    if phase == WorkerPhase.WAITING:
        _begin(work, worker_id, old)
    elif phase == WorkerPhase.REPLACING:
        _replacing(work, worker_id, old)
    elif phase == WorkerPhase.DRAINING:
        _draining(work, worker_id, old)
    elif phase == WorkerPhase.REPLACED_PENDING:
        new = _replacement_of(work, worker_id)
        if new is not None and new.status == WorkerStatus.RUNNING:
            work.set(worker_id, WorkerPhase.DONE)


def _surge(rollout: Rollout) -> bool:
    return rollout.strategy == RolloutStrategy.SURGE and rollout.replace


def _begin(work: Step, worker_id: str, old: Worker | None) -> None:
    """The wave reaches the worker. One gone or not in service is left alone, and so is one already
    leaving for another reason (its expiry, an operator's or a scale-down's drain): a replacement here
    would add a worker the scope never lost. Only this rollout's own drain, started by a step whose
    write was lost, is followed."""
    rollout = work.rollout
    if old is None or old.status in GONE or old.status not in (DISRUPTED | {WorkerStatus.RUNNING}):
        work.set(worker_id, WorkerPhase.SKIPPED)
        return
    if old.status in DISRUPTED:
        work.set(worker_id, WorkerPhase.DRAINING if drained_by(rollout, old) else WorkerPhase.SKIPPED)
        return
    if not _surge(rollout):
        turn = work.drain(old)
        if turn != Turn.WAITING:
            work.set(worker_id, WorkerPhase.DRAINING if turn == Turn.STARTED else WorkerPhase.SKIPPED)
        return
    if not work.may_start():
        return  # the next cycle asks
    # The door first: a surge's extra machine is a disruption of its pool's budget from now on, so a
    # freeze launches nothing.
    admitted = work.admit_ahead(old)
    if isinstance(admitted, Held):
        if work.held(worker_id, admitted) == Turn.TAKEN:
            work.set(worker_id, WorkerPhase.SKIPPED)
        return
    try:
        new_id = work.create_replacement(old)
    except PoolFull:
        # No room to surge in a pool at max_workers: this worker is replaced drain-first, its admission
        # kept; its replacement is made once it is gone (`_draining`, no replacement id yet).
        turn = work.drain(old)
        if turn != Turn.WAITING:
            work.set(worker_id, WorkerPhase.DRAINING if turn == Turn.STARTED else WorkerPhase.SKIPPED)
        return
    if new_id is not None:
        work.set(worker_id, WorkerPhase.REPLACING, new_id)


def _replacement_of(work: Step, worker_id: str) -> Worker | None:
    """The worker's replacement once it runs; None (the rollout failing, or waiting, says why) before."""
    progress = work.progress[worker_id]
    new = work.worker(progress.replacement_id or replacement_id(work.rollout.id, worker_id))
    if new is None or new.status in FAILED:
        work.fail(f"replacement of worker {worker_id} failed to launch")
        return None
    if new.status != WorkerStatus.RUNNING:
        work.block("capacity", f"replacement {new.id} of worker {worker_id} is {new.status}")
        return None
    return new


def _replacing(work: Step, worker_id: str, old: Worker | None) -> None:
    """surge: once the replacement runs, the old worker drains (the rollout owns it since its admission)."""
    if _replacement_of(work, worker_id) is None:
        return
    if old is None or (old.status != WorkerStatus.RUNNING and not drained_by(work.rollout, old)):
        # Gone, or taken out by someone else meanwhile (an operator's drain): its replacement runs.
        work.set(worker_id, WorkerPhase.DONE)
        return
    turn = work.drain(old)
    if turn != Turn.WAITING:
        work.set(worker_id, WorkerPhase.DRAINING if turn == Turn.STARTED else WorkerPhase.DONE)


def _draining(work: Step, worker_id: str, old: Worker | None) -> None:
    if old is None or old.status == WorkerStatus.RUNNING:
        # Its drain was cancelled by an operator (or its record is gone): the rollout leaves it.
        work.set(worker_id, WorkerPhase.SKIPPED)
        return
    if old.status not in GONE:
        work.block("drain_waiting", f"worker {worker_id} is {old.status}")
        return
    surged = _surge(work.rollout) and work.progress[worker_id].replacement_id is not None
    if not work.rollout.replace or surged:
        work.set(worker_id, WorkerPhase.DONE)
        return
    if work.may_start():
        try:
            new_id = work.create_replacement(old)
        except PoolFull:
            # The place the old worker left was taken meanwhile (the pool's scale-out brings it to its
            # target with the template's newest launch): nothing is left for the rollout to add.
            logger.info("replacement not needed: pool at max_workers", worker_id=worker_id)
            work.set(worker_id, WorkerPhase.DONE)
            return
        if new_id is not None:
            work.set(worker_id, WorkerPhase.REPLACED_PENDING, new_id)


def _finish_step(ctx: Context, rollout: Rollout, work: Step) -> Rollout:
    now = work.now
    progress = work.progress
    done = sum(1 for p in progress.values() if p.phase == WorkerPhase.DONE)
    skipped = sum(1 for p in progress.values() if p.phase == WorkerPhase.SKIPPED)
    wave_over = bool(progress) and done + skipped == len(progress)
    changes: dict[str, Any] = {"progress": progress, "claimed": work.claimed}
    blocked = work.blocked_now()
    if work.failed is not None:
        changes |= {"status": RolloutStatus.FAILED, "finished_at": now, "blocked": blocked}
        saved = ctx.rollouts.save(
            rollout, changes, actor=work.actor, action="RolloutFailed", reason=work.failed
        )
        emit(ctx, "RolloutFailed", saved, reason=work.failed)
        return saved
    if wave_over:
        replaced = rollout.replaced + done
        skipped_total = rollout.skipped + skipped
        wave_done_at = rollout.wave_done_at or now
        changes |= {"wave_done_at": wave_done_at}
        last = rollout.wave + 1 >= rollout.wave_count
        reached = checkpoint_reached(rollout.checkpoints, rollout.checkpoints_passed, replaced, rollout.total)
        if last:
            changes |= {
                "status": RolloutStatus.SUCCEEDED,
                "finished_at": now,
                "replaced": replaced,
                "skipped": skipped_total,
                "progress": {},
                "blocked": None,
            }
            saved = ctx.rollouts.save(rollout, changes, actor=work.actor, action="RolloutSucceeded")
            emit(ctx, "RolloutSucceeded", saved)
            return saved
        next_wave = {"wave": rollout.wave + 1, "progress": {}, "replaced": replaced, "skipped": skipped_total}
        if reached is not None:
            changes |= next_wave | {
                "status": RolloutStatus.PAUSED,
                "paused_at": now,
                "paused_at_checkpoint": reached,
                "wave_done_at": None,
                "blocked": Blocked(
                    reason="checkpoint",
                    detail=f"{percent_done(replaced, rollout.total)}% replaced: checkpoint {reached}% "
                    + (
                        "waits for a resume"
                        if rollout.checkpoint_delay_seconds is None
                        else f"goes on after {rollout.checkpoint_delay_seconds} s"
                    ),
                    since=now,
                ),
            }
            saved = ctx.rollouts.save(
                rollout, changes, actor=work.actor, action="RolloutPaused", reason=f"checkpoint {reached}%"
            )
            emit(ctx, "RolloutCheckpointReached", saved, checkpoint=reached)
            emit(ctx, "RolloutPaused", saved, checkpoint=reached)
            return saved
        if now < wave_done_at + timedelta(seconds=rollout.bake_seconds):
            # Baking: the finished wave settles before the next one starts.
            if rollout.wave_done_at is not None and progress == rollout.progress and not work.claimed_more:
                return rollout  # nothing changed: no write
            changes |= {"blocked": None}
            return ctx.rollouts.save(rollout, changes, actor=work.actor)
        changes |= next_wave | {"wave_done_at": None, "blocked": None}
        return ctx.rollouts.save(rollout, changes, actor=work.actor)
    changes |= {"blocked": blocked}
    if changes["progress"] == rollout.progress and blocked == rollout.blocked and not work.claimed_more:
        return rollout  # nothing changed: no write
    return ctx.rollouts.save(rollout, changes, actor=work.actor)
