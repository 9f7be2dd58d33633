"""Request and response bodies of the admin API. They are the OpenAPI contract."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetkeeper.domain.lifecycle import InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import (
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
)
from fleetkeeper.domain.placement import PlacementStrategy


class Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CreateWorkerRequest(Request):
    template: Name
    region: Region | None = None
    pool: Name | None = None


class DesiredStatusRequest(Request):
    desired_status: Literal["RUNNING", "STOPPED", "TERMINATED"]


class DrainRequest(Request):
    timeout_seconds: int | None = Field(
        default=None, description="<= 0 or absent: the template's drain timeout"
    )
    reason: str | None = Field(default=None, max_length=500)
    then: DrainThen = DrainThen.STOP
    dry_run: bool = False


class InternalStatusRequest(Request):
    status: WorkerStatus
    terminated_by: str | None = Field(default=None, max_length=200)
    terminated_reason: str | None = Field(default=None, max_length=500)


TemplateRequest = TemplateSpec


class PlaceInstanceRequest(Request):
    template: Name | None = None
    pool: Name | None = None
    worker_id: str | None = Field(default=None, max_length=128)
    strategy: PlacementStrategy = PlacementStrategy.PACK
    # Naive times are refused with 422 naming the field; aware ones are normalised to UTC.
    timeslot_start: UtcDatetime | None = None
    timeslot_end: UtcDatetime | None = None


class InstanceStateRequest(Request):
    state: InstanceState
    reason: str | None = Field(default=None, max_length=500)


class PoolRequest(Request):
    description: str | None = Field(default=None, max_length=500)
    status: Literal["active", "inactive"] | None = None


class PoolDrainRequest(Request):
    timeout_seconds: int | None = Field(default=None, description="<= 0 or absent: 300 seconds")
    then: PoolDrainThen = PoolDrainThen.NONE


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
    status_reason: str | None
    terminated_by: str | None
    terminated_reason: str | None
    version: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, worker: Worker) -> WorkerView:
        # The drain's callback token is a credential for the workflow: it never leaves the service.
        data = worker.model_dump(exclude={"drain": {"task_token", "timed_out_at", "error"}})
        return cls.model_validate(data)


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
    field: str
    reason: str


class ErrorBody(BaseModel):
    error: str
    message: str
    details: list[ErrorDetail] | dict[str, str | int | None] | None = None
