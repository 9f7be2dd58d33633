"""Domain records. Plain pydantic models: no AWS types, no I/O."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from fleetkeeper.domain.capacity import CapacityPolicy
from fleetkeeper.domain.disruption import DisruptionPolicy
from fleetkeeper.domain.lead_time import LeadKind
from fleetkeeper.domain.lifecycle import (
    ACTIVE_INSTANCE_STATES,
    InstanceState,
    PoolStatus,
    WorkerStatus,
)
from fleetkeeper.domain.repair import Health, RepairPolicy
from fleetkeeper.domain.values import WholeNumber

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# Worker operation names (domain/operations.py), e.g. register-license.
OPERATION_NAME_PATTERN = r"^[a-z][a-z0-9-]{0,63}$"
REGION_PATTERN = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$"
# An EC2 instance type: family, generation and options, a dot, the size (m5.xlarge, u-6tb1.metal).
INSTANCE_TYPE_PATTERN = r"^[a-z0-9]+[a-z0-9-]*\.[a-z0-9]+$"


def _as_utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:  # pydantic reports a ValueError as the field's mistake; this would be a 500
        raise ValueError("in UTC it falls outside the years 1 to 9999") from None


# Every datetime that enters the domain carries a timezone and is held in UTC: a naive one is refused
# with the field's name (comparing naive with aware raises TypeError deep inside the reconciler), an
# aware one in any zone is normalised to UTC. Stored records always carry an offset, so loading them
# passes through the same rule.
UtcDatetime = Annotated[AwareDatetime, AfterValidator(_as_utc)]

Name = Annotated[str, Field(pattern=NAME_PATTERN, description="letters, digits, '.', '_' or '-'; 1-64")]
Region = Annotated[str, Field(pattern=REGION_PATTERN, examples=["eu-west-1"])]

DEFAULT_DRAIN_TIMEOUT_HOURS = 4.0
# A drain shorter than a minute cannot let anything finish; it is a typo, not a policy.
MIN_DRAIN_TIMEOUT_HOURS = 1 / 60
DEFAULT_POOL_DRAIN_TIMEOUT_SECONDS = 300
# The largest capacity a template (and so a worker) may have: nothing stored grows with it but the
# worker's slot items, one small item per active instance, so at the ceiling every item of a worker
# stays under 100 KB and reading its active instances is a few query pages (docs/data-model.md).
MAX_WORKER_CAPACITY: Final = 10_000
_CAPACITY_DESCRIPTION: Final = f"instances a worker runs at once; 1 to {MAX_WORKER_CAPACITY:,}"
# A Standard execution lives at most one year. The longest drain leaves it 5 days to force and finish
# (and the watchdog room to restart it), so its deadline always fires inside a live execution.
MAX_DRAIN_TIMEOUT_SECONDS = 360 * 24 * 3600
# A worker older than its template's max_lifetime_hours is drifted (`expired`). A year is the ceiling: a
# longer lifetime is no policy, and the age it is compared with stays a small number of hours.
MAX_LIFETIME_HOURS: Final = 8760


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


class DrainThen(StrEnum):
    """What follows a worker drain."""

    STOP = "stop"
    TERMINATE = "terminate"


class PoolDrainThen(StrEnum):
    """What follows a pool drain: nothing, or a drain of each of its workers."""

    NONE = "none"
    STOP = "stop"
    TERMINATE = "terminate"


class DrainOutcome(StrEnum):
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    ERROR = "ERROR"
    CANCELLED = "CANCELLED"
    TIMED_OUT = "TIMED_OUT"


class DrainRecord(Record):
    """One drain of one worker; the worker keeps its latest drain."""

    generation: int = Field(ge=1)
    started_at: UtcDatetime
    deadline: UtcDatetime
    timeout_seconds: int = Field(gt=0, le=MAX_DRAIN_TIMEOUT_SECONDS)
    reason: str | None = Field(default=None, max_length=500)
    requested_by: str
    then: DrainThen = DrainThen.STOP
    execution_arn: str | None = None
    task_token: str | None = None
    outcome: DrainOutcome = DrainOutcome.RUNNING
    forced_instances: int = Field(default=0, ge=0)
    timed_out_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    cancelled_by: str | None = None
    cancel_reason: str | None = Field(default=None, max_length=500)
    error: str | None = None
    # How many times the watchdog started a new execution for this generation (execution lost).
    restarts: int = Field(default=0, ge=0)
    # Move the worker's SCHEDULED instances to other RUNNING workers of its pool and template
    # (docs/drains.md, "Rescheduling"); `moved_instances` counts the moves, written with each move.
    reschedule: bool = True
    moved_instances: int = Field(default=0, ge=0)
    # Set by Finish, in a conditional write, before it sends the first before-stop operation: from then
    # on the drain cannot be cancelled (the operations cannot be taken back), only finished.
    finishing_at: UtcDatetime | None = None
    # Moving the deadline of the running drain (docs/drains.md, "Moving the deadline"): how many times
    # it moved (bounded, each move costs the execution one re-check cycle of history), when it last
    # moved, and how many heartbeat re-checks the waits before that may have cost, so the waits after it
    # share what is left of the drain's re-check budget (domain/drain_policy.drain_heartbeat).
    deadline_moves: int = Field(default=0, ge=0)
    deadline_moved_at: UtcDatetime | None = None
    rechecks_spent: int = Field(default=0, ge=0)
    # An operator forced the drain now (POST .../drain/force): its deadline became that moment, and the
    # force step ends what still runs with reason `forced` rather than `drain_timeout`.
    forced_at: UtcDatetime | None = None
    forced_by: str | None = None
    force_reason: str | None = Field(default=None, max_length=500)


class DriftReason(StrEnum):
    """How a worker's machine differs from what its template asks for now."""

    IMAGE = "image"
    INSTANCE_TYPE = "instance_type"
    EXPIRED = "expired"


class DesiredLaunch(Record):
    """What the template would launch now: its newest image (None when unknown) and its instance type."""

    image_id: str | None = Field(default=None, max_length=64)
    instance_type: str = Field(max_length=64)


class Drift(Record):
    """A worker's drift: why, what it should run instead, and since when it has been drifted."""

    reasons: list[DriftReason] = Field(min_length=1, max_length=len(DriftReason))
    desired: DesiredLaunch
    since: UtcDatetime


class WorkerMetrics(Record):
    """The latest CloudWatch readings of a worker's machine, in percent; None when not reported."""

    cpu_utilization: float | None = None
    memory_utilization: float | None = None
    disk_utilization: float | None = None
    collected_at: UtcDatetime


DESIRED_STATUSES = frozenset({WorkerStatus.RUNNING, WorkerStatus.STOPPED, WorkerStatus.TERMINATED})


class Owner(Record):
    """Who is changing a worker now (docs/disruption.md, "Who may disrupt a worker"): set by the
    conditional write that starts the disruption, read by everyone else as one attribute.

    `counted`: a disruption in progress, which its pool's budgets count; False for a worker held but not
    disrupted (a rollout's replacement, which nothing else may disrupt while the rollout is active).
    `rollout_id`: a rollout's, valid while that rollout is active. `until`: admitted before the write
    that starts the disruption (a surge waiting for its replacement); lapses then if nothing started.
    """

    reason: str = Field(max_length=64)
    actor: str = Field(max_length=2048)
    since: UtcDatetime
    counted: bool = True
    rollout_id: str | None = Field(default=None, max_length=64)
    until: UtcDatetime | None = None


class WorkerSummary(Record):
    """What the worker indexes hold of a worker (store/schema.py): enough to filter a listing, count a
    fleet or rank placement candidates, never enough to decide about the worker itself."""

    id: str
    template: Name
    region: Region
    pool: Name | None = None
    status: WorkerStatus = WorkerStatus.PENDING
    capacity: int = Field(ge=1, le=MAX_WORKER_CAPACITY)
    active_instances: int = Field(default=0, ge=0)

    @property
    def free_slots(self) -> int:
        return max(self.capacity - self.active_instances, 0)


class Worker(WorkerSummary):
    desired_status: WorkerStatus | None = None
    ec2_instance_id: str | None = None
    private_ip: str | None = None
    public_ip: str | None = None
    drain: DrainRecord | None = None
    owner: Owner | None = None
    do_not_disrupt: bool = False
    # Protection that expires by itself: compared with the clock, never cleaned up.
    do_not_disrupt_until: UtcDatetime | None = None
    status_reason: str | None = None
    terminated_by: str | None = None
    terminated_reason: str | None = None
    version: int = Field(default=0, ge=0)
    created_at: UtcDatetime = Field(default_factory=utcnow)
    updated_at: UtcDatetime = Field(default_factory=utcnow)
    # ---- reconciler bookkeeping (services/reconcile.py); written only when one of them changes ----
    # The EC2 evidence last applied, so a late or replayed EC2 event never moves the worker backwards.
    ec2_state: str | None = None
    ec2_observed_at: UtcDatetime | None = None
    # RETRY backoff that survives invocations: skip the worker until next_reconcile_at.
    reconcile_attempts: int = Field(default=0, ge=0)
    next_reconcile_at: UtcDatetime | None = None
    last_reconcile_error: str | None = Field(default=None, max_length=500)
    # Set by the one reconciler that won the right to call RunInstances for this PENDING worker.
    launch_claimed_at: UtcDatetime | None = None
    # The ClientToken and image of the RunInstances the claim is for. A launch whose answer may have been
    # lost (a crash, a timeout, a 5xx) is repeated with both, so EC2 answers with the machine it started
    # rather than starting a second one, even if a newer image appeared meanwhile.
    launch_token: str | None = Field(default=None, max_length=64)
    launch_image_id: str | None = None
    # The call is a batch (the token is its id, tagged on its machines): the worker's machine is the one
    # whose AmiLaunchIndex is `launch_index`, of the `launch_count` the call asked for (its MaxCount).
    launch_index: int | None = Field(default=None, ge=0)
    launch_count: int | None = Field(default=None, ge=1)
    idle_since: UtcDatetime | None = None
    metrics: WorkerMetrics | None = None
    # What the machine reported about itself through the collect-system-info operation (JSON object).
    system_info: dict[str, Any] | None = None
    system_info_at: UtcDatetime | None = None
    # What the machine was launched with, written by the transition that records the launch (None on
    # workers launched before these were recorded: drift then says only what is known).
    image_id: str | None = Field(default=None, max_length=64)
    instance_type: str | None = Field(default=None, max_length=64)
    launched_at: UtcDatetime | None = None
    # While PROVISIONING or STARTING: what the worker is coming up from and since when, so the move to
    # RUNNING times the template's lead time (domain/lead_time.py); cleared by any other move.
    lead_kind: LeadKind | None = None
    lead_since: UtcDatetime | None = None
    # A pinned launch: the image and instance type to launch instead of the template's newest image and
    # its instance type (a rollback restores what a rollout replaced; docs/rollouts.md). Drift still
    # compares the machine with the template.
    pinned_image_id: str | None = Field(default=None, max_length=64)
    pinned_instance_type: str | None = Field(default=None, max_length=64)
    # How the machine differs from its template (domain/drift.py), as the reconciler last found it;
    # written only when it changes.
    drift: Drift | None = None
    # The machine's health as its signals last said (domain/repair.py); None: never found unhealthy.
    health: Health | None = None

    @field_validator("desired_status")
    @classmethod
    def _desired_is_a_goal(cls, value: WorkerStatus | None) -> WorkerStatus | None:
        if value is not None and value not in DESIRED_STATUSES:
            allowed = ", ".join(sorted(DESIRED_STATUSES))
            raise ValueError(f"must be one of {allowed}")
        return value

    @property
    def next_drain_generation(self) -> int:
        return (self.drain.generation if self.drain else 0) + 1


class TemplateSpec(Record):
    """What a template says about its workers; the API's PUT body is exactly this."""

    instance_type: str = Field(pattern=INSTANCE_TYPE_PATTERN, examples=["m5.xlarge"])
    ami_name_filter: str = Field(min_length=1, max_length=128)
    capacity: WholeNumber = Field(ge=1, le=MAX_WORKER_CAPACITY, description=_CAPACITY_DESCRIPTION)
    drain_timeout_hours: float = Field(
        default=DEFAULT_DRAIN_TIMEOUT_HOURS, ge=MIN_DRAIN_TIMEOUT_HOURS, le=MAX_DRAIN_TIMEOUT_SECONDS / 3600
    )
    # As stored: the API checks EC2's tag rules (TemplateRequest), and a launch checks them again, so a
    # template stored before a rule existed still loads, and fails only its own launches.
    tags: dict[str, str] = Field(default_factory=dict)
    # Cleanup operations (the stage's catalogue) run once a drain has emptied a worker, before it stops.
    before_stop: list[Annotated[str, Field(pattern=OPERATION_NAME_PATTERN)]] = Field(
        default_factory=list, max_length=5
    )
    # A worker older than this is drifted with reason `expired` (domain/drift.py); None: no limit.
    max_lifetime_hours: WholeNumber | None = Field(
        default=None,
        ge=1,
        le=MAX_LIFETIME_HOURS,
        description=f"hours a worker may live before it is reported expired; 1 to {MAX_LIFETIME_HOURS:,}",
    )
    # The reconciler starts a rollout by itself for RUNNING workers drifted by image or instance type.
    auto_rollout: bool = Field(
        default=False,
        description="start a rollout by itself when RUNNING workers drift by image or instance type",
    )


class WorkerTemplate(TemplateSpec):
    name: Name
    version: int = Field(default=0, ge=0)

    @property
    def drain_timeout_seconds(self) -> int:
        return round(self.drain_timeout_hours * 3600)


class Instance(Record):
    id: str
    worker_id: str
    template: Name | None = None
    pool: Name | None = None
    state: InstanceState = InstanceState.SCHEDULED
    retry_count: int = Field(default=0, ge=0)
    timeslot_start: UtcDatetime | None = None
    timeslot_end: UtcDatetime | None = None
    # A booking's: when it should be on a RUNNING worker, as promised when it was booked.
    expected_ready_by: UtcDatetime | None = None
    reason: str | None = None
    version: int = Field(default=0, ge=0)
    created_at: UtcDatetime = Field(default_factory=utcnow)
    updated_at: UtcDatetime = Field(default_factory=utcnow)

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_INSTANCE_STATES


class Pool(Record):
    name: Name
    status: PoolStatus = PoolStatus.ACTIVE
    description: str | None = Field(default=None, max_length=500)
    drain_started_at: UtcDatetime | None = None
    drain_timeout_seconds: int | None = Field(default=None, gt=0, le=MAX_DRAIN_TIMEOUT_SECONDS)
    drain_then: PoolDrainThen | None = None
    drain_generation: int = Field(default=0, ge=0)
    drain_outcome: DrainOutcome | None = None
    drain_requested_by: str | None = None
    drain_task_token: str | None = None
    drain_execution_arn: str | None = None
    drain_finished_at: UtcDatetime | None = None
    drain_cancelled_by: str | None = None
    drain_cancel_reason: str | None = Field(default=None, max_length=500)
    drain_restarts: int = Field(default=0, ge=0)
    # Budgets for voluntary disruptions of the pool's workers (domain/disruption.py).
    disruption: DisruptionPolicy = Field(default_factory=DisruptionPolicy)
    # When its sick workers are replaced, and when too many are sick to try (domain/repair.py).
    repair: RepairPolicy = Field(default_factory=RepairPolicy)
    # What the reconciler keeps running and warm in the pool (domain/capacity.py).
    capacity: CapacityPolicy = Field(default_factory=CapacityPolicy)
    version: int = Field(default=0, ge=0)


class AuditEvent(Record):
    """Who did what to which entity, from which status to which, why and when."""

    entity: str
    entity_id: str
    action: str
    actor: str
    from_status: str | None = None
    to_status: str | None = None
    reason: str | None = None
    at: UtcDatetime = Field(default_factory=utcnow)
    details: dict[str, str | int | None] = Field(default_factory=dict)
