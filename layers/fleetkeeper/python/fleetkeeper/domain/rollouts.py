"""Rollouts: replacing a scope of workers (a template, optionally in one pool, or a list of workers) wave
by wave, never more than `max_unavailable` of them out of placement at once (docs/rollouts.md).

Pure: the request, the plan (waves), the statuses and their transitions, the record the store keeps.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Sequence
from enum import StrEnum
from itertools import pairwise
from typing import Annotated, Any, Final, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.models import Name, UtcDatetime
from fleetkeeper.domain.values import MAX_REASON_LENGTH, Reason, WholeNumber

# The most workers one rollout covers. The scope's ids live in member page items beside the rollout's
# (store/rollouts.py), so its own item holds only counts and the current wave's progress; the lock of
# each worker is one conditional write, taken in transactions at the start.
MAX_ROLLOUT_WORKERS: Final = 10_000
# Rollouts stored before member pages kept the scope inline in their item, at most this many ids.
MAX_INLINE_WORKERS: Final = 1000
# The most workers one wave takes (a percentage resolves to at most this): the wave's progress is kept
# per worker in the rollout's item, and it must stay inside the item budget.
MAX_WAVE_WORKERS: Final = 500
# A bake or a checkpoint's wait longer than a week is a typo, not a policy.
MAX_WAIT_SECONDS: Final = 7 * 24 * 3600
MIN_DRAIN_TIMEOUT_SECONDS: Final = 60
MAX_DRAIN_TIMEOUT_SECONDS: Final = 7 * 24 * 3600
MAX_ID_LENGTH: Final = 64
# rollback_on_alarms: one DescribeAlarms call per step names them all (CloudWatch takes 100 a call).
MAX_ROLLBACK_ALARMS: Final = 10
MAX_ALARM_NAME_LENGTH: Final = 255
DEFAULT_MAX_UNAVAILABLE: Final = "10%"
PERCENT_PATTERN: Final = r"^([1-9][0-9]?|100)%$"
_PERCENT = re.compile(PERCENT_PATTERN)


class RolloutStrategy(StrEnum):
    # The replacement is created first; the old worker drains once its replacement is RUNNING.
    SURGE = "surge"
    # The old worker drains first; its replacement is created once the drain has finished.
    DRAIN_FIRST = "drain_first"


class RolloutStatus(StrEnum):
    RUNNING = "RUNNING"
    PAUSED = "PAUSED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    ROLLING_BACK = "ROLLING_BACK"
    ROLLED_BACK = "ROLLED_BACK"


# Every move a rollout's status may make; anything else is an IllegalTransition (409 at the API).
TRANSITIONS: Final[dict[RolloutStatus, frozenset[RolloutStatus]]] = {
    RolloutStatus.RUNNING: frozenset(
        {
            RolloutStatus.PAUSED,
            RolloutStatus.SUCCEEDED,
            RolloutStatus.FAILED,
            RolloutStatus.CANCELLED,
            RolloutStatus.ROLLING_BACK,
        }
    ),
    RolloutStatus.PAUSED: frozenset(
        {RolloutStatus.RUNNING, RolloutStatus.CANCELLED, RolloutStatus.ROLLING_BACK}
    ),
    # A rollback an operator cancels starts nothing more; what it started goes on by itself. Without this
    # a rollback a budget or a launch keeps waiting would hold its workers' locks for good.
    RolloutStatus.ROLLING_BACK: frozenset(
        {RolloutStatus.ROLLED_BACK, RolloutStatus.FAILED, RolloutStatus.CANCELLED}
    ),
    # A finished rollout can still be rolled back: a bad image is often found once it is everywhere.
    RolloutStatus.SUCCEEDED: frozenset({RolloutStatus.ROLLING_BACK}),
    RolloutStatus.FAILED: frozenset({RolloutStatus.ROLLING_BACK}),
    RolloutStatus.CANCELLED: frozenset({RolloutStatus.ROLLING_BACK}),
    RolloutStatus.ROLLED_BACK: frozenset(),
}
ACTIVE: Final = frozenset({RolloutStatus.RUNNING, RolloutStatus.PAUSED, RolloutStatus.ROLLING_BACK})
# Nothing advances these by itself; their locks may be taken over by another rollout.
FINISHED: Final = frozenset(RolloutStatus) - ACTIVE
# Where a rollback may start from.
ROLLBACK_FROM: Final = frozenset(s for s, moves in TRANSITIONS.items() if RolloutStatus.ROLLING_BACK in moves)


class RolloutCovered(Conflict):
    """An active rollout already covers what a new start asks for."""

    def __init__(
        self, holder: str, holder_status: str | None, what: str, worker_id: str | None = None
    ) -> None:
        super().__init__(
            "rollout",
            holder,
            holder_status,
            f"{what} is covered by rollout {holder}, which is {holder_status}; cancel it or wait for it "
            "to finish",
        )
        self.worker_id = worker_id

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "worker_id": self.worker_id}


def can_move(current: RolloutStatus, target: RolloutStatus) -> bool:
    return target in TRANSITIONS[current]


def check_move(rollout_id: str, current: RolloutStatus, target: RolloutStatus) -> None:
    """Raise Conflict (409, naming the current status) unless the table allows the move."""
    if not can_move(current, target):
        raise Conflict(
            "rollout",
            rollout_id,
            str(current),
            f"rollout {rollout_id} is {current}; it cannot move to {target}",
        )


def _one_error(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """One error naming the field, not one per member of the union."""
    try:
        return handler(value)
    except ValidationError as exc:
        raise ValueError(
            f'a count from 1 to {MAX_WAVE_WORKERS} such as 2, or a percentage from "1%" to "100%"'
        ) from exc


MaxUnavailable = Annotated[
    Annotated[WholeNumber, Field(ge=1, le=MAX_WAVE_WORKERS)] | Annotated[str, Field(pattern=PERCENT_PATTERN)],
    WrapValidator(_one_error),
    Field(
        description="how many of the scope's workers may be out of placement at once: a count "
        f"(1 to {MAX_WAVE_WORKERS}) or a percentage of the scope ('1%' to '100%', rounded down, at least 1, "
        f"at most {MAX_WAVE_WORKERS})",
        examples=[1, "25%"],
    ),
]
WaitSeconds = Annotated[WholeNumber, Field(ge=0, le=MAX_WAIT_SECONDS)]
AlarmName = Annotated[str, Field(min_length=1, max_length=MAX_ALARM_NAME_LENGTH)]
WorkerId = Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]


class RolloutRequest(BaseModel):
    """POST /api/v1/rollouts: what to replace and how fast."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "template": "lab-small",
                    "pool": "labs",
                    "max_unavailable": "25%",
                    "strategy": "surge",
                    "checkpoints": [50],
                    "checkpoint_delay_seconds": None,
                    "bake_seconds": 300,
                    "reason": "AMI 2026-11",
                }
            ]
        },
    )

    template: Name | None = Field(
        default=None,
        description="the template whose workers are replaced (required unless worker_ids names them); "
        "replacements are of this template",
    )
    pool: Name | None = Field(default=None, description="only the template's workers in this pool")
    worker_ids: (
        Annotated[
            list[WorkerId],
            Field(min_length=1, max_length=MAX_ROLLOUT_WORKERS, json_schema_extra={"uniqueItems": True}),
        ]
        | None
    ) = Field(
        default=None,
        description=f"these workers instead of a template's (at most {MAX_ROLLOUT_WORKERS}, each once); "
        "each replacement is of its worker's template and pool",
    )
    max_unavailable: MaxUnavailable = DEFAULT_MAX_UNAVAILABLE
    strategy: RolloutStrategy = RolloutStrategy.SURGE
    checkpoints: Annotated[
        list[Annotated[WholeNumber, Field(ge=1, le=99)]],
        Field(max_length=99, json_schema_extra={"uniqueItems": True}),
    ] = Field(
        default_factory=list,
        description="percentages of the scope replaced at which the rollout pauses (ascending, each once)",
    )
    checkpoint_delay_seconds: WaitSeconds | None = Field(
        default=None,
        description="how long a checkpoint waits before going on by itself; null waits for a resume",
    )
    bake_seconds: WaitSeconds = Field(
        default=0, description="how long a finished wave settles before the next"
    )
    drain_timeout_seconds: (
        Annotated[WholeNumber, Field(ge=MIN_DRAIN_TIMEOUT_SECONDS, le=MAX_DRAIN_TIMEOUT_SECONDS)] | None
    ) = Field(default=None, description="each drain's deadline; default: the template's")
    replace: Annotated[bool, Strict()] = Field(
        default=True, description="false drains the workers without creating replacements"
    )
    reason: Reason | None = None
    rollback_on_alarms: Annotated[
        list[AlarmName], Field(max_length=MAX_ROLLBACK_ALARMS, json_schema_extra={"uniqueItems": True})
    ] = Field(
        default_factory=list,
        description="CloudWatch alarms (names, in the stage's region) read each cycle while the rollout is "
        "RUNNING or PAUSED: any of them in ALARM starts its rollback",
    )
    dry_run: Annotated[bool, Strict()] = False

    @field_validator("rollback_on_alarms")
    @classmethod
    def _alarms_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("each alarm once")
        return value

    @field_validator("checkpoints")
    @classmethod
    def _ascending(cls, value: list[int]) -> list[int]:
        if any(b <= a for a, b in pairwise(value)):
            raise ValueError("checkpoints must be ascending, each percentage once")
        return value

    @field_validator("worker_ids")
    @classmethod
    def _unique(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise ValueError("each worker once")
        return value


def resolve_max_unavailable(spec: int | str, scope_size: int) -> int:
    """A count as it is; a percentage of the scope's size rounded down, at least 1; at most
    MAX_WAVE_WORKERS either way."""
    if isinstance(spec, int):
        return min(max(spec, 1), MAX_WAVE_WORKERS)
    match = _PERCENT.match(spec)
    if match is None:
        raise ValueError(f"'{spec}' is neither a count nor a percentage")
    return min(max(math.floor(int(match.group(1)) * scope_size / 100), 1), MAX_WAVE_WORKERS)


def plan_waves(worker_ids: Sequence[str], max_unavailable: int) -> list[list[str]]:
    """The waves a rollout replaces, in order: the workers sorted (so the plan is stable whatever order
    the index returned them in), cut into groups of at most `max_unavailable`."""
    if max_unavailable < 1:
        raise ValueError("max_unavailable must be at least 1")
    ordered = sorted(set(worker_ids))
    return [ordered[i : i + max_unavailable] for i in range(0, len(ordered), max_unavailable)]


def wave_bounds(total: int, max_unavailable: int, wave: int) -> tuple[int, int]:
    """Where wave `wave` of plan_waves over `total` sorted ids starts and stops (stop excluded): the plan
    is the sorted scope cut every `max_unavailable`, so a wave is read as a slice of it."""
    if max_unavailable < 1:
        raise ValueError("max_unavailable must be at least 1")
    start = min(wave * max_unavailable, total)
    return start, min(start + max_unavailable, total)


def wave_count(total: int, max_unavailable: int) -> int:
    """How many waves plan_waves cuts `total` workers into."""
    return -(-total // max_unavailable)


def replacement_id(rollout_id: str, worker_id: str) -> str:
    """The replacement's id, the same every time it is chosen: a step whose write was lost creates
    it again with this id and finds it there."""
    return "w-" + hashlib.sha256(f"{rollout_id}:{worker_id}".encode()).hexdigest()[:16]


# Workers a rollback may launch to restore one old worker, one after another when each fails to launch
# (across every rollback asked of the rollout); then the rollback fails and says which worker.
MAX_RESTORATION_ATTEMPTS: Final = 3


def restoration_id(rollout_id: str, worker_id: str, attempt: int = 0) -> str:
    """The id of the worker a rollback launches in place of `worker_id`'s replacement on its `attempt`-th
    try, derived like `replacement_id` so a rollback step whose write was lost finds it again."""
    key = f"{rollout_id}:rollback:{worker_id}" + (f":{attempt}" if attempt else "")
    return "w-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def rollback_scope(worker_ids: Sequence[str], max_unavailable: int, through_wave: int) -> list[str]:
    """The workers a rollback looks at: those of every wave the rollout reached (none later ever had a
    replacement), sorted. They are the sorted scope's first waves, so the rollback's own waves (this
    cut again every `max_unavailable`) are the rollout's waves 0..through_wave, read the same way."""
    waves = plan_waves(worker_ids, max_unavailable)
    return sorted(w for wave in waves[: through_wave + 1] for w in wave)


class RollbackAction(StrEnum):
    """What a rollback does for one worker of the scope."""

    # No live replacement and the old worker was not taken out: nothing to undo.
    NOTHING = "nothing"
    # The old worker still serves: its replacement is drained, nothing is launched.
    DRAIN = "drain"
    # The old worker was drained by the rollout: a worker with its image and instance type is launched,
    # then the replacement (if it still lives) is drained.
    RESTORE = "restore"


def rollback_action(
    *, old_drained_by_rollout: bool, replacement_serving: bool, replacement_taken_elsewhere: bool
) -> RollbackAction:
    """The old worker stays when the rollout never drained it (surge stopped before its drain): only its
    serving replacement goes. One the rollout drained is given back, as it was launched, in place of its
    replacement, or in its empty place (a replacement never created, failed to launch, or lost with its
    machine). A replacement someone else drained (an operator, its expiry) took its place's fate with
    it: a restored worker there would be one too many beside whatever replaced it since."""
    if replacement_serving:
        return RollbackAction.RESTORE if old_drained_by_rollout else RollbackAction.DRAIN
    if old_drained_by_rollout and not replacement_taken_elsewhere:
        return RollbackAction.RESTORE
    return RollbackAction.NOTHING


def percent_done(replaced: int, total: int) -> int:
    """The share of the scope replaced, in whole percent rounded down (100 only when all are)."""
    return 100 if total == 0 else replaced * 100 // total


def checkpoint_reached(
    checkpoints: Sequence[int], passed: Sequence[int], replaced: int, total: int
) -> int | None:
    """The highest checkpoint the rollout has reached and not yet passed, if any."""
    done = percent_done(replaced, total)
    reached = [c for c in checkpoints if c <= done and c not in passed]
    return max(reached) if reached else None


class WorkerPhase(StrEnum):
    """Where one worker of the current wave stands."""

    # In the wave, nothing started yet (drain_first: its drain waits for the disruption budgets).
    WAITING = "waiting"
    # surge: its replacement is created; its drain waits for the replacement to be RUNNING, then for
    # the disruption budgets.
    REPLACING = "replacing"
    # Its drain (then terminate) has started.
    DRAINING = "draining"
    # drain_first: drained; its replacement is created and not RUNNING yet.
    REPLACED_PENDING = "replaced_pending"
    DONE = "done"
    # It was gone or could not be drained: counted, not retried.
    SKIPPED = "skipped"


class WorkerProgress(BaseModel):
    model_config = ConfigDict(extra="ignore")

    phase: WorkerPhase
    replacement_id: str | None = None
    since: UtcDatetime


# Why a rollout is not progressing: the door's words where it held a worker back (budget, window,
# pool_not_active, protected: domain/admission.WaitReason), and the rollout's own.
BlockedReason = Literal[
    "budget",
    "window",
    "pool_not_active",
    "protected",
    "capacity",
    "launch_failed",
    "drain_waiting",
    "checkpoint",
    "paused",
    "alarms",
]


class Blocked(BaseModel):
    """Why a rollout is not progressing now."""

    reason: BlockedReason
    detail: str
    since: UtcDatetime


class Rollout(BaseModel):
    """The stored rollout: its request as resolved, and where it stands."""

    model_config = ConfigDict(extra="ignore")

    id: str
    version: int = Field(default=0, ge=0)
    status: RolloutStatus = RolloutStatus.RUNNING
    template: Name | None = None
    pool: Name | None = None
    # The scope's size; its sorted ids are in member pages of `member_page_size` ids each
    # (store/rollouts.py), and the waves are plan_waves(those ids, max_unavailable).
    total: int = Field(ge=0, le=MAX_ROLLOUT_WORKERS)
    member_page_size: int | None = Field(default=None, ge=1)
    # A rollout stored before member pages (member_page_size None) keeps its sorted scope here.
    worker_ids: list[str] = Field(default_factory=list, max_length=MAX_INLINE_WORKERS)
    max_unavailable: int = Field(ge=1)
    max_unavailable_requested: int | str
    strategy: RolloutStrategy
    checkpoints: list[int] = Field(default_factory=list)
    checkpoint_delay_seconds: int | None = None
    bake_seconds: int = 0
    drain_timeout_seconds: int | None = None
    replace: bool = True
    reason: str | None = None
    started_by: str
    created_at: UtcDatetime
    updated_at: UtcDatetime
    finished_at: UtcDatetime | None = None
    # How far into the sorted scope the engine has claimed the workers as their owner (a hold: nobody
    # else may disrupt them while the rollout is active); a step claims a few hundred ahead.
    claimed: int = Field(default=0, ge=0)
    # The wave in progress (an index into the plan), and its workers' progress.
    wave: int = Field(default=0, ge=0)
    progress: dict[str, WorkerProgress] = Field(default_factory=dict)
    replaced: int = Field(default=0, ge=0)
    skipped: int = Field(default=0, ge=0)
    # When the last wave finished (its bake counts from then), and the checkpoints passed.
    wave_done_at: UtcDatetime | None = None
    checkpoints_passed: list[int] = Field(default_factory=list)
    paused_at_checkpoint: int | None = None
    paused_at: UtcDatetime | None = None
    blocked: Blocked | None = None
    rollback_on_alarms: list[str] = Field(default_factory=list, max_length=MAX_ROLLBACK_ALARMS)
    # The rollback: the last wave it covers (None until one starts), its own wave and progress.
    rollback_through_wave: int | None = Field(default=None, ge=0)
    rollback_wave: int = Field(default=0, ge=0)
    rollback_progress: dict[str, WorkerProgress] = Field(default_factory=dict)
    rolled_back: int = Field(default=0, ge=0)
    rollback_skipped: int = Field(default=0, ge=0)
    rollback_started_at: UtcDatetime | None = None
    rollback_started_by: str | None = None
    rollback_reason: str | None = Field(default=None, max_length=MAX_REASON_LENGTH)

    @model_validator(mode="before")
    @classmethod
    def _inline_total(cls, data: Any) -> Any:
        # An item stored with its ids inline has no total: it is their count.
        if isinstance(data, dict) and "total" not in data and "worker_ids" in data:
            return {**data, "total": len(data["worker_ids"])}
        return data

    @property
    def wave_count(self) -> int:
        return wave_count(self.total, self.max_unavailable)

    def wave_bounds(self, wave: int) -> tuple[int, int]:
        """Where wave `wave` starts and stops in the sorted scope (stop excluded)."""
        return wave_bounds(self.total, self.max_unavailable, wave)

    def wave_size(self, wave: int) -> int:
        start, stop = self.wave_bounds(wave)
        return stop - start

    @property
    def rollback_total(self) -> int:
        """The workers of the waves the rollout reached: the rollback's scope."""
        if self.rollback_through_wave is None:
            return 0
        return self.wave_bounds(min(self.rollback_through_wave, max(self.wave_count - 1, 0)))[1]

    @property
    def rollback_wave_count(self) -> int:
        """The rollback's waves: the rollout's waves 0..rollback_through_wave (rollback_scope)."""
        return wave_count(self.rollback_total, self.max_unavailable)

    @property
    def in_progress(self) -> int:
        return sum(
            1 for p in self.progress.values() if p.phase not in (WorkerPhase.DONE, WorkerPhase.SKIPPED)
        )

    @property
    def remaining(self) -> int:
        return max(self.total - self.replaced - self.skipped - self.in_progress, 0)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def event_detail(rollout: Rollout, **extra: Any) -> dict[str, Any]:
    """What every rollout event on the audit bus carries."""
    return {
        "rollout_id": rollout.id,
        "status": str(rollout.status),
        "template": rollout.template,
        "pool": rollout.pool,
        "total": rollout.total,
        "replaced": rollout.replaced,
        **extra,
    }
