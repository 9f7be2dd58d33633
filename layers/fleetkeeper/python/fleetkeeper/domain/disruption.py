"""Disruption budgets of a pool: how many of its workers voluntary disruptions may take at once, and when.

A budget is `{"max": 2 | "10%", "reasons": [...], "schedule": "0 9 * * mon-fri", "duration": "8h",
"timezone": "Europe/Berlin"}`. docs/disruption.md is the operator's account; the rules are:

- Without a schedule a budget always applies. With one, it applies in the windows of domain/windows.py:
  for `duration` (elapsed time) after each start of the cron schedule on the local clock of `timezone`
  (UTC by default), half-open (a window that starts at 09:00 for 8h applies at 09:00 and no longer at
  17:00); overlapping windows make one. That module says how starts fall where the clock jumps.
- `reasons` (all of them when left out) say which voluntary disruptions a budget holds back. What a budget
  counts is every worker of the pool being disrupted at once, whatever the cause: a worker drained by
  an operator, interrupted by EC2 or stopped by scale-down is one fewer that voluntary disruptions may
  take. The most restrictive budget that applies to a reason wins; `max: 0` in a window is a freeze.
- A percentage is of the pool's members (RUNNING workers and those being disrupted), rounded up, like
  Karpenter's budgets and the stage's MAX_CONCURRENT_DRAINS: 10% of 3 workers is 1, 0% is 0.
- When none of a pool's budgets applies to a reason at an instant (a pool without budgets, or outside
  every window that names the reason), the stage default MAX_CONCURRENT_DRAINS bounds its drains
  fleet-wide, as it bounds every pool without budgets.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
)

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.schedules import ScheduledWindow
from fleetkeeper.domain.windows import HORIZON, Window


class DisruptionReason(StrEnum):
    """Why fleetkeeper itself would take a worker out of service (never an operator's own drain)."""

    ROLLOUT = "rollout"
    EXPIRED = "expired"
    SCALE_DOWN = "scale_down"
    DRIFT = "drift"
    # A sick worker replaced (domain/repair.py): failed status checks, no answer, its own report.
    REPAIR = "repair"
    # Capacity above what the pool's capacity policy wants (domain/scale_down.scale_in).
    UNDERUTILIZED = "underutilized"


ALL_REASONS: tuple[DisruptionReason, ...] = tuple(DisruptionReason)
# A pool item carries its budgets; this keeps it small (each budget is about 150 bytes).
MAX_BUDGETS = 20
MAX_BUDGET_COUNT = 100_000
# Workers being taken out of service: what a budget counts as in use.
DISRUPTING = frozenset({WorkerStatus.DRAINING, WorkerStatus.STOPPING, WorkerStatus.TERMINATING})
# A pool's members, the base of a percentage: in service, or on their way out of it.
MEMBERS = DISRUPTING | {WorkerStatus.RUNNING}
# A disruption whose worker shows one of these is over: it no longer holds a place in a budget.
DISRUPTED = frozenset({WorkerStatus.STOPPED, WorkerStatus.TERMINATED})
# How many changes of the applying budgets `blocked_until` looks through.
_MAX_CHANGES = 64

# `max` written as text: a count ("2") or a percentage ("10%"), in ASCII digits (Python's \d and int()
# also read "٣" as 3), within the ranges the integer form has: the pattern states the whole rule, so the
# contract publishes exactly what is accepted.
BUDGET_MAX_PATTERN = r"^0*([0-9]{1,5}|100000|([0-9]{1,2}|100)%)$"
_BUDGET_MAX_TEXT = re.compile(BUDGET_MAX_PATTERN)
_BUDGET_MAX_HINT = f'a count from 0 to {MAX_BUDGET_COUNT:,} such as 2, or a percentage from "0%" to "100%"'


def _budget_max(value: Any) -> Any:
    """A count (2, or "2") or a percentage ("10%"); a count is held as an int, a percentage as text. A
    count is a whole number (domain/values.py): 1.0 and `true` are refused."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BUDGET_COUNT:
        return value
    if isinstance(value, str) and _BUDGET_MAX_TEXT.fullmatch(value):
        digits = value.removesuffix("%").lstrip("0") or "0"
        return f"{digits}%" if value.endswith("%") else int(digits)
    raise ValueError(_BUDGET_MAX_HINT)


BudgetMax = Annotated[
    int | str,
    BeforeValidator(_budget_max),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": MAX_BUDGET_COUNT},
                {"type": "string", "pattern": BUDGET_MAX_PATTERN},
            ]
        }
    ),
]


class _Record(BaseModel):
    # domain/models.Record's rules; models.Pool holds a DisruptionPolicy, so this module cannot import it.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


class Budget(ScheduledWindow):
    """One budget of a pool (see the module's docstring); its window fields are ScheduledWindow's."""

    max: BudgetMax = Field(
        description=f'a count (0 to {MAX_BUDGET_COUNT:,}) or a percentage of the pool\'s members ("0%" to '
        '"100%", rounded up); a count may be written as text ("2")',
        examples=[2, "10%"],
    )
    reasons: list[DisruptionReason] | None = Field(
        default=None,
        min_length=1,
        max_length=len(ALL_REASONS),
        description="the voluntary disruptions it holds back; all of them when left out",
    )

    @field_validator("reasons")
    @classmethod
    def _distinct(cls, value: list[DisruptionReason] | None) -> list[DisruptionReason] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("names a reason twice")
        return value

    def covers(self, reason: DisruptionReason) -> bool:
        return self.reasons is None or reason in self.reasons

    def allowed(self, members: int) -> int:
        """How many of `members` may be disrupted at once under this budget."""
        if isinstance(self.max, int):
            return self.max
        percent = int(self.max.removesuffix("%"))
        return math.ceil(percent * members / 100)


class DisruptionPolicy(_Record):
    """A pool's disruption budgets (`PUT /api/v1/pools/{name}`, field `disruption`)."""

    budgets: list[Budget] = Field(default_factory=list, max_length=MAX_BUDGETS)


# ---- windows ---------------------------------------------------------------------------------------


def window_at(budget: Budget, at: datetime) -> Window:
    """The budget's window at `at` (domain/windows.py); a budget without a schedule always applies."""
    return budget.window_at(at)


# ---- assessing a pool ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BudgetState:
    """One budget of a pool at an instant: its window and what it allows the pool's members."""

    index: int
    budget: Budget
    window: Window
    allowed: int

    @property
    def active(self) -> bool:
        return self.window.active

    @property
    def change(self) -> datetime | None:
        """When this budget next starts or stops applying."""
        return self.window.until if self.window.active else self.window.next_start


def budget_states(policy: DisruptionPolicy, at: datetime, members: int) -> list[BudgetState]:
    return [
        BudgetState(index, budget, window_at(budget, at), budget.allowed(members))
        for index, budget in enumerate(policy.budgets)
    ]


def next_change(states: Sequence[BudgetState]) -> datetime | None:
    """The next moment a budget of the pool starts or stops applying."""
    return min((s.change for s in states if s.change is not None), default=None)


@dataclass(frozen=True)
class Assessment:
    """What a pool's budgets say about one reason at one instant.

    `allowed` is the most restrictive applying budget's count and `limiting` its index; both are None
    when no budget of the pool applies to the reason (the stage default governs it then).
    """

    reason: DisruptionReason
    at: datetime
    members: int
    in_use: int
    budgets: tuple[BudgetState, ...]
    applying: tuple[int, ...]
    allowed: int | None
    limiting: int | None
    next_change: datetime | None

    @property
    def admits(self) -> bool:
        """Whether one more disruption of this reason fits."""
        return self.allowed is None or self.in_use < self.allowed

    @property
    def available(self) -> int | None:
        return None if self.allowed is None else max(self.allowed - self.in_use, 0)


def assess(
    policy: DisruptionPolicy, reason: DisruptionReason, at: datetime, *, members: int, in_use: int
) -> Assessment:
    """The pool's budgets for `reason` at `at`, with `members` workers of which `in_use` are being
    disrupted."""
    states = budget_states(policy, at, members)
    applying = [s for s in states if s.active and s.budget.covers(reason)]
    # The most restrictive wins; on a tie, the first listed.
    limiting = min(applying, key=lambda s: (s.allowed, s.index), default=None)
    return Assessment(
        reason=reason,
        at=at,
        members=members,
        in_use=in_use,
        budgets=tuple(states),
        applying=tuple(s.index for s in applying),
        allowed=limiting.allowed if limiting else None,
        limiting=limiting.index if limiting else None,
        next_change=next_change(states),
    )


def blocked_until(
    policy: DisruptionPolicy, reason: DisruptionReason, at: datetime, *, members: int, in_use: int
) -> datetime | None:
    """The first moment after `at` at which the pool's budgets would admit one more disruption of
    `reason` with as many in use as now; None when only disruptions in progress ending can free a place
    (no window change within a year, windows.HORIZON, lets one more through).

    Remembered per policy, reason, instant and counts: a rollout step asks once for each worker it
    may not drain, all at the step's one instant, and with windows that overlap one answer walks
    thousands of schedule matches."""
    return _blocked_until(policy.model_dump_json(), reason, at, members, in_use)


@lru_cache(maxsize=256)
def _blocked_until(
    policy_json: str, reason: DisruptionReason, at: datetime, members: int, in_use: int
) -> datetime | None:
    policy = DisruptionPolicy.model_validate_json(policy_json)
    states: Sequence[BudgetState] = budget_states(policy, at, members)
    for _ in range(_MAX_CHANGES):
        upcoming = next_change(states)
        if upcoming is None or upcoming - at > HORIZON:
            return None
        found = assess(policy, reason, upcoming, members=members, in_use=in_use)
        if found.admits:
            return upcoming
        states = found.budgets
    return None


def exceeded(policy: DisruptionPolicy, at: datetime, *, members: int, in_use: int) -> BudgetState | None:
    """The most restrictive budget applying at `at` (to any reason) that `in_use` disruptions go
    beyond; what an operator's drain, which no budget refuses, reports."""
    over = [s for s in budget_states(policy, at, members) if s.active and in_use > s.allowed]
    return min(over, key=lambda s: (s.allowed, s.index), default=None)


# ---- counting a pool -------------------------------------------------------------------------------


def pool_of_scope(scope: str) -> str | None:
    """The pool of a scale-down scope (`<template>#<pool>`, `-` for none; domain/scale_down.scope_of).
    Neither a template nor a pool name can hold `#`, and no pool is named `-`."""
    pool = scope.partition("#")[2]
    return None if pool in ("", "-") else pool


@dataclass(frozen=True)
class PoolLoad:
    """What a view shows of one pool: its members and how many of them are being disrupted."""

    members: int = 0
    disrupting: int = 0


def pool_loads(cells: Mapping[tuple[str, WorkerStatus], int]) -> dict[str, PoolLoad]:
    """Each pool's load from worker counts by (scope, status)."""
    members: dict[str, int] = {}
    disrupting: dict[str, int] = {}
    for (scope, status), count in cells.items():
        pool = pool_of_scope(scope)
        if pool is None:
            continue
        if status in MEMBERS:
            members[pool] = members.get(pool, 0) + count
        if status in DISRUPTING:
            disrupting[pool] = disrupting.get(pool, 0) + count
    return {pool: PoolLoad(members.get(pool, 0), disrupting.get(pool, 0)) for pool in members}


# ---- what waits on a pool's budgets ----------------------------------------------------------------

# A refusal is shown as waiting this long: the reconciler looks at an idle worker every cycle (a
# minute), so a worker still held back is refused again well within it.
WAITING_WINDOW = timedelta(minutes=10)
# At most this many refusals are kept per pool, the newest: the item stays small whatever the pool's size.
MAX_WAITING = 50


class Waiting(_Record):
    """A voluntary disruption the door held back: which worker, of which reason, why (the door's words,
    domain/admission.WaitReason), and, when a budget held it, which budget, what it allows, how many
    were in use and until when."""

    model_config = ConfigDict(extra="ignore")

    worker_id: str
    reason: DisruptionReason
    action: str
    # Entries stored before the door named its reasons were all held by a budget.
    why: str = Field(default="budget", description="why it waits: the door's reason, e.g. budget or owned")
    detail: str | None = Field(default=None, max_length=500)
    budget: int | None = Field(
        default=None, description="the budget's index in the pool's list; null: not a pool budget"
    )
    allowed: int | None = None
    in_use: int | None = None
    refused_at: datetime
    until: datetime | None = None


class WaitingList(_Record):
    model_config = ConfigDict(extra="ignore")

    version: int = Field(default=0, ge=0)
    entries: list[Waiting] = Field(default_factory=list)


def still_waiting(entries: Iterable[Waiting], now: datetime) -> list[Waiting]:
    """The refusals recent enough to show, newest first."""
    recent = [e for e in entries if now - e.refused_at <= WAITING_WINDOW]
    return sorted(recent, key=lambda e: e.refused_at, reverse=True)


def with_refusals(current: Sequence[Waiting], refusals: Sequence[Waiting], now: datetime) -> list[Waiting]:
    """`current` with `refusals` added: a worker's newest refusal replaces its older one; stale ones
    and those beyond MAX_WAITING (the oldest) are dropped."""
    newest: dict[str, Waiting] = {}
    for entry in [*current, *refusals]:
        kept = newest.get(entry.worker_id)
        if kept is None or entry.refused_at >= kept.refused_at:
            newest[entry.worker_id] = entry
    return still_waiting(newest.values(), now)[:MAX_WAITING]
