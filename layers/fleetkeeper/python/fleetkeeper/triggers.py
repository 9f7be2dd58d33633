"""Models of the events that invoke the reconcile, discover and ec2_events functions.

Samples of each shape live in events/; the local scheduler and EC2 event pump send the same shapes.
"""

from __future__ import annotations

import re
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field, RootModel, model_validator

from fleetkeeper.domain.models import Region
from fleetkeeper.domain.sharding import MAX_SHARDS, Shard
from fleetkeeper.domain.stagger import STAGGER_WINDOW_SECONDS

STATE_CHANGE = "EC2 Instance State-change Notification"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
HEALTH_EVENT = "AWS Health Event"
INSTANCE_ID_PATTERN = r"^i-[0-9a-f]{8,17}$"
_INSTANCE_ID = re.compile(INSTANCE_ID_PATTERN)


class StateChangeDetail(BaseModel):
    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID_PATTERN)
    state: Literal["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]


class SpotWarningDetail(BaseModel):
    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID_PATTERN)
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class RebalanceDetail(BaseModel):
    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID_PATTERN)


class Ec2StateChangeEvent(EventBridgeModel):
    source: Literal["aws.ec2"]
    detail_type: Literal["EC2 Instance State-change Notification"] = Field(alias="detail-type")
    detail: StateChangeDetail


class Ec2SpotWarningEvent(EventBridgeModel):
    source: Literal["aws.ec2"]
    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = Field(alias="detail-type")
    detail: SpotWarningDetail


class Ec2RebalanceEvent(EventBridgeModel):
    source: Literal["aws.ec2"]
    detail_type: Literal["EC2 Instance Rebalance Recommendation"] = Field(alias="detail-type")
    detail: RebalanceDetail


def _health_time(value: Any) -> Any:
    """AWS Health writes its times as RFC 1123 (`Sat, 05 Jun 2026 14:00:00 GMT`); ISO 8601 is read too."""
    if isinstance(value, str) and value[:1].isalpha():
        try:
            return parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return value
    return value


class HealthEntity(BaseModel):
    model_config = ConfigDict(extra="ignore")

    entity_value: str = Field(alias="entityValue", max_length=1600)


class HealthDetail(BaseModel):
    """An AWS Health scheduled change of EC2 (the rule matches nothing else)."""

    model_config = ConfigDict(extra="ignore")

    event_arn: str = Field(alias="eventArn", max_length=1600)
    service: Literal["EC2"]
    event_type_code: str = Field(alias="eventTypeCode", max_length=128)
    event_type_category: Literal["scheduledChange"] = Field(alias="eventTypeCategory")
    event_region: str | None = Field(default=None, alias="eventRegion", max_length=32)
    start_time: Annotated[AwareDatetime | None, BeforeValidator(_health_time)] = Field(
        default=None, alias="startTime"
    )
    # `closed`: AWS completed or cancelled the change.
    status_code: Literal["open", "upcoming", "closed"] = Field(default="open", alias="statusCode")
    affected_entities: list[HealthEntity] = Field(
        default_factory=list, alias="affectedEntities", max_length=1000
    )


class HealthScheduledChangeEvent(EventBridgeModel):
    source: Literal["aws.health"]
    detail_type: Literal["AWS Health Event"] = Field(alias="detail-type")
    detail: HealthDetail

    @property
    def instance_ids(self) -> list[str]:
        """The machines the change affects: its entities and resources that are instance ids."""
        named = [e.entity_value for e in self.detail.affected_entities] + list(self.resources)
        return sorted({value for value in named if _INSTANCE_ID.fullmatch(value)})

    @property
    def instance_region(self) -> str:
        """Where the machines are: the event's own region, else where it was delivered."""
        return self.detail.event_region or self.region

    @property
    def not_before(self) -> datetime | None:
        return self.detail.start_time


class Ec2Event(
    RootModel[
        Annotated[
            Ec2StateChangeEvent | Ec2SpotWarningEvent | Ec2RebalanceEvent | HealthScheduledChangeEvent,
            Field(discriminator="detail_type"),
        ]
    ]
):
    """Any EC2 event the ec2_events function is subscribed to, told apart by detail-type."""


SCHEDULE_SOURCE = "fleetkeeper.schedule"


class ScheduleInput(BaseModel):
    """What a schedule gives its target: `{"source": "fleetkeeper.schedule", "task": ..., "region": ...}`.

    Discovery has one schedule per worker region, each naming its region; without one, every
    configured region is swept. A sharded reconciler has one schedule per shard, each naming its
    `shard` (0-based) and the `shards` it is one of; without them the cycle covers the whole fleet.
    A shard's schedule may also say how long after the time it was due (`scheduled_time`, filled in
    by EventBridge Scheduler) its cycle starts (`start_delay_seconds`, domain/stagger.py).
    """

    model_config = ConfigDict(extra="ignore")

    source: str | None = None
    task: Literal["reconcile", "discover"] | None = None
    region: Region | None = None
    regions: list[Region] | None = None
    shard: int = Field(default=0, ge=0, lt=MAX_SHARDS, strict=True)
    shards: int = Field(default=1, ge=1, le=MAX_SHARDS, strict=True)
    start_delay_seconds: float = Field(default=0.0, ge=0, le=STAGGER_WINDOW_SECONDS)
    scheduled_time: AwareDatetime | None = None

    @model_validator(mode="after")
    def _shard_in_range(self) -> ScheduleInput:
        if self.shard >= self.shards:
            raise ValueError(f"shard must be below shards ({self.shards}), got {self.shard}")
        return self

    @property
    def reconcile_shard(self) -> Shard:
        return Shard(index=self.shard, count=self.shards)

    @property
    def target_regions(self) -> list[str] | None:
        if self.regions:
            return list(self.regions)
        return [self.region] if self.region else None


def schedule_input(event: Any) -> ScheduleInput:
    """The request of a scheduled invocation: our schedule input, or an EventBridge 'Scheduled Event'.

    EventBridge Scheduler sends the target input it was given (the stack gives the shape above). A
    schedule without input, or an EventBridge rule, sends a 'Scheduled Event' instead, which carries no
    request: it means "the configured regions".
    """
    if not isinstance(event, dict):
        return ScheduleInput()
    if event.get("detail-type") == "Scheduled Event":
        scheduled = EventBridgeModel.model_validate(event)
        detail = scheduled.detail if isinstance(scheduled.detail, dict) else {}
        return ScheduleInput.model_validate(detail)
    return ScheduleInput.model_validate(event)
