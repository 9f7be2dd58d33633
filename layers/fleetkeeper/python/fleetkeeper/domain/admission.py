"""Who may disrupt a worker: the one rule every disruption passes (docs/disruption.md, "Who may disrupt
a worker").

Actors only propose: scale-down, expiry, rollouts and their rollbacks, desired statuses, and whatever
comes later. `judge` decides, from the worker as read and the pool's state read once for many
candidates, and names what the admitting write must still find true (`Claim`), so the decision stays
exact however many cycles and shards decide at once:

- a voluntary disruption (a `DisruptionReason`) needs its pool ACTIVE, the worker RUNNING and not
  protected, no other owner, and room in the pool's budget for its reason in the window active now (the
  stage default where no pool budget applies), and, with a floor, that many serving workers of its scope
  left after it; scale-in's `underutilized` may also take a STOPPED worker asked neither to start nor
  to end (`spare_warm`), which holds no session and so needs no budget's room and no floor;
- an imposed one (an operator's command, what AWS does) skips all of that but the owner: it takes the
  worker over from any voluntary owner, so everyone else sees it.

Ownership lives on the worker (`models.Owner`), and `settled` says what a status change does to it:
entering a disrupting status always has a counted owner, and the disruption's end (the worker serves
again, or is gone) releases it. The store keeps each pool's count of counted owners exact in the same
transactions (store/disruption.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

from fleetkeeper.domain.disruption import (
    DISRUPTING,
    DisruptionReason,
    assess,
    blocked_until,
)
from fleetkeeper.domain.lifecycle import Cause, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Owner, Pool, Worker
from fleetkeeper.domain.scale_down import DisruptionBudget, protected_from_disruption


class Imposed(StrEnum):
    """Disruptions no budget holds back: they pass the door to take ownership, and skip the rest."""

    # An operator's drain, force, pool drain or desired status.
    OPERATOR = "operator"
    # EC2's two-minute spot interruption warning.
    SPOT = "spot"
    # EC2 stopped or terminated the machine outside fleetkeeper.
    EC2 = "ec2"
    # An EC2 scheduled event (retirement, stop, reboot, maintenance): AWS's date, not ours.
    SCHEDULED_EVENT = "scheduled_event"


Reason = DisruptionReason | Imposed


class WaitReason(StrEnum):
    """Why the door holds a voluntary disruption back: the words the pool's disruption view and a
    rollout's `blocked` use."""

    POOL_NOT_ACTIVE = "pool_not_active"
    NOT_RUNNING = "not_running"
    PROTECTED = "protected"
    OWNED = "owned"
    BUDGET = "budget"
    WINDOW = "window"
    MIN_WORKERS = "min_workers"
    # Too much of the pool is unhealthy at once for repairs (domain/repair.py).
    REPAIR_BRAKE = "repair_brake"


# An admission made before the write that starts its disruption (a surge waiting for its replacement,
# an expiry making its replacement) lapses this long after, if nothing started: the longest a Lambda
# runs, so the actor that took it is gone by then.
ADMISSION_LEASE: Final = timedelta(minutes=15)
# Statuses in which a worker keeps its owner; anything else (stopped, gone, failed) ends the ownership.
_KEEPS_OWNER: Final = DISRUPTING | {
    WorkerStatus.PENDING,
    WorkerStatus.PROVISIONING,
    WorkerStatus.STARTING,
    WorkerStatus.RUNNING,
}


@dataclass(frozen=True)
class Ask:
    """A disruption of one worker at the door.

    `rollout_id`: the rollout asking (its ownership lasts while it is active). `floor`: the serving
    workers of the worker's scope (template and pool) that must remain (scale-down's minimum). `ahead`:
    admitted now, started by a later write (the owner gets a lease unless a rollout's). `hold`: no
    disruption, only a claim that nobody else may disrupt the worker (a rollout's scope, ahead of its
    waves): it needs only that no one else holds it, and counts in no budget.
    """

    reason: Reason
    actor: str
    rollout_id: str | None = None
    floor: int | None = None
    ahead: bool = False
    hold: bool = False

    @property
    def voluntary(self) -> bool:
        return isinstance(self.reason, DisruptionReason)


@dataclass(frozen=True)
class PoolState:
    """What the door decides from, read once and shared by every candidate of a step: the pool (None
    without one), its counted owners in all and per template, its members (RUNNING and disrupting
    workers) in all and per template, and the fleet's counted owners and size for the stage default."""

    at: datetime
    pool: Pool | None
    in_use: int
    owned_by_template: Mapping[str, int]
    members: int
    members_by_template: Mapping[str, int]
    fleet_in_use: int
    fleet_size: int
    default: DisruptionBudget

    def admitted(self, template: str) -> PoolState:
        """This state with one more counted owner in `template`: what the next candidate sees."""
        owned = dict(self.owned_by_template)
        owned[template] = owned.get(template, 0) + 1
        return PoolState(
            at=self.at,
            pool=self.pool,
            in_use=self.in_use + 1,
            owned_by_template=owned,
            members=self.members,
            members_by_template=self.members_by_template,
            fleet_in_use=self.fleet_in_use + 1,
            fleet_size=self.fleet_size,
            default=self.default,
        )


@dataclass(frozen=True)
class Claim:
    """What the write that admits a disruption must still find, or it fails and the door decides again:
    the pool ACTIVE at the version read (its budgets unchanged), its counted owners below what the
    budget allows, the fleet's below the stage default, and the template's as read (the floor)."""

    pool: str | None
    pool_version: int | None = None
    pool_below: int | None = None
    fleet_below: int | None = None
    template: str | None = None
    template_owned: int | None = None


@dataclass(frozen=True)
class Admitted:
    """The owner to write and what its write must still find; `claim` None when nothing is checked (a
    hold, or an imposed disruption taking over its own worker)."""

    owner: Owner
    claim: Claim | None


@dataclass(frozen=True)
class Held:
    """A voluntary disruption the door holds back, and why."""

    why: WaitReason
    detail: str
    budget: int | None = None
    allowed: int | None = None
    in_use: int | None = None
    until: datetime | None = None


def counted(owner: Owner | None) -> bool:
    return owner is not None and owner.counted


def holds(owner: Owner, status: WorkerStatus, now: datetime, active: Callable[[str], bool]) -> bool:
    """Whether `owner` still holds a worker in `status`: a disruption under way holds it until the status
    ends; a rollout's ownership lasts while the rollout is active; an admission ahead of its start until
    its lease lapses."""
    if status in DISRUPTING:
        return True
    if owner.rollout_id is not None:
        return active(owner.rollout_id)
    return owner.until is not None and now < owner.until


def same_owner(owner: Owner, ask: Ask) -> bool:
    return owner.reason == str(ask.reason) and owner.actor == ask.actor and owner.rollout_id == ask.rollout_id


def unsettled(worker: Worker, now: datetime, active: Callable[[str], bool]) -> tuple[bool, Owner | None]:
    """Whether the worker's owner is not what it should be, and what it should be (None: released). A
    counted owner whose disruption never started (its lease lapsed, its rollout ended) holds nothing and
    no place in the budgets: released, or, a rollout's, kept uncounted as the trace of the rollout that
    last held the worker (`auto_rollout` reads it). A worker being disrupted with no counted owner
    (written by an earlier release) is adopted, so the budgets count it."""
    owner = worker.owner
    if worker.status in DISRUPTING:
        if counted(owner):
            return False, owner
        return True, Owner(reason=str(Imposed.OPERATOR), actor="adopted", since=now)
    if (
        owner is not None
        and owner.counted
        and (worker.status not in _KEEPS_OWNER or not holds(owner, worker.status, now, active))
    ):
        kept = worker.status in _KEEPS_OWNER and owner.rollout_id is not None
        return True, owner.model_copy(update={"counted": False}) if kept else None
    return False, owner


def settled(
    before: Worker, target: WorkerStatus, wanted: Owner | None, *, cause: Cause, actor: str, now: datetime
) -> Owner | None:
    """The owner a worker has after moving from `before` to `target`, the writer asking for `wanted`.

    A disrupting status always has a counted owner: one the writer did not name (EC2 stopped the
    machine, a path that started a disruption without the door) is recorded as imposed. A disruption
    that ends releases its owner: the worker serves again (a cancelled drain) or is stopped or gone.
    """
    if target not in _KEEPS_OWNER:
        return None
    if target in DISRUPTING:
        if counted(wanted):
            return wanted
        reason = Imposed.EC2 if cause == Cause.EC2 else Imposed.OPERATOR
        return Owner(reason=str(reason), actor=actor, since=now)
    if before.status in DISRUPTING and target == WorkerStatus.RUNNING:
        return None
    return wanted


def spare_warm(worker: Worker, reason: Reason) -> bool:
    """Whether scale-in (`underutilized`) asks for a STOPPED worker nobody asked to start or end: a
    warm worker beyond its pool's warm target, which holds no session."""
    return (
        reason is DisruptionReason.UNDERUTILIZED
        and worker.status == WorkerStatus.STOPPED
        and worker.desired_status in (None, WorkerStatus.STOPPED)
    )


def judge(
    ask: Ask, worker: Worker, state: PoolState, now: datetime, *, active: Callable[[str], bool]
) -> Admitted | Held:
    """The door's one rule for one worker: admitted with the owner to write and what the write must
    still find, or held back with why. An imposed disruption is never held back here: whether its
    worker can be drained at all is its own command's rule."""
    current = worker.owner
    holder = current if current is not None and holds(current, worker.status, now, active) else None
    mine = holder is not None and same_owner(holder, ask)
    if holder is not None and mine and (ask.hold or not ask.voluntary):
        return Admitted(holder, None)
    owner = Owner(
        reason=str(ask.reason),
        actor=ask.actor,
        since=now,
        counted=not ask.hold,
        rollout_id=ask.rollout_id,
        until=now + ADMISSION_LEASE if ask.ahead and ask.rollout_id is None else None,
    )
    reason = ask.reason
    if not isinstance(reason, DisruptionReason):
        return Admitted(owner, Claim(worker.pool))
    taken = (
        None
        if holder is None or mine
        else Held(WaitReason.OWNED, f"worker {worker.id} is held by {holder.actor} ({holder.reason})")
    )
    if ask.hold:
        return taken or Admitted(owner, None)
    pool = state.pool
    if pool is not None and pool.status != PoolStatus.ACTIVE:
        return Held(WaitReason.POOL_NOT_ACTIVE, f"pool {pool.name} is {pool.status}")
    spare = spare_warm(worker, reason)
    if worker.status != WorkerStatus.RUNNING and not spare:
        return Held(WaitReason.NOT_RUNNING, f"worker {worker.id} is {worker.status}")
    if protected_from_disruption(worker, now):
        why = "do_not_disrupt is set" if worker.do_not_disrupt else "do_not_disrupt_until is in the future"
        return Held(WaitReason.PROTECTED, f"worker {worker.id}: {why}")
    if taken is not None:
        return taken
    if spare:
        # No session to disrupt, so no budget's place and no floor of serving workers: only the pool
        # still ACTIVE at the version read rides on the write (docs/capacity.md, "Scale-in").
        return Admitted(owner, _unchanged(worker, pool))
    if holder is not None and mine and holder.counted:
        # Admitted ahead: it starts now if the pool and the worker still allow a disruption at all (the
        # checks above); its place in the budgets is taken already.
        return Admitted(holder, _unchanged(worker, pool))
    # A worker counted already (an owner whose admission lapsed) keeps its place in the budgets: the
    # write moves it to the new owner without counting it twice.
    occupies = 1 if counted(current) else 0
    budget = _budget(reason, state, occupies)
    if isinstance(budget, Held):
        return budget
    pool_below, fleet_below = budget
    template_owned = None
    if ask.floor is not None:
        template_owned = state.owned_by_template.get(worker.template, 0)
        serving = state.members_by_template.get(worker.template, 0) - template_owned
        if serving - 1 + occupies < ask.floor:
            return Held(
                WaitReason.MIN_WORKERS,
                f"{serving} serving in {worker.template}#{worker.pool or '-'}, minimum {ask.floor}",
            )
    return Admitted(
        owner,
        Claim(
            worker.pool,
            pool_version=_unchanged(worker, pool).pool_version,
            pool_below=pool_below,
            fleet_below=fleet_below,
            template=worker.template if template_owned is not None else None,
            template_owned=template_owned,
        ),
    )


def _unchanged(worker: Worker, pool: Pool | None) -> Claim:
    """A claim that only checks the pool is still ACTIVE at the version this decision read."""
    return Claim(worker.pool, pool_version=pool.version if pool is not None else None)


def _budget(
    reason: DisruptionReason, state: PoolState, occupies: int
) -> Held | tuple[int | None, int | None]:
    """The pool's budget for `reason` now, else the stage default: held back when it has no room, else
    the bound the write's condition carries (pool's, fleet's)."""
    pool = state.pool
    if pool is not None and pool.disruption.budgets:
        in_use = state.in_use - occupies
        found = assess(pool.disruption, reason, state.at, members=state.members, in_use=in_use)
        if found.allowed is not None:
            if found.admits:
                return found.allowed, None
            until = blocked_until(pool.disruption, reason, state.at, members=state.members, in_use=in_use)
            detail = f"pool {pool.name} budget {found.limiting} allows {found.allowed}, {in_use} in use"
            if until is not None:
                detail += f", until {until.isoformat()}"
            return Held(
                WaitReason.WINDOW if until is not None else WaitReason.BUDGET,
                detail,
                budget=found.limiting,
                allowed=found.allowed,
                in_use=in_use,
                until=until,
            )
    allowed = state.default.allowed(state.fleet_size)
    in_use = state.fleet_in_use - occupies
    if in_use >= allowed:
        return Held(
            WaitReason.BUDGET,
            f"the stage default MAX_CONCURRENT_DRAINS allows {allowed}, {in_use} in use fleet-wide",
            allowed=allowed,
            in_use=in_use,
        )
    return None, allowed
