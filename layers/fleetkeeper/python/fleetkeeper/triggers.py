"""Models of the events that invoke the reconcile, discover and ec2_events functions.

Samples of each shape live in events/; the local scheduler and EC2 event pump send the same shapes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, RootModel, model_validator

from fleetkeeper.domain.models import Region
from fleetkeeper.domain.sharding import MAX_SHARDS, Shard
from fleetkeeper.domain.stagger import STAGGER_WINDOW_SECONDS

STATE_CHANGE = "EC2 Instance State-change Notification"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
REBALANCE_RECOMMENDATION = "EC2 Instance Rebalance Recommendation"
INSTANCE_ID_PATTERN = r"^i-[0-9a-f]{8,17}$"


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


class Ec2Event(
    RootModel[
        Annotated[
            Ec2StateChangeEvent | Ec2SpotWarningEvent | Ec2RebalanceEvent, Field(discriminator="detail_type")
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
