"""The rollout engine: the leading reconcile shard advances each RUNNING rollout one step per cycle
(docs/rollouts.md, "How a rollout advances").

A step reads the rollout and the workers of its current wave, does what is due (create replacements,
ask the pool's disruption budgets, start drains), and writes the rollout back under a condition on
the version it read: a step that loses to an operator's pause or cancel is dropped, its effects are
found again next cycle (a drain already started, a replacement with the id the step chose).

Out of placement at once: only the current wave's workers are ever drained, and a wave is at most
`max_unavailable` workers; the next wave starts once every worker of this one is done.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Final

from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.errors import Conflict, NotFound, StaleWrite
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainThen, Worker, utcnow
from fleetkeeper.domain.rollouts import (
    Blocked,
    BlockedReason,
    Rollout,
    RolloutStatus,
    RolloutStrategy,
    WorkerPhase,
    WorkerProgress,
    checkpoint_reached,
    percent_done,
    replacement_id,
)
from fleetkeeper.domain.values import MAX_REASON_LENGTH
from fleetkeeper.observability import logger
from fleetkeeper.services import disruption, drains, workers
from fleetkeeper.services.context import Context
from fleetkeeper.services.rollout_alarms import held_by_alarms
from fleetkeeper.services.rollouts import emit

# Rollouts one cycle advances at most (and PAUSED ones it looks at for a checkpoint's delay): the
# rest wait for the next cycle.
MAX_ROLLOUTS_PER_CYCLE: Final = 20
# Replacements created and drains asked for in one step at most: a wide wave (up to MAX_WAVE_WORKERS)
# starts over a few cycles rather than spend one cycle's time on it.
MAX_STARTS_PER_STEP: Final = 25
ACTOR_PREFIX: Final = "rollout:"
# A drain of the old worker has ended once it is out of the fleet or stopped.
_GONE: Final = frozenset({WorkerStatus.TERMINATED, WorkerStatus.STOPPED})
# A replacement that reached one of these will never run.
_FAILED: Final = frozenset(
    {
        WorkerStatus.FAILED,
        WorkerStatus.STOPPING,
        WorkerStatus.STOPPED,
        WorkerStatus.TERMINATING,
        WorkerStatus.TERMINATED,
    }
)
_DISRUPTED: Final = frozenset(
    {WorkerStatus.DRAINING, WorkerStatus.STOPPING, WorkerStatus.TERMINATING, WorkerStatus.TERMINATED}
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


def serve_in_turn(
    ctx: Context,
    status: RolloutStatus,
    counters: Counter[str],
    what: str,
    call: Callable[[str], None],
    *,
    time_left: Callable[[], float],
    margin_seconds: float,
) -> bool:
    """`call` on each rollout in `status`, at most MAX_ROLLOUTS_PER_CYCLE, each through guarded_step,
    starting after the one the last cycle served last and going around: with more of them than a cycle
    serves, each gets its turn within a few cycles. False when the time left ran out."""
    store = ctx.rollouts
    served: str | None = None
    turn = store.turn(status)
    try:
        for rollout_id in store.active_ids(status, limit=MAX_ROLLOUTS_PER_CYCLE, after=turn):
            if time_left() < margin_seconds:
                counters["rollouts_deferred"] += 1
                return False
            guarded_step(counters, rollout_id, what, partial(call, rollout_id))
            served = rollout_id
    finally:
        if served is not None and not store.set_turn(status, served, read=turn):
            # Another cycle moved the turn since this one read it: its place stands, and the rollouts
            # this cycle did not reach are served from there.
            counters["rollout_turn_lost"] += 1
    return True


def guarded_step(counters: Counter[str], rollout_id: str, what: str, call: Callable[[], None]) -> None:
    """Run one rollout's step of a cycle: a step that lost to another write (an operator's pause or
    cancel) is dropped and the next cycle decides; any other failure is logged and counted, and never
    stops the other rollouts (it is tried again next cycle)."""
    try:
        call()
    except StaleWrite:
        counters["rollout_step_conflicts"] += 1
    except Exception:
        logger.exception(f"{what} failed", rollout_id=rollout_id)
        counters["rollout_errors"] += 1


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


class _Step:
    """What one step changes: the progress of the wave, and why it waits."""

    def __init__(
        self,
        ctx: Context,
        rollout: Rollout,
        now: datetime,
        progress: dict[str, WorkerProgress] | None = None,
        drain_reason: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.rollout = rollout
        self.now = now
        self.actor = ACTOR_PREFIX + rollout.id
        self.progress = dict(rollout.progress if progress is None else progress)
        self.drain_reason = drain_reason or _drain_reason(rollout)
        self.blocked: list[tuple[BlockedReason, str]] = []
        self.failed: str | None = None
        self.starts = 0
        # Drains this step may still start without taking more than max_unavailable of the scope out of
        # placement, when something besides the current wave's own drains counts (a rollback); None: the
        # wave's size bounds it.
        self.room: int | None = None

    def may_start(self) -> bool:
        """Whether this step may create one more replacement or ask for one more drain."""
        if self.starts >= MAX_STARTS_PER_STEP:
            return False
        self.starts += 1
        return True

    def set(self, worker_id: str, phase: WorkerPhase, replacement: str | None = None) -> None:
        old = self.progress.get(worker_id)
        self.progress[worker_id] = WorkerProgress(
            phase=phase,
            replacement_id=replacement if replacement is not None else (old.replacement_id if old else None),
            since=self.now,
        )

    def block(self, reason: BlockedReason, detail: str) -> None:
        self.blocked.append((reason, detail))

    def blocked_now(self) -> Blocked | None:
        """Why the rollout waits after this step: the first reason found, since when the rollout has
        waited for that reason (a reason that changed starts now); None when nothing holds it."""
        if not self.blocked:
            return None
        reason, detail = self.blocked[0]
        before = self.rollout.blocked
        since = before.since if before is not None and before.reason == reason else self.now
        return Blocked(reason=reason, detail=detail, since=since)

    def create_replacement(self, old: Worker, *, new_id: str | None = None, pinned: bool = False) -> str:
        """Create old's replacement (PENDING) under a derived id; `pinned`: launched with the image and
        instance type old was launched with (a rollback), not the template's newest."""
        new_id = new_id or replacement_id(self.rollout.id, old.id)
        # A Conflict: created by a step whose write was lost; it is the same replacement.
        with contextlib.suppress(Conflict):
            workers.create_worker(
                self.ctx.store,
                template=old.template if pinned else (self.rollout.template or old.template),
                region=old.region,
                pool=old.pool,
                actor=self.actor,
                worker_id=new_id,
                pinned_image_id=old.image_id if pinned else None,
                pinned_instance_type=old.instance_type if pinned else None,
            )
        return new_id

    def admit_and_drain(self, old: Worker) -> bool:
        """Ask the pool's budgets for the old worker's drain and start it; False while it must wait."""
        if old.status in _DISRUPTED:
            return True  # started by a step whose write was lost
        if self.room is not None and self.room <= 0:
            self.block(
                "drain_waiting", f"worker {old.id}: {self.rollout.max_unavailable} out of placement already"
            )
            return False
        if not self.may_start():
            return False  # the next cycle asks
        refusal = disruption.admit(self.ctx, old.id, DisruptionReason.ROLLOUT, now=self.now)
        if refusal is not None:
            block = refusal.block
            if block is not None and block.until is not None:
                self.block("window", f"worker {old.id}: a budget window holds rollouts until {block.until}")
            elif block is not None:
                self.block(
                    "budget",
                    f"worker {old.id}: pool {block.pool} budget {block.budget} allows {block.allowed}, "
                    f"{block.in_use} in use",
                )
            else:
                self.block("budget", f"worker {old.id}: {refusal.guard}")
            return False
        drains.start_worker_drain(
            self.ctx,
            old.id,
            actor=self.actor,
            reason=self.drain_reason,
            timeout_seconds=self.rollout.drain_timeout_seconds,
            then=DrainThen.TERMINATE,
        )
        if self.room is not None:
            self.room -= 1
        return True


def step(ctx: Context, rollout: Rollout, now: datetime) -> Rollout:
    """Advance one RUNNING rollout by what is due now, and write it back (StaleWrite if it moved)."""
    work = _Step(ctx, rollout, now)
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


def _advance_worker(work: _Step, worker_id: str, old: Worker | None) -> None:
    rollout = work.rollout
    progress = work.progress[worker_id]
    phase = progress.phase
    surge = rollout.strategy == RolloutStrategy.SURGE and rollout.replace
    if phase == WorkerPhase.WAITING:
        # A worker gone or not in service when its wave comes is left alone. One already leaving for
        # another reason (its expiry, which replaces it itself; an operator's or a scale-down's drain)
        # is left alone too: a replacement here would add a worker the scope never lost. Only this
        # rollout's own drain, started by a step whose write was lost, is followed.
        if (
            old is None
            or old.status in _GONE
            or old.status not in (_DISRUPTED | {WorkerStatus.RUNNING})
            or (old.status in _DISRUPTED and not _drained_by(rollout, old))
        ):
            work.set(worker_id, WorkerPhase.SKIPPED)
            return
        if surge:
            if not work.may_start():
                return  # the next cycle creates it
            work.set(worker_id, WorkerPhase.REPLACING, work.create_replacement(old))
            phase = WorkerPhase.REPLACING
        elif work.admit_and_drain(old):
            work.set(worker_id, WorkerPhase.DRAINING)
            return
        else:
            return
    if phase == WorkerPhase.REPLACING:
        new = _replacement(work, progress.replacement_id or replacement_id(rollout.id, worker_id))
        if new is None or new.status in _FAILED:
            work.failed = f"replacement of worker {worker_id} failed to launch"
            work.block("launch_failed", work.failed)
            return
        if new.status != WorkerStatus.RUNNING:
            work.block("capacity", f"replacement {new.id} of worker {worker_id} is {new.status}")
            return
        if old is None:
            work.set(worker_id, WorkerPhase.DONE)
            return
        if work.admit_and_drain(old):
            work.set(worker_id, WorkerPhase.DRAINING)
        return
    if phase == WorkerPhase.DRAINING:
        if old is None or old.status == WorkerStatus.RUNNING:
            # Its drain was cancelled by an operator (or its record is gone): the rollout leaves it.
            work.set(worker_id, WorkerPhase.SKIPPED)
            return
        if old.status not in _GONE:
            work.block("drain_waiting", f"worker {worker_id} is {old.status}")
            return
        if rollout.replace and not surge:
            if work.may_start():
                work.set(worker_id, WorkerPhase.REPLACED_PENDING, work.create_replacement(old))
            return
        work.set(worker_id, WorkerPhase.DONE)
        return
    if phase == WorkerPhase.REPLACED_PENDING:
        new = _replacement(work, progress.replacement_id or replacement_id(rollout.id, worker_id))
        if new is None or new.status in _FAILED:
            work.failed = f"replacement of worker {worker_id} failed to launch"
            work.block("launch_failed", work.failed)
        elif new.status == WorkerStatus.RUNNING:
            work.set(worker_id, WorkerPhase.DONE)
        else:
            work.block("capacity", f"replacement {new.id} of worker {worker_id} is {new.status}")


def _drain_reason(rollout: Rollout) -> str:
    """The reason of the drains this rollout starts: its id first, whole, so its drains are its own."""
    return (f"rollout {rollout.id}" + (f": {rollout.reason}" if rollout.reason else ""))[:MAX_REASON_LENGTH]


def _drained_by(rollout: Rollout, worker: Worker) -> bool:
    """Whether the worker's current drain is one this rollout started (it is the drain's requester)."""
    return worker.drain is not None and worker.drain.requested_by == ACTOR_PREFIX + rollout.id


def _replacement(work: _Step, worker_id: str) -> Worker | None:
    try:
        return work.ctx.store.get_worker(worker_id)
    except NotFound:
        return None


def _finish_step(ctx: Context, rollout: Rollout, work: _Step) -> Rollout:
    now = work.now
    progress = work.progress
    done = sum(1 for p in progress.values() if p.phase == WorkerPhase.DONE)
    skipped = sum(1 for p in progress.values() if p.phase == WorkerPhase.SKIPPED)
    wave_over = bool(progress) and done + skipped == len(progress)
    changes: dict[str, Any] = {"progress": progress}
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
            if rollout.wave_done_at is not None and progress == rollout.progress:
                return rollout  # nothing changed: no write
            changes |= {"blocked": None}
            return ctx.rollouts.save(rollout, changes, actor=work.actor)
        changes |= next_wave | {"wave_done_at": None, "blocked": None}
        return ctx.rollouts.save(rollout, changes, actor=work.actor)
    changes |= {"blocked": blocked}
    if changes["progress"] == rollout.progress and blocked == rollout.blocked:
        return rollout  # nothing changed: no write
    return ctx.rollouts.save(rollout, changes, actor=work.actor)
