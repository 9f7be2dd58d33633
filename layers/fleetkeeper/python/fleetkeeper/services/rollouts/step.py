"""What a rollout's step and its rollback's step share: the statuses they read, the door they pass, the
replacements they create, and why the rollout waits.

A step holds one door for disruption (services/admission.py) for all its workers: each drain it asks for
passes it as this rollout (reason `rollout`), and each replacement it creates is held by the rollout
while it is active, so nothing else disrupts it (docs/disruption.md, "Who may disrupt a worker").
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from enum import StrEnum
from typing import Final

from fleetkeeper.domain.admission import Ask, Held, WaitReason
from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.errors import Conflict, NotFound, PoolFull, PoolNotActive, StaleWrite
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainThen, Owner, Worker
from fleetkeeper.domain.rollouts import (
    Blocked,
    BlockedReason,
    Rollout,
    RolloutStatus,
    WorkerPhase,
    WorkerProgress,
    replacement_id,
)
from fleetkeeper.domain.values import MAX_REASON_LENGTH
from fleetkeeper.observability import logger
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.services import admission, drains, workers
from fleetkeeper.services.context import Context

# Rollouts one cycle advances at most (and PAUSED ones it looks at for a checkpoint's delay): the
# rest wait for the next cycle.
MAX_ROLLOUTS_PER_CYCLE: Final = 20
# Replacements created and drains asked for in one step at most: a wide wave (up to MAX_WAVE_WORKERS)
# starts over a few cycles rather than spend one cycle's time on it.
MAX_STARTS_PER_STEP: Final = 25
ACTOR_PREFIX: Final = "rollout:"
# A drain of the old worker has ended once it is out of the fleet or stopped.
GONE: Final = frozenset({WorkerStatus.TERMINATED, WorkerStatus.STOPPED})
# A replacement that reached one of these will never run.
FAILED: Final = frozenset(
    {
        WorkerStatus.FAILED,
        WorkerStatus.STOPPING,
        WorkerStatus.STOPPED,
        WorkerStatus.TERMINATING,
        WorkerStatus.TERMINATED,
    }
)
DISRUPTED: Final = frozenset(
    {WorkerStatus.DRAINING, WorkerStatus.STOPPING, WorkerStatus.TERMINATING, WorkerStatus.TERMINATED}
)
LAUNCHING: Final = frozenset({WorkerStatus.PENDING, WorkerStatus.PROVISIONING, WorkerStatus.STARTING})
# Workers of the scope a step claims ahead of its waves at most, CLAIM_THREADS writes at once: a
# 10,000-worker scope is claimed within 50 steps, the first waves' in the first.
CLAIMS_PER_STEP: Final = 200
CLAIM_THREADS: Final = 8
# A worker in one of these is held by nobody: there is nothing to claim.
_UNCLAIMABLE: Final = frozenset({WorkerStatus.STOPPED, WorkerStatus.TERMINATED, WorkerStatus.FAILED})
# Out of placement and not gone yet: what counts against max_unavailable.
LEAVING: Final = frozenset({WorkerStatus.DRAINING, WorkerStatus.STOPPING, WorkerStatus.TERMINATING})
# The door's reasons a rollout shows as its own `blocked` (the others it skips the worker for, or
# waits a step on without a word: a status that changes under it).
_BLOCKS: Final[dict[WaitReason, BlockedReason]] = {
    WaitReason.BUDGET: "budget",
    WaitReason.WINDOW: "window",
    WaitReason.POOL_NOT_ACTIVE: "pool_not_active",
    WaitReason.PROTECTED: "protected",
}
# How much a blocker says about the rollout: a failure first, then what an operator can act on.
_PRECEDENCE: Final[tuple[BlockedReason, ...]] = (
    "launch_failed",
    "pool_not_active",
    "protected",
    "window",
    "budget",
    "capacity",
    "drain_waiting",
)


class Turn(StrEnum):
    """What came of asking the door for one worker."""

    STARTED = "started"
    WAITING = "waiting"
    # Someone else holds the worker: the rollout leaves it to them.
    TAKEN = "taken"


def drained_by(rollout: Rollout, worker: Worker) -> bool:
    """Whether the worker's current drain is one this rollout started (it is the drain's requester)."""
    return worker.drain is not None and worker.drain.requested_by == ACTOR_PREFIX + rollout.id


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
            guarded_step(counters, rollout_id, what, lambda rollout_id=rollout_id: call(rollout_id))  # type: ignore[misc]
            served = rollout_id
    finally:
        if served is not None and not store.set_turn(status, served, read=turn):
            # Another cycle moved the turn since this one read it: its place stands, and the rollouts
            # this cycle did not reach are served from there.
            counters["rollout_turn_lost"] += 1
    return True


class Step:
    """What one step changes: the progress of the wave, and why it waits."""

    def __init__(
        self,
        ctx: Context,
        rollout: Rollout,
        now: datetime,
        door: admission.Door,
        *,
        progress: dict[str, WorkerProgress] | None = None,
        drain_reason: str | None = None,
    ) -> None:
        self.ctx = ctx
        self.rollout = rollout
        self.now = now
        self.door = door
        self.actor = ACTOR_PREFIX + rollout.id
        self.ask = Ask(DisruptionReason.ROLLOUT, self.actor, rollout_id=rollout.id)
        self.progress = dict(rollout.progress if progress is None else progress)
        self.drain_reason = drain_reason or rollout_drain_reason(rollout)
        self.blocked: list[tuple[BlockedReason, str]] = []
        self.failed: str | None = None
        self.starts = 0
        self.claimed = rollout.claimed
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

    def fail(self, detail: str) -> None:
        self.failed = detail
        self.block("launch_failed", detail)

    def blocked_now(self) -> Blocked | None:
        """Why the rollout waits after this step: the blocker that says most (a failure first), since when
        the rollout has waited for that reason (a reason that changed starts now); None when nothing
        holds it."""
        if not self.blocked:
            return None
        reason, detail = min(self.blocked, key=lambda b: _PRECEDENCE.index(b[0]))
        before = self.rollout.blocked
        since = before.since if before is not None and before.reason == reason else self.now
        return Blocked(reason=reason, detail=detail, since=since)

    def held(self, worker_id: str, held: Held) -> Turn:
        """What the door holding the worker back means for the rollout: someone else holds it (TAKEN: the
        rollout leaves it), or it waits, saying why in `blocked` where an operator can act on it."""
        if held.why == WaitReason.OWNED:
            return Turn.TAKEN
        blocked = _BLOCKS.get(held.why)
        if blocked is not None:
            self.block(blocked, f"worker {worker_id}: {held.detail}")
        return Turn.WAITING

    def release(self, worker: Worker) -> None:
        """Give back this rollout's admission of a worker it will not disrupt after all (its count with
        it); a worker serving, and counted as this rollout's, only."""
        owner = worker.owner
        if worker.status == WorkerStatus.RUNNING and owner is not None and owner.counted:
            self.door.release(worker, self.ask)

    def admit_ahead(self, old: Worker) -> Worker | Held:
        """Own and count the old worker now, its drain to start once its replacement runs (a surge)."""
        return admission.hold_ahead(self.ctx, self.door, old.id, self.ask)

    def create_replacement(
        self, old: Worker, *, new_id: str | None = None, pinned: bool = False
    ) -> str | None:
        """Create old's replacement (PENDING), held by this rollout, under a derived id; `pinned`: launched
        with the image and instance type old was launched with (a rollback), not the template's newest.
        None when its pool takes no new worker (blocked); PoolFull when the pool is at max_workers: the
        caller decides what replaces a surge then (services/rollouts/engine.py)."""
        new_id = new_id or replacement_id(self.rollout.id, old.id)
        hold = Owner(
            reason=str(DisruptionReason.ROLLOUT),
            actor=self.actor,
            since=self.now,
            counted=False,
            rollout_id=self.rollout.id,
        )
        try:
            workers.create_worker(
                self.ctx.store,
                template=old.template if pinned else (self.rollout.template or old.template),
                region=old.region,
                pool=old.pool,
                actor=self.actor,
                worker_id=new_id,
                pinned_image_id=old.image_id if pinned else None,
                pinned_instance_type=old.instance_type if pinned else None,
                owner=hold,
            )
        except PoolNotActive as refused:
            self.block("pool_not_active", f"worker {old.id}: {refused.message}")
            return None
        except PoolFull:
            raise
        except Conflict as exists:
            if isinstance(exists, StaleWrite):
                raise
            # Created by a step whose write was lost: it is the same replacement.
        return new_id

    def drain(self, old: Worker) -> Turn:
        """Ask the door for the old worker's drain (then terminate) as this rollout and start it."""
        if old.status in DISRUPTED and drained_by(self.rollout, old):
            return Turn.STARTED  # started by a step whose write was lost
        if self.room is not None and self.room <= 0:
            self.block(
                "drain_waiting", f"worker {old.id}: {self.rollout.max_unavailable} out of placement already"
            )
            return Turn.WAITING
        if not self.may_start():
            return Turn.WAITING  # the next cycle asks
        opened = drains.open_drain(
            self.ctx,
            self.door,
            old.id,
            self.ask,
            actor=self.actor,
            reason=self.drain_reason,
            timeout_seconds=self.rollout.drain_timeout_seconds,
            then=DrainThen.TERMINATE,
        )
        if isinstance(opened, Held):
            return self.held(old.id, opened)
        if self.room is not None:
            self.room -= 1
        return Turn.STARTED

    def claim_ahead(self, stop: int | None = None) -> None:
        """Claim the next workers of the sorted scope (up to `stop`, by default CLAIMS_PER_STEP more) as
        this rollout's: a hold, so nothing else disrupts them while it is active, and no other rollout
        takes them. One someone else holds stays theirs: its wave finds it taken and leaves it."""
        start = self.claimed
        stop = min(stop if stop is not None else start + CLAIMS_PER_STEP, self.rollout.total)
        if start >= stop:
            return
        ask = Ask(DisruptionReason.ROLLOUT, self.actor, rollout_id=self.rollout.id, hold=True)

        def own(current: Worker, owner: Owner, _: object) -> Worker:
            if current.status in _UNCLAIMABLE or current.owner == owner:
                return current
            return self.ctx.store.update_worker(
                current, {"owner": owner}, actor=self.actor, action="WorkerHeld", reason=self.drain_reason
            )

        def claim(worker: Worker) -> None:
            try:
                self.door.admit(worker.id, ask, own, action="hold", read=worker)
            except (NotFound, StaleWrite) as missed:
                # Gone, or kept changing: its wave decides on it through the door.
                logger.info(
                    "worker not claimed", worker_id=worker.id, rollout_id=self.rollout.id, why=str(missed)
                )

        # One strongly consistent batch read for the step's claims, not a read each; a worker gone
        # since the start is not claimed, and its wave finds it gone.
        found = self.ctx.store.get_workers(self.ctx.rollouts.members(self.rollout, start, stop))
        with ContextThreadPool(max_workers=CLAIM_THREADS) as pool:
            list(pool.map(claim, found))
        self.claimed = stop

    @property
    def claimed_more(self) -> bool:
        return self.claimed != self.rollout.claimed

    def worker(self, worker_id: str) -> Worker | None:
        with contextlib.suppress(NotFound):
            return self.ctx.store.get_worker(worker_id)
        return None


def rollout_drain_reason(rollout: Rollout) -> str:
    """The reason of the drains this rollout starts: its id first, whole, so its drains are its own."""
    return (f"rollout {rollout.id}" + (f": {rollout.reason}" if rollout.reason else ""))[:MAX_REASON_LENGTH]
