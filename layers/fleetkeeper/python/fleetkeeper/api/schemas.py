"""Request and response bodies of the admin API. They are the OpenAPI contract."""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WithJsonSchema,
    WrapValidator,
)

from fleetkeeper.domain.capacity import CapacityPolicy
from fleetkeeper.domain.disruption import DisruptionPolicy
from fleetkeeper.domain.drift import current_drift
from fleetkeeper.domain.durations import DURATION_PATTERN, parse_duration
from fleetkeeper.domain.lead_time import LeadTime
from fleetkeeper.domain.lifecycle import InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import (
    MAX_DRAIN_TIMEOUT_SECONDS,
    MIN_DRAIN_TIMEOUT_HOURS,
    OPERATION_NAME_PATTERN,
    DrainOutcome,
    DrainThen,
    DriftReason,
    Instance,
    Name,
    Pool,
    PoolDrainThen,
    Region,
    TemplateSpec,
    UtcDatetime,
    Worker,
    WorkerTemplate,
    utcnow,
)
from fleetkeeper.domain.operations import (
    MAX_PARAMETER_VALUE,
    MAX_PARAMETERS,
    PARAMETER_NAME_PATTERN,
    Operation,
    OperationOrigin,
    OperationStatus,
)
from fleetkeeper.domain.orphan_breaker import FINGERPRINT_PATTERN, PREVIEW_IDS
from fleetkeeper.domain.placement import PlacementStrategy
from fleetkeeper.domain.repair import HealthSource, HealthStatus, RepairPolicy
from fleetkeeper.domain.tags import Ec2Tags
from fleetkeeper.domain.values import Reason, WholeNumber
from fleetkeeper.services.disruption import BudgetExceeded
from fleetkeeper.services.repair import repairing

if TYPE_CHECKING:
    from fleetkeeper.services import orphan_gc

# One minimum for every drain, requested or from a template: a drain shorter than a minute is a typo.
MIN_DRAIN_TIMEOUT_SECONDS: Final = round(MIN_DRAIN_TIMEOUT_HOURS * 3600)
_TIMEOUT_RANGE: Final = (
    f"a whole number of seconds from {MIN_DRAIN_TIMEOUT_SECONDS} to {MAX_DRAIN_TIMEOUT_SECONDS}; "
    "leave it out for the default"
)


_MOVED_TIMEOUT_RANGE: Final = (
    f"a whole number of seconds from {MIN_DRAIN_TIMEOUT_SECONDS} to {MAX_DRAIN_TIMEOUT_SECONDS}, counted "
    "from the drain's start (started_at)"
)


def _in_range(text: str) -> Any:
    """A validator that says the whole allowed range, whichever bound was broken (pydantic names only
    one)."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError as exc:
            raise ValueError(text) from exc

    return check


# RFC 3339's date-time (what JSON Schema's `format: date-time` means), with its offset: pydantic alone
# would also read "1700000000" as seconds since 1970, a space for the T, or an offset without its colon.
TIMESTAMP_PATTERN: Final = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$"
)
_TIMESTAMP = re.compile(TIMESTAMP_PATTERN)
_TIMESTAMP_HINT: Final = "an RFC 3339 timestamp with a timezone, e.g. 2099-03-01T09:00:00Z"
_TIMESTAMP_SCHEMA: Final[dict[str, Any]] = {
    "type": "string",
    "format": "date-time",
    "pattern": TIMESTAMP_PATTERN,
    "description": _TIMESTAMP_HINT,
}


def _timestamp_text(value: Any) -> Any:
    """A timestamp is RFC 3339 text: a bare number would silently mean seconds since 1970."""
    if isinstance(value, datetime):
        return value
    if not isinstance(value, str) or not _TIMESTAMP.fullmatch(value):
        raise ValueError(_TIMESTAMP_HINT)
    return value


# A whole number (domain/values.py): `true` is not 1 second, `"60"` and 60.0 are not 60; 0, negatives and
# beyond a year are refused. The bounds come before the validator: behind one, pydantic publishes them as
# `ge`/`le`, which are not JSON Schema, and the contract would allow any number.
DrainTimeout = Annotated[
    WholeNumber,
    Field(
        ge=MIN_DRAIN_TIMEOUT_SECONDS,
        le=MAX_DRAIN_TIMEOUT_SECONDS,
        description=f"seconds, {_TIMEOUT_RANGE}",
        examples=[1800],
    ),
    WrapValidator(_in_range(_TIMEOUT_RANGE)),
]
# A running drain's new timeout: the same bounds, and no default to fall back to.
MovedDrainTimeout = Annotated[
    WholeNumber,
    Field(
        ge=MIN_DRAIN_TIMEOUT_SECONDS,
        le=MAX_DRAIN_TIMEOUT_SECONDS,
        description=f"the drain's whole timeout, {_MOVED_TIMEOUT_RANGE}; a deadline that would be past "
        "forces the drain now",
        examples=[7200],
    ),
    WrapValidator(_in_range(_MOVED_TIMEOUT_RANGE)),
]
# Timezone-aware RFC 3339 only: a naive time or an epoch number is refused, never guessed; held in UTC
# like every domain time.
Timestamp = Annotated[
    UtcDatetime, BeforeValidator(_timestamp_text), WithJsonSchema(_TIMESTAMP_SCHEMA, mode="validation")
]
StrictFlag = Annotated[bool, Strict()]
# Every path id fits a DynamoDB key with room to spare; longer is a client mistake, not a 500.
MAX_ID_LENGTH: Final = 128


# "2h", "90m", "1h30m", "1d", "45s": a protection that lasts this long from the request
# (domain/durations.py).
MAX_DO_NOT_DISRUPT: Final = timedelta(days=366)
_UNTIL_HINT = (
    "an RFC 3339 timestamp with a timezone (YYYY-MM-DDThh:mm:ssZ, or an offset for the Z) or a duration "
    "from now such as 2h, 90m, 1h30m or 1d; in the future, within 366 days from now"
)


def _until_or_duration(value: Any) -> Any:
    """A duration becomes the moment it ends; a timestamp must be RFC 3339 text with its zone."""
    length = parse_duration(value) if isinstance(value, str) else None
    if length is not None:
        return utcnow() + length
    if isinstance(value, str | datetime):
        return _timestamp_text(value)
    raise ValueError(_UNTIL_HINT)


def _ahead_within_a_year(value: datetime) -> datetime:
    now = utcnow()
    if value <= now:
        raise ValueError("must be in the future (null clears the protection)")
    if value - now > MAX_DO_NOT_DISRUPT:
        raise ValueError("must be within 366 days")
    return value


# The contract says both spellings; "in the future, within 366 days" depends on the clock, which a
# schema cannot say, so the description does (and a value outside that window is a 422 naming the field).
DoNotDisruptUntil = Annotated[
    UtcDatetime,
    BeforeValidator(_until_or_duration),
    AfterValidator(_ahead_within_a_year),
    WithJsonSchema(
        {
            "anyOf": [
                {key: value for key, value in _TIMESTAMP_SCHEMA.items() if key != "description"},
                {"type": "string", "pattern": DURATION_PATTERN},
            ],
            "description": _UNTIL_HINT,
            "examples": ["2h", "1d"],
        },
        mode="validation",
    ),
]


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateWorkerRequest(Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"template": "lab", "pool": "labs"}]})

    template: Name
    region: Region | None = Field(
        default=None,
        description="one of the regions the stage manages (any other is a 422); default: the API's own",
    )
    pool: Name | None = None


class DesiredStatusRequest(Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"desired_status": "STOPPED"}]})

    desired_status: Literal["RUNNING", "STOPPED", "TERMINATED"]


class DoNotDisruptRequest(Request):
    """Keep scale-down away from the worker until a moment; null lifts it. The key is required."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"do_not_disrupt_until": "2h"}]})

    do_not_disrupt_until: DoNotDisruptUntil | None


class DrainRequest(Request):
    """Every field is optional: an empty body (or none) drains with the template's timeout, then stops."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "timeout_seconds": 1800,
                    "reason": "kernel patch",
                    "then": "stop",
                    "dry_run": False,
                    "reschedule": True,
                }
            ]
        }
    )

    timeout_seconds: DrainTimeout | None = None
    reason: Reason | None = None
    then: DrainThen = DrainThen.STOP
    dry_run: StrictFlag = False
    reschedule: StrictFlag = Field(
        default=True,
        description="move the worker's SCHEDULED instances to other RUNNING workers of its pool and "
        "template with room, rather than wait for them; false waits for them as they are",
    )


# The drain a request acts on, as its status named it: a drain started since is not the one the caller
# looked at (409). Generations count a worker's drains, one at a time: far below this.
MAX_DRAIN_GENERATION: Final = 2**31 - 1
DrainGeneration = Annotated[
    Annotated[WholeNumber, Field(ge=1, le=MAX_DRAIN_GENERATION)] | None,
    Field(
        description="the drain this request is for (409 if the worker's current drain is another one); "
        "default: whichever is current"
    ),
]


class DrainDeadlineRequest(Request):
    """Move a running drain's deadline, earlier or later: it becomes the drain's start plus the timeout."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"timeout_seconds": 7200, "reason": "the exam runs late"}]}
    )

    timeout_seconds: MovedDrainTimeout
    reason: Reason | None = None
    generation: DrainGeneration = None


class ForceDrainRequest(Request):
    """Optional: no body (or an empty one) forces the current drain without a reason."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"reason": "security patch, cannot wait"}]})

    reason: Reason | None = None
    generation: DrainGeneration = None


class CancelDrainRequest(Request):
    """Optional: no body (or an empty one) cancels without a reason."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"reason": "patch postponed"}]})

    reason: Reason | None = None


class ConfirmOrphansRequest(Request):
    """Confirm what orphan GC's breaker holds back in one region; naming the workers, or the set's
    `held_back_set` as the breaker showed it, guards against confirming a set that changed since it was
    read (409 then)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"region": "eu-west-1"}]})

    region: Region
    worker_ids: list[Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]] | None = Field(
        default=None, max_length=10000
    )
    held_back_set: str | None = Field(
        default=None,
        pattern=FINGERPRINT_PATTERN,
        description="the held_back_set the breaker showed: the set confirmed must still be that one",
    )


class InternalStatusRequest(Request):
    """What EC2 (or tooling reading EC2) observed. Who reported it is the signing principal, not the body."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"status": "TERMINATED", "terminated_reason": "instance not found"}]}
    )

    status: WorkerStatus
    terminated_reason: Reason | None = None


class HealthRequest(Request):
    """What a worker's agent says of its machine; `healthy` withdraws its own earlier `unhealthy`."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"status": "unhealthy", "reason": "disk /var full"}]}
    )

    status: HealthStatus
    reason: Reason | None = None


class TemplateRequest(TemplateSpec):
    """The template spec, strictly: `"3"` and 3.0 are not a capacity and `true` is not a drain timeout."""

    model_config = ConfigDict(
        strict=True,
        json_schema_extra={
            "examples": [
                {
                    "instance_type": "m5.large",
                    "ami_name_filter": "lab-*",
                    "capacity": 4,
                    "drain_timeout_hours": 4,
                    "tags": {"team": "labs"},
                }
            ]
        },
    )

    tags: Ec2Tags = Field(default_factory=dict)


class PlaceInstanceRequest(Request):
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "pool": "labs",
                    "strategy": "pack",
                    "timeslot_start": "2099-03-01T09:00:00Z",
                    "timeslot_end": "2099-03-01T12:00:00Z",
                }
            ]
        }
    )

    template: Name | None = None
    pool: Name | None = None
    worker_id: str | None = Field(default=None, min_length=1, max_length=MAX_ID_LENGTH)
    strategy: PlacementStrategy = PlacementStrategy.PACK
    timeslot_start: Timestamp | None = None
    timeslot_end: Timestamp | None = None


# What a workload may report: every state but SCHEDULED, which is where instances start.
ReportedInstanceState = Literal[
    InstanceState.INSTANTIATING,
    InstanceState.RUNNING,
    InstanceState.COMPLETED,
    InstanceState.FAILED,
    InstanceState.TERMINATED,
]


class InstanceStateRequest(Request):
    model_config = ConfigDict(json_schema_extra={"examples": [{"state": "COMPLETED", "reason": "done"}]})

    state: ReportedInstanceState = Field(
        description="the state the workload reports; SCHEDULED is where instances start, never a report"
    )
    reason: Reason | None = None


class PoolRequest(Request):
    """Every field is optional; a field left out (or null) keeps its value."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "description": "lab sessions",
                    "status": "active",
                    "disruption": {
                        "budgets": [
                            {"max": "10%"},
                            {
                                "max": 0,
                                "reasons": ["scale_down", "rollout"],
                                "schedule": "0 9 * * mon-fri",
                                "duration": "8h",
                                "timezone": "Europe/Berlin",
                            },
                        ]
                    },
                }
            ]
        }
    )

    description: str | None = Field(default=None, max_length=500)
    status: Literal["active", "inactive"] | None = None
    disruption: DisruptionPolicy | None = Field(
        default=None,
        description='the pool\'s disruption budgets, replaced whole; {"budgets": []} removes them '
        "(docs/disruption.md)",
    )
    repair: RepairPolicy | None = Field(
        default=None,
        description="when the pool's sick workers are replaced, and the brake's share, replaced whole; a "
        "field left out of it takes its default (docs/repair.md)",
    )
    capacity: CapacityPolicy | None = Field(
        default=None,
        description="what the reconciler keeps running and warm in the pool, replaced whole; {} removes it "
        "(docs/capacity.md)",
    )


class PoolDrainRequest(Request):
    """Every field is optional: an empty body (or none) drains for 300 seconds and then does nothing."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"timeout_seconds": 600, "then": "none"}]})

    timeout_seconds: DrainTimeout | None = None
    then: PoolDrainThen = PoolDrainThen.NONE


class OperationRequest(Request):
    """Run a catalogue operation on the worker's machine. Parameters are strings the catalogue checks;
    a secret is never one of them (name the SSM parameter that holds it instead)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "register-license",
                    "parameters": {"licenseParameter": "/fleetkeeper/prod/license-token"},
                }
            ]
        }
    )

    name: str = Field(pattern=OPERATION_NAME_PATTERN, examples=["register-license"])
    parameters: dict[
        Annotated[str, Field(pattern=PARAMETER_NAME_PATTERN)],
        Annotated[str, Strict(), Field(max_length=MAX_PARAMETER_VALUE)],
    ] = Field(
        default_factory=dict,
        max_length=MAX_PARAMETERS,
        # pydantic publishes the key pattern as patternProperties, which leaves other keys allowed;
        # the validator refuses them.
        json_schema_extra={"additionalProperties": False},
    )


class OperationView(BaseModel):
    id: str
    worker_id: str
    name: str
    status: OperationStatus
    origin: OperationOrigin
    parameters: dict[str, str]
    requested_by: str
    attempts: int
    max_attempts: int
    command_id: str | None
    next_attempt_at: datetime | None
    output: str | None = Field(description="the end of the command's output (stdout, then stderr)")
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None

    @classmethod
    def of(cls, op: Operation) -> OperationView:
        return cls.model_validate(op.model_dump())


class OperationPage(BaseModel):
    items: list[OperationView]
    next_token: str | None


class DesiredLaunchView(BaseModel):
    image_id: str | None = Field(
        description="the newest image the template's ami_name_filter selects; null when none matches"
    )
    instance_type: str = Field(description="the template's instance type")


class DriftView(BaseModel):
    reasons: list[DriftReason] = Field(
        description="image: not the newest image of the template's filter; instance_type: not the "
        "template's; expired: older than the template's max_lifetime_hours"
    )
    desired: DesiredLaunchView
    since: datetime = Field(description="when the worker was first found drifted")


class DrainView(BaseModel):
    generation: int
    started_at: datetime
    deadline: datetime
    timeout_seconds: int
    reason: str | None
    requested_by: str
    then: DrainThen
    outcome: DrainOutcome
    forced_instances: int
    finished_at: datetime | None
    cancelled_by: str | None
    cancel_reason: str | None = None
    execution_arn: str | None


class ScheduledEventView(BaseModel):
    code: str = Field(description="EC2's code, e.g. instance-retirement, or a Health event type code")
    not_before: datetime | None = Field(description="when AWS acts at the earliest")
    event_id: str | None


class SignalView(BaseModel):
    status: HealthStatus = Field(description="unhealthy: only a source that says so has a signal")
    source: HealthSource = Field(
        description="scheduled_event (EC2), status_check (EC2's checks failed), unreachable (EC2 hears "
        "nothing), connection_lost (the SSM agent of a worker that uses operations), reported (the "
        "worker's agent)"
    )
    reason: str | None
    since: datetime = Field(description="when this source began to say so")
    event: ScheduledEventView | None = None


class RepairView(BaseModel):
    reason: str = Field(
        description="repair (admitted by the pool's budgets) or scheduled_event (imposed by AWS's date)"
    )
    since: datetime = Field(description="when the repair took the worker over")
    step: Literal["replacing", "draining"] = Field(
        description="replacing: its replacement is made and awaited while it serves; draining: its drain runs"
    )


class HealthView(BaseModel):
    status: HealthStatus
    source: HealthSource = Field(description="the source of the signal that counts now (see `signals`)")
    reason: str | None
    since: datetime = Field(description="when the signal that counts now began")
    event: ScheduledEventView | None = None
    signals: list[SignalView] = Field(
        default_factory=list,
        description="every source's signal that stands, the one that counts first; empty when healthy",
    )
    repair_in_progress: bool = Field(
        default=False,
        description="a repair owns the worker: its replacement is being made, or it is draining",
    )
    repair: RepairView | None = Field(default=None, description="the repair in progress, if any")

    @classmethod
    def of(cls, worker: Worker) -> HealthView | None:
        health, owner = worker.health, worker.owner
        if health is None:
            return None
        signals = [
            SignalView(
                status=HealthStatus.UNHEALTHY,
                source=source,
                reason=found.reason,
                since=found.since,
                event=ScheduledEventView.model_validate(found.event.model_dump()) if found.event else None,
            )
            for source, found in health.in_order()
        ]
        repair = None
        if owner is not None and repairing(worker):
            step: Literal["replacing", "draining"] = (
                "draining" if worker.status != WorkerStatus.RUNNING else "replacing"
            )
            repair = RepairView(reason=owner.reason, since=owner.since, step=step)
        return cls.model_validate(
            {
                **health.model_dump(exclude={"signals", "heard", "stale_before"}),
                "signals": signals,
                "repair_in_progress": repair is not None,
                "repair": repair,
            }
        )


class WorkerView(BaseModel):
    id: str
    template: str
    region: str
    pool: str | None
    status: WorkerStatus
    desired_status: WorkerStatus | None
    ec2_instance_id: str | None
    private_ip: str | None
    public_ip: str | None
    capacity: int
    active_instances: int
    drain: DrainView | None
    do_not_disrupt: bool
    do_not_disrupt_until: datetime | None = None
    status_reason: str | None
    terminated_by: str | None
    terminated_reason: str | None
    version: int
    created_at: datetime
    updated_at: datetime
    system_info: dict[str, Any] | None = Field(
        default=None, description="what the machine last reported through collect-system-info"
    )
    system_info_at: datetime | None = None
    image_id: str | None = Field(default=None, description="the image the machine was launched from")
    instance_type: str | None = Field(default=None, description="the instance type it was launched as")
    launched_at: datetime | None = None
    pinned_image_id: str | None = Field(
        default=None, description="a rollback's worker: the image its launch uses instead of the template's"
    )
    pinned_instance_type: str | None = Field(
        default=None, description="a rollback's worker: the instance type its launch uses instead"
    )
    drift: DriftView | None = Field(
        default=None, description="how the machine differs from its template now (docs/rollouts.md)"
    )
    health: HealthView | None = Field(
        default=None,
        description="what its health signals last said (docs/repair.md); null: never unhealthy nor stopped",
    )

    @classmethod
    def of(cls, worker: Worker) -> WorkerView:
        # The drain's callback token is a credential for the workflow: it never leaves the service.
        data = worker.model_dump(exclude={"drain": {"task_token", "timed_out_at", "error"}})
        # A worker that ended keeps its last drift as history; it is no longer drifted.
        current = current_drift(worker)
        data["drift"] = current.model_dump() if current is not None else None
        data["health"] = HealthView.of(worker)
        return cls.model_validate(data)


class OrphanBreakerView(BaseModel):
    region: str
    holding: bool
    held_back: list[str] = Field(
        description=f"the first {PREVIEW_IDS} held-back worker ids, sorted; every one: "
        "GET /api/v1/reconcile/orphans/{region}/held-back"
    )
    held_back_count: int
    held_back_set: str | None = Field(description="names the held-back set; give it back to confirm it")
    live_workers: int
    share_percent: float
    tripped_at: datetime | None
    confirmed_ids: list[str] = Field(description=f"the first {PREVIEW_IDS} confirmed worker ids, sorted")
    confirmed_count: int
    confirmed_by: str | None
    confirmed_at: datetime | None
    confirmed_until: datetime | None

    @classmethod
    def of(cls, summary: orphan_gc.BreakerSummary) -> OrphanBreakerView:
        breaker = summary.breaker
        return cls(
            region=breaker.region,
            holding=breaker.holding,
            held_back=summary.held_back,
            held_back_count=breaker.held.count if breaker.held else 0,
            held_back_set=breaker.held.fingerprint if breaker.held else None,
            live_workers=breaker.live_workers,
            share_percent=breaker.share_percent,
            tripped_at=breaker.tripped_at,
            confirmed_ids=summary.confirmed_ids,
            confirmed_count=breaker.confirmed.count if breaker.confirmed else 0,
            confirmed_by=breaker.confirmed_by,
            confirmed_at=breaker.confirmed_at,
            confirmed_until=breaker.confirmed_until,
        )


class OrphanBreakerList(BaseModel):
    items: list[OrphanBreakerView]


class HeldBackPage(BaseModel):
    region: str
    held_back_set: str | None = Field(description="the set these ids belong to")
    count: int = Field(description="how many workers are held back in all")
    items: list[str] = Field(description="held-back worker ids, in order")
    next_token: str | None

    @classmethod
    def of(cls, found: orphan_gc.HeldBackPage) -> HeldBackPage:
        return cls(
            region=found.region,
            held_back_set=found.held.fingerprint if found.held else None,
            count=found.held.count if found.held else 0,
            items=found.page.items,
            next_token=found.page.next_token,
        )


class WorkerPage(BaseModel):
    items: list[WorkerView]
    next_token: str | None


class InstanceView(BaseModel):
    id: str
    worker_id: str | None = Field(description="the worker it is on; null while it waits for capacity")
    template: str | None = Field(
        description="its worker's template; while it waits for capacity the template it asked for, null "
        "when it asked for its pool alone (it then takes whatever template the pool's policy brings up)"
    )
    pool: str | None
    state: InstanceState
    retry_count: int
    timeslot_start: datetime | None
    timeslot_end: datetime | None
    expected_ready_by: datetime | None = Field(
        default=None,
        description="a booking's: when it should be on a RUNNING worker (timeslot_start - the lead time)",
    )
    reason: str | None
    version: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, instance: Instance) -> InstanceView:
        return cls.model_validate({**instance.model_dump(), "worker_id": instance.worker_id or None})


class InstancePage(BaseModel):
    items: list[InstanceView]
    next_token: str | None


class TemplateView(BaseModel):
    name: str
    instance_type: str
    ami_name_filter: str
    capacity: int
    drain_timeout_hours: float
    tags: dict[str, str]
    before_stop: list[str] = Field(default_factory=list)
    max_lifetime_hours: int | None = None
    auto_rollout: bool = False
    version: int

    @classmethod
    def of(cls, template: WorkerTemplate) -> TemplateView:
        return cls.model_validate(template.model_dump())


class LeadTimeView(BaseModel):
    """How long the template's workers take to come up (domain/lead_time.py)."""

    launch_seconds: float = Field(description="p95 of the last 50 launches to RUNNING, else 600 (10 min)")
    start_seconds: float = Field(description="p95 of the last 50 starts to RUNNING, else 120 (2 min)")
    samples_launch: int = Field(description="launches measured (the last 50 are kept)")
    samples_start: int = Field(description="starts measured (the last 50 are kept)")
    source: Literal["measured", "default"] = Field(
        description="measured: both figures from at least 5 samples; default: one or both are the default"
    )

    @classmethod
    def of(cls, lead: LeadTime) -> LeadTimeView:
        return cls.model_validate(asdict(lead))


class TemplateDetail(TemplateView):
    """One template, with its measured lead time."""

    lead_time: LeadTimeView


class TemplateList(BaseModel):
    items: list[TemplateView]


class PoolView(BaseModel):
    name: str
    status: PoolStatus
    description: str | None
    drain_started_at: datetime | None
    drain_timeout_seconds: int | None
    drain_then: PoolDrainThen | None
    drain_generation: int
    drain_outcome: DrainOutcome | None
    drain_requested_by: str | None
    drain_execution_arn: str | None
    drain_finished_at: datetime | None
    drain_cancelled_by: str | None = None
    drain_cancel_reason: str | None = None
    active_instances: int | None = Field(
        default=None,
        description="active instances on the pool's workers: counted when one pool is read or written, "
        "null in the list of pools (counting reads every worker of every pool)",
    )
    disruption: DisruptionPolicy = Field(default_factory=DisruptionPolicy)
    repair: RepairPolicy = Field(default_factory=RepairPolicy)
    capacity: CapacityPolicy = Field(default_factory=CapacityPolicy)
    budget_exceeded: BudgetExceeded | None = Field(
        default=None,
        description="in a drain's answer: the pool budget its workers' drains go beyond (never a refusal)",
    )
    version: int

    @classmethod
    def of(
        cls, pool: Pool, active_instances: int | None = None, budget_exceeded: BudgetExceeded | None = None
    ) -> PoolView:
        data = pool.model_dump(exclude={"drain_task_token"})
        return cls.model_validate(
            {**data, "active_instances": active_instances, "budget_exceeded": budget_exceeded}
        )


class PoolList(BaseModel):
    items: list[PoolView]


class Stats(BaseModel):
    workers_by_status: dict[str, int]
    active_instances: int
    pools_by_status: dict[str, int]
    counters: dict[str, dict[str, int | float | str]] = Field(
        default_factory=dict,
        description=(
            "running totals, gauges and times by scope: reconcile (and reconcile#<n>of<m> per shard), "
            "discovery, scale-down. EC2 event outcomes are metrics only (Ec2Events.events_<outcome>)"
        ),
    )


class ErrorDetail(BaseModel):
    field: str = Field(description="where: body.<field>, query.<name>, path.<name> or header.<name>")
    reason: str


class ErrorBody(BaseModel):
    """Every error the API answers, 4xx and 5xx alike (including 422 validation failures)."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "error": "VALIDATION_FAILED",
                    "message": "invalid request: body.timeout_seconds",
                    "details": [{"field": "body.timeout_seconds", "reason": _TIMEOUT_RANGE}],
                }
            ]
        }
    )

    error: str = Field(description="a stable code, e.g. NOT_FOUND, VALIDATION_FAILED, NO_CAPACITY")
    message: str
    details: list[ErrorDetail] | dict[str, str | int | None] | None = Field(
        default=None,
        description="the fields at fault (a list), or facts about the entity (an object); absent if none",
    )
    details_total: int | None = Field(
        default=None,
        description="how many fields were at fault when details lists only the first of them; absent "
        "when details lists them all",
    )
