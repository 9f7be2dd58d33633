"""Request and response bodies of the admin API. They are the OpenAPI contract."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Final, Literal

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
    model_validator,
)

from fleetkeeper.domain.lifecycle import InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import (
    MAX_DRAIN_TIMEOUT_SECONDS,
    MIN_DRAIN_TIMEOUT_HOURS,
    OPERATION_NAME_PATTERN,
    DrainOutcome,
    DrainThen,
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
from fleetkeeper.domain.orphan_breaker import OrphanBreaker
from fleetkeeper.domain.placement import PlacementStrategy

# One minimum for every drain, requested or from a template: a drain shorter than a minute is a typo.
MIN_DRAIN_TIMEOUT_SECONDS: Final = round(MIN_DRAIN_TIMEOUT_HOURS * 3600)
_TIMEOUT_RANGE: Final = (
    f"a whole number of seconds from {MIN_DRAIN_TIMEOUT_SECONDS} to {MAX_DRAIN_TIMEOUT_SECONDS}; "
    "leave it out for the default"
)


def _timeout_in_range(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Say the whole allowed range, whichever bound was broken (pydantic names only one)."""
    try:
        return handler(value)
    except ValidationError as exc:
        raise ValueError(_TIMEOUT_RANGE) from exc


def _whole_number(value: Any) -> Any:
    """JSON has one number type: 1800.0 is the integer 1800 (JSON Schema agrees); 1800.5 is not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# RFC 3339's date-time (what JSON Schema's `format: date-time` means), with its offset: pydantic alone
# would also read "1700000000" as seconds since 1970, a space for the T, or an offset without its colon.
TIMESTAMP_PATTERN: Final = r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$"
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


# Strict: `true` is not 1 second and `"60"` is not a number; 0, negatives and beyond a year are refused.
# The bounds come before the validators: behind one, pydantic publishes them as `ge`/`le`, which are not
# JSON Schema, and the contract would allow any number.
DrainTimeout = Annotated[
    int,
    Strict(),
    Field(
        ge=MIN_DRAIN_TIMEOUT_SECONDS,
        le=MAX_DRAIN_TIMEOUT_SECONDS,
        description=f"seconds, {_TIMEOUT_RANGE}",
        examples=[1800],
    ),
    BeforeValidator(_whole_number),
    WrapValidator(_timeout_in_range),
]
# Timezone-aware RFC 3339 only: a naive time or an epoch number is refused, never guessed; held in UTC
# like every domain time.
Timestamp = Annotated[
    UtcDatetime, BeforeValidator(_timestamp_text), WithJsonSchema(_TIMESTAMP_SCHEMA, mode="validation")
]
StrictFlag = Annotated[bool, Strict()]
# Every path id fits a DynamoDB key with room to spare; longer is a client mistake, not a 500.
MAX_ID_LENGTH: Final = 128


# "2h", "90m", "1h30m", "1d", "45s": a protection that lasts this long from the request. Days, hours,
# minutes and seconds in that order, each at most once, at least one of them (written without a
# lookahead, so that every JSON Schema regex dialect reads the published pattern alike).
DURATION_PATTERN: Final = r"^(?:\d+d(?:\d+h)?(?:\d+m)?(?:\d+s)?|\d+h(?:\d+m)?(?:\d+s)?|\d+m(?:\d+s)?|\d+s)$"
_DURATION_PART = re.compile(r"(\d+)([dhms])")
_DURATION = re.compile(DURATION_PATTERN)
MAX_DO_NOT_DISRUPT: Final = timedelta(days=366)
_UNTIL_HINT = (
    "an RFC 3339 timestamp with a timezone (YYYY-MM-DDThh:mm:ssZ, or an offset for the Z) or a duration "
    "from now such as 2h, 90m, 1h30m or 1d; in the future, within 366 days from now"
)


def _until_or_duration(value: Any) -> Any:
    """A duration becomes the moment it ends; a timestamp must be RFC 3339 text with its zone."""
    if isinstance(value, str) and _DURATION.fullmatch(value):
        parts = {unit: int(amount) for amount, unit in _DURATION_PART.findall(value)}
        try:
            return utcnow() + timedelta(
                days=parts.get("d", 0),
                hours=parts.get("h", 0),
                minutes=parts.get("m", 0),
                seconds=parts.get("s", 0),
            )
        except OverflowError as exc:  # "99999999999d": a client's typo, not our 500
            raise ValueError("must be within 366 days") from exc
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
    reason: str | None = Field(default=None, max_length=500)
    then: DrainThen = DrainThen.STOP
    dry_run: StrictFlag = False
    reschedule: StrictFlag = Field(
        default=True,
        description="move the worker's SCHEDULED instances to other RUNNING workers of its pool and "
        "template with room, rather than wait for them; false waits for them as they are",
    )


class CancelDrainRequest(Request):
    """Optional: no body (or an empty one) cancels without a reason."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"reason": "patch postponed"}]})

    reason: str | None = Field(default=None, min_length=1, max_length=500)


class ConfirmOrphansRequest(Request):
    """Confirm what orphan GC's breaker holds back in one region; naming the workers guards against
    confirming a set that changed since it was read (409 then)."""

    model_config = ConfigDict(json_schema_extra={"examples": [{"region": "eu-west-1"}]})

    region: Region
    worker_ids: list[Annotated[str, Field(min_length=1, max_length=MAX_ID_LENGTH)]] | None = Field(
        default=None, max_length=10000
    )


class InternalStatusRequest(Request):
    """What EC2 (or tooling reading EC2) observed. Who reported it is the signing principal, not the body."""

    model_config = ConfigDict(
        json_schema_extra={"examples": [{"status": "TERMINATED", "terminated_reason": "instance not found"}]}
    )

    status: WorkerStatus
    terminated_reason: str | None = Field(default=None, max_length=500)


class TemplateRequest(TemplateSpec):
    """The template spec, strictly: `"3"` is not a capacity and `true` is not a drain timeout."""

    @model_validator(mode="before")
    @classmethod
    def _whole_capacity(cls, data: Any) -> Any:
        if isinstance(data, dict) and "capacity" in data:
            return {**data, "capacity": _whole_number(data["capacity"])}
        return data

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
    reason: str | None = Field(default=None, max_length=500)


class PoolRequest(Request):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"description": "lab sessions", "status": "active"}]}
    )

    description: str | None = Field(default=None, max_length=500)
    status: Literal["active", "inactive"] | None = None


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

    @classmethod
    def of(cls, worker: Worker) -> WorkerView:
        # The drain's callback token is a credential for the workflow: it never leaves the service.
        data = worker.model_dump(exclude={"drain": {"task_token", "timed_out_at", "error"}})
        return cls.model_validate(data)


class OrphanBreakerView(BaseModel):
    region: str
    holding: bool
    held_back: list[str]
    live_workers: int
    share_percent: float
    tripped_at: datetime | None
    confirmed_ids: list[str]
    confirmed_by: str | None
    confirmed_at: datetime | None
    confirmed_until: datetime | None

    @classmethod
    def of(cls, breaker: OrphanBreaker) -> OrphanBreakerView:
        return cls.model_validate({**breaker.model_dump(exclude={"version"}), "holding": breaker.holding})


class OrphanBreakerList(BaseModel):
    items: list[OrphanBreakerView]


class WorkerPage(BaseModel):
    items: list[WorkerView]
    next_token: str | None


class InstanceView(BaseModel):
    id: str
    worker_id: str
    template: str | None
    pool: str | None
    state: InstanceState
    retry_count: int
    timeslot_start: datetime | None
    timeslot_end: datetime | None
    reason: str | None
    version: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, instance: Instance) -> InstanceView:
        return cls.model_validate(instance.model_dump())


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
    version: int

    @classmethod
    def of(cls, template: WorkerTemplate) -> TemplateView:
        return cls.model_validate(template.model_dump())


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
    active_instances: int | None = None
    version: int

    @classmethod
    def of(cls, pool: Pool, active_instances: int | None = None) -> PoolView:
        data = pool.model_dump(exclude={"drain_task_token"})
        return cls.model_validate({**data, "active_instances": active_instances})


class PoolList(BaseModel):
    items: list[PoolView]


class Stats(BaseModel):
    workers_by_status: dict[str, int]
    active_instances: int
    pools_by_status: dict[str, int]
    counters: dict[str, dict[str, int | float | str]] = Field(default_factory=dict)


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
