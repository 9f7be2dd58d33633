"""A pool's capacity policy and the target it sets (docs/capacity.md).

The policy says what scale-out brings up (`template`), how many workers to keep RUNNING at least
(`min_workers`), how many free slots to keep on RUNNING workers (`headroom_slots`), how many STOPPED
workers to keep ready to start (`warm_workers`), schedules that raise those inside cron windows (the
windows of disruption budgets: domain/schedules.py), and a hard cap on the pool's workers
(`max_workers`: every worker of the pool that is not TERMINATED or FAILED counts, store/members.py).

`capacity_target` is the pure rule: the RUNNING workers wanted now and the rule that wants the most,
capped by `max_workers`. Scale-out (services/reconcile/capacity.py) brings the pool up to it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Annotated, Final

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.schedules import ScheduledWindow
from fleetkeeper.domain.values import WholeNumber

# The largest pool a policy may ask for: the fleet's own design ceiling.
MAX_POOL_WORKERS: Final = 10_000
# Slots are workers times their capacity (at most 10,000 each); a million is far beyond any lab.
MAX_HEADROOM_SLOTS: Final = 1_000_000
# A pool item carries its schedules, as it carries its budgets; this keeps it small.
MAX_CAPACITY_SCHEDULES: Final = 20

Workers = Annotated[WholeNumber, Field(ge=0, le=MAX_POOL_WORKERS)]
Slots = Annotated[WholeNumber, Field(ge=0, le=MAX_HEADROOM_SLOTS)]


class _Record(BaseModel):
    # domain/models.Record's rules; models.Pool holds a CapacityPolicy, so this module cannot import it.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


_NEEDS_TEMPLATE: Final = "needs a template: what scale-out brings up"


def _without_template(info: ValidationInfo) -> bool:
    # A template that failed its own check is absent from info.data: that field's error says enough.
    return "template" in info.data and info.data["template"] is None


class CapacitySchedule(ScheduledWindow):
    """Targets raised inside the windows of a schedule (the same windows as a disruption budget's)."""

    schedule: str = Field(
        max_length=200,
        description="a five-field cron expression (minute hour day month weekday) when windows start",
        examples=["0 8 * * mon-fri"],
    )
    min_workers: Workers | None = Field(default=None, description="RUNNING workers kept at least in a window")
    headroom_slots: Slots | None = Field(default=None, description="free slots kept in a window")
    # Checked even when left out, so that a schedule raising nothing says so.
    warm_workers: Workers | None = Field(
        default=None, validate_default=True, description="STOPPED workers kept in a window"
    )

    @field_validator("warm_workers")
    @classmethod
    def _raises_something(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is None and info.data.get("min_workers") is None and info.data.get("headroom_slots") is None:
            raise ValueError("a schedule raises min_workers, headroom_slots or warm_workers; it names none")
        return value


class CapacityPolicy(_Record):
    """A pool's capacity policy (`PUT /api/v1/pools/{name}`, field `capacity`)."""

    template: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] | None = Field(
        default=None, description="the template scale-out brings up; required once any target is set"
    )
    min_workers: Workers = Field(default=0, description="RUNNING workers kept at least")
    # Checked even when left out: a policy that launches must bound itself.
    max_workers: Workers | None = Field(
        default=None,
        validate_default=True,
        description="hard cap on the pool's workers (RUNNING, starting, warm or launching); required with "
        "a template",
    )
    headroom_slots: Slots = Field(default=0, description="free slots kept on RUNNING workers")
    warm_workers: Workers = Field(default=0, description="STOPPED workers kept, started before any launch")
    schedules: list[CapacitySchedule] = Field(
        default_factory=list,
        max_length=MAX_CAPACITY_SCHEDULES,
        description="raise the targets inside cron windows (the rules of disruption budgets' windows)",
    )
    bookings: bool = Field(default=False, description="future placements that find no room wait for capacity")

    @field_validator("min_workers", "headroom_slots", "warm_workers")
    @classmethod
    def _target(cls, value: int, info: ValidationInfo) -> int:
        if value and _without_template(info):
            raise ValueError(_NEEDS_TEMPLATE)
        return value

    @field_validator("max_workers")
    @classmethod
    def _cap(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is None:
            if info.data.get("template") is not None:
                raise ValueError("required with a template: the hard cap on the pool's workers")
            return None
        floor = info.data.get("min_workers")
        if floor is not None and value < floor:
            raise ValueError(f"below min_workers ({floor})")
        return value

    @field_validator("warm_workers")
    @classmethod
    def _warm_fits(cls, value: int, info: ValidationInfo) -> int:
        cap = info.data.get("max_workers")
        if cap is not None and value > cap:
            raise ValueError(f"above max_workers ({cap}): warm workers count against it")
        return value

    @field_validator("schedules")
    @classmethod
    def _schedules(cls, value: list[CapacitySchedule], info: ValidationInfo) -> list[CapacitySchedule]:
        if value and _without_template(info):
            raise ValueError(_NEEDS_TEMPLATE)
        cap = info.data.get("max_workers")
        for n, schedule in enumerate(value):
            for name in ("min_workers", "warm_workers"):
                raised = getattr(schedule, name)
                if cap is not None and raised is not None and raised > cap:
                    raise ValueError(f"schedule {n}: {name} {raised} is above max_workers ({cap})")
        return value

    @field_validator("bookings")
    @classmethod
    def _bookings(cls, value: bool, info: ValidationInfo) -> bool:
        if value and _without_template(info):
            raise ValueError(_NEEDS_TEMPLATE)
        return value

    @property
    def active(self) -> bool:
        """Whether it asks scale-out for anything."""
        return self.template is not None


def problems(policy: CapacityPolicy, slots_per_worker: int) -> list[tuple[str, str]]:
    """What the policy asks that its template's workers cannot hold: (field, reason) pairs."""
    if policy.max_workers is None:
        return []
    room = policy.max_workers * slots_per_worker
    found: list[tuple[str, str]] = []
    asked = [("capacity.headroom_slots", policy.headroom_slots)] + [
        (f"capacity.schedules.{n}.headroom_slots", s.headroom_slots or 0)
        for n, s in enumerate(policy.schedules)
    ]
    for field, slots in asked:
        if slots > room:
            found.append(
                (
                    field,
                    f"{slots} free slots cannot be held by max_workers {policy.max_workers} x "
                    f"{slots_per_worker} slots of template '{policy.template}' ({room})",
                )
            )
    return found


class Rule(StrEnum):
    """What sets a pool's target."""

    MIN_WORKERS = "min_workers"
    HEADROOM = "headroom"
    SCHEDULE = "schedule"
    BOOKINGS = "bookings"


@dataclass(frozen=True)
class Target:
    """The RUNNING and warm workers a pool's policy wants at an instant, and why.

    `workers` is capped by `max_workers` (`capped` says the cap cut it, `wanted` is what the rule asked);
    `warm` by what the cap leaves beside `workers`. `schedule` is the index of the schedule that sets it
    when `rule` is `schedule`; `schedules` the indexes of every schedule whose window applies now;
    `bookings` how many bookings are due (domain/bookings.py)."""

    workers: int
    warm: int
    rule: Rule
    wanted: int
    capped: bool
    schedule: int | None = None
    schedules: tuple[int, ...] = ()
    headroom_slots: int = 0
    # RUNNING workers the count rules alone keep (min_workers, the active schedules'), capped: what
    # scale-in never goes below, whatever the free slots.
    floor: int = 0
    bookings: int = 0


def _for_slots(slots: int, *, running: int, free_slots: int, slots_per_worker: int) -> int:
    """RUNNING workers needed so that `slots` stay free: those running, and enough new ones for the rest."""
    if slots <= 0:
        return 0
    return running + math.ceil(max(slots - free_slots, 0) / slots_per_worker)


def capacity_target(
    policy: CapacityPolicy,
    at: datetime,
    *,
    running: int,
    free_slots: int,
    slots_per_worker: int,
    bookings: int = 0,
) -> Target:
    """The pool's target at `at`: the largest of `min_workers`, the headroom, the schedules whose
    window applies and the slots `bookings` need, capped by `max_workers`; on a tie the rule named first
    in that order sets it. `running` workers have `free_slots` between them; a new one brings
    `slots_per_worker`."""
    per_worker = max(slots_per_worker, 1)

    def for_slots(slots: int) -> int:
        return _for_slots(slots, running=running, free_slots=free_slots, slots_per_worker=per_worker)

    active = tuple(n for n, s in enumerate(policy.schedules) if s.window_at(at).active)
    candidates: list[tuple[int, Rule, int | None]] = [
        (policy.min_workers, Rule.MIN_WORKERS, None),
        (for_slots(policy.headroom_slots), Rule.HEADROOM, None),
    ]
    warm = policy.warm_workers
    headroom = policy.headroom_slots
    floor = policy.min_workers
    for n in active:
        schedule = policy.schedules[n]
        floor = max(floor, schedule.min_workers or 0)
        raised = max(schedule.min_workers or 0, for_slots(schedule.headroom_slots or 0))
        candidates.append((raised, Rule.SCHEDULE, n))
        warm = max(warm, schedule.warm_workers or 0)
        headroom = max(headroom, schedule.headroom_slots or 0)
    candidates.append((for_slots(bookings), Rule.BOOKINGS, None))
    wanted, rule, schedule_index = max(candidates, key=lambda c: c[0])  # max keeps the first of equals
    cap = policy.max_workers if policy.max_workers is not None else MAX_POOL_WORKERS
    workers = min(wanted, cap)
    return Target(
        workers=workers,
        warm=min(warm, cap - workers),
        rule=rule,
        wanted=wanted,
        capped=wanted > cap,
        schedule=schedule_index,
        schedules=active,
        headroom_slots=headroom,
        floor=min(floor, cap),
        bookings=bookings,
    )


@dataclass(frozen=True)
class Shortfall:
    """What scale-out does for a target: warm workers to start, and workers to create, of which `warm`
    are to be stopped once RUNNING (they refill the warm set)."""

    start: int
    create: int
    warm: int


def warm_short(target: Target, *, stopped: int, stopping: int, refilling: int) -> int:
    """How many workers the warm set lacks: its target less the STOPPED workers staying so, those
    stopping and those launching to refill it."""
    return max(target.warm - stopped - stopping - refilling, 0)


def shortfall(
    target: Target, *, running: int, launching: int, refilling: int, stopping: int, stopped: int
) -> Shortfall:
    """Workers to bring up towards `target`, the RUNNING ones and the warm set each counted on their own:
    `launching` are being launched or started to run, `refilling` launched to refill the warm set (they
    stop once RUNNING). The RUNNING workers missing come from the STOPPED workers first, new ones are
    created for the rest, and for a warm set short of `target.warm` once those started have left it. A
    refill never stands in for a RUNNING worker (it would be started only after its launch and stop),
    nor a launch to run for a warm one. The cap holds at the write, not here."""
    missing = max(target.workers - running - launching, 0)
    start = min(missing, stopped)
    warm = warm_short(target, stopped=stopped - start, stopping=stopping, refilling=refilling)
    return Shortfall(start=start, create=missing - start + warm, warm=warm)


# ---- membership: what max_workers counts -----------------------------------------------------------

# A worker of a pool counts against its max_workers in every status but these: its machine is gone, or
# was never made (a FAILED worker's leftover machine is terminated by its own retirement).
NOT_MEMBERS: Final = frozenset({WorkerStatus.TERMINATED, WorkerStatus.FAILED})


def member_moves(
    before: tuple[str | None, WorkerStatus] | None, after: tuple[str | None, WorkerStatus]
) -> dict[str, int]:
    """How a write moves the pools' member counts: (pool, status) before it (None: a new worker) and
    after it; -1 on the pool it leaves, +1 on the pool it joins."""
    moves: dict[str, int] = {}
    if before is not None and before[0] is not None and before[1] not in NOT_MEMBERS:
        moves[before[0]] = moves.get(before[0], 0) - 1
    if after[0] is not None and after[1] not in NOT_MEMBERS:
        moves[after[0]] = moves.get(after[0], 0) + 1
    return {pool: delta for pool, delta in moves.items() if delta}


# ---- blocked: capacity EC2 will not give now -------------------------------------------------------


class BlockedReason(StrEnum):
    """Why scale-out waits for a pool (docs/capacity.md, "Blocked")."""

    INSUFFICIENT_CAPACITY = "insufficient_capacity"
    QUOTA = "quota"
    THROTTLED = "throttled"


# EC2 error codes that say capacity cannot be had now, and what each means: retrying at once only
# repeats the refusal (and, throttled, makes it worse).
_BLOCKING: Final = {
    "InsufficientInstanceCapacity": BlockedReason.INSUFFICIENT_CAPACITY,
    "InsufficientHostCapacity": BlockedReason.INSUFFICIENT_CAPACITY,
    "InsufficientCapacity": BlockedReason.INSUFFICIENT_CAPACITY,
    "InstanceLimitExceeded": BlockedReason.QUOTA,
    "VcpuLimitExceeded": BlockedReason.QUOTA,
    "MaxSpotInstanceCountExceeded": BlockedReason.QUOTA,
    "RequestLimitExceeded": BlockedReason.THROTTLED,
    "Throttling": BlockedReason.THROTTLED,
    "ThrottlingException": BlockedReason.THROTTLED,
}
# The first backoff is about a cycle; each refusal in a row doubles it, up to half an hour.
BLOCKED_BACKOFF: Final = timedelta(minutes=1)
MAX_BLOCKED_BACKOFF: Final = timedelta(minutes=30)


def blocked_reason(aws_error: str | None) -> BlockedReason | None:
    """The reason an EC2 error code blocks scale-out, None for an error that does not."""
    return _BLOCKING.get(aws_error or "")


class Blocked(_Record):
    """Scale-out of a pool waits: EC2 refused a launch for want of capacity, a quota or its rate."""

    reason: BlockedReason
    aws_error: str = Field(max_length=128)
    message: str | None = Field(default=None, max_length=500)
    since: AwareDatetime
    retry_at: AwareDatetime
    refusals: int = Field(default=1, ge=1)


def blocked_after(
    current: Blocked | None, aws_error: str, message: str | None, now: datetime
) -> Blocked | None:
    """The pool's `blocked` after EC2 refused a launch with `aws_error` at `now`; `current` itself while
    its backoff still runs (several launches refused in one cycle are one refusal), None when the error
    blocks nothing."""
    reason = blocked_reason(aws_error)
    if reason is None:
        return current
    if current is not None and now < current.retry_at:
        return current
    refusals = 1 if current is None else current.refusals + 1
    wait = min(BLOCKED_BACKOFF * 2 ** (refusals - 1), MAX_BLOCKED_BACKOFF)
    return Blocked(
        reason=reason,
        aws_error=aws_error,
        message=(message or "")[:500] or None,
        since=current.since if current is not None else now,
        retry_at=now + wait,
        refusals=refusals,
    )


class LastCycle(_Record):
    """What scale-out last did for a pool."""

    at: AwareDatetime
    target: int = Field(ge=0)
    warm_target: int = Field(ge=0)
    # None: no target was set (the pool is not active, or its template is gone; `note` says which).
    rule: Rule | None = None
    schedule: int | None = None
    started: int = Field(default=0, ge=0)
    created: int = Field(default=0, ge=0)
    # New workers the cap refused: the pool was full when the write came.
    refused_at_cap: int = Field(default=0, ge=0)
    note: str | None = Field(default=None, max_length=500)


class CapacityState(_Record):
    """A pool's scale-out state, kept apart from the pool item so that writing it every cycle never
    moves the pool's version (which disruption claims check)."""

    version: int = Field(default=0, ge=0)
    blocked: Blocked | None = None
    last_cycle: LastCycle | None = None
