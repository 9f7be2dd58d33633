"""Models of the events that invoke the reconcile, discover and ec2_events functions.

Samples of each shape live in events/; the local scheduler and EC2 event pump send the same shapes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from aws_lambda_powertools.utilities.parser.models import EventBridgeModel
from pydantic import BaseModel, ConfigDict, Field, RootModel, ValidationError

from fleetkeeper.domain.models import Region

STATE_CHANGE = "EC2 Instance State-change Notification"
SPOT_WARNING = "EC2 Spot Instance Interruption Warning"
INSTANCE_ID_PATTERN = r"^i-[0-9a-f]{8,17}$"


class StateChangeDetail(BaseModel):
    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID_PATTERN)
    state: Literal["pending", "running", "stopping", "stopped", "shutting-down", "terminated"]


class SpotWarningDetail(BaseModel):
    instance_id: str = Field(alias="instance-id", pattern=INSTANCE_ID_PATTERN)
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class Ec2StateChangeEvent(EventBridgeModel):
    source: Literal["aws.ec2"]
    detail_type: Literal["EC2 Instance State-change Notification"] = Field(alias="detail-type")
    detail: StateChangeDetail


class Ec2SpotWarningEvent(EventBridgeModel):
    source: Literal["aws.ec2"]
    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = Field(alias="detail-type")
    detail: SpotWarningDetail


class Ec2Event(
    RootModel[Annotated[Ec2StateChangeEvent | Ec2SpotWarningEvent, Field(discriminator="detail_type")]]
):
    """Either EC2 event the ec2_events function is subscribed to, told apart by detail-type."""


class ScheduleInput(BaseModel):
    """What a schedule may ask for; EventBridge Scheduler's own event shape carries nothing of it."""

    model_config = ConfigDict(extra="ignore")

    regions: list[Region] | None = None


def schedule_input(event: Any) -> ScheduleInput:
    """The request of a scheduled invocation: a Scheduler/EventBridge 'Scheduled Event' or plain input.

    EventBridge Scheduler sends the target input it was given; with none, an EventBridge-shaped
    'Scheduled Event' whose detail is empty. Both mean "the configured regions".
    """
    if not isinstance(event, dict):
        return ScheduleInput()
    try:
        scheduled = EventBridgeModel.model_validate(event)
    except ValidationError:
        return ScheduleInput.model_validate(event)
    detail = scheduled.detail if isinstance(scheduled.detail, dict) else {}
    return ScheduleInput.model_validate(detail)
