"""The event shapes AWS sends our functions, built locally (samples of each are in events/)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from email.utils import format_datetime
from typing import Any

from fleetkeeper.triggers import SCHEDULE_SOURCE
from fleetkeeper_local.stack import LOCAL_ACCOUNT


def _time(at: datetime | None) -> str:
    return (at or datetime.now(UTC)).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def schedule_input(task: str, *, region: str | None = None) -> dict[str, str]:
    """What our EventBridge Scheduler schedules send their target (infra/triggers.py sets the same)."""
    payload = {"source": SCHEDULE_SOURCE, "task": task}
    if region is not None:
        payload["region"] = region
    return payload


def scheduled_event(schedule: str, *, region: str, at: datetime | None = None) -> dict[str, Any]:
    """What EventBridge delivers for a schedule without input of its own (a 'Scheduled Event')."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "Scheduled Event",
        "source": "aws.scheduler",
        "account": LOCAL_ACCOUNT,
        "time": _time(at),
        "region": region,
        "resources": [f"arn:aws:scheduler:{region}:{LOCAL_ACCOUNT}:schedule/default/{schedule}"],
        "detail": "{}",
    }


def _ec2_event(
    detail_type: str, instance_id: str, detail: dict[str, str], region: str, at: datetime | None
) -> dict[str, Any]:
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": detail_type,
        "source": "aws.ec2",
        "account": LOCAL_ACCOUNT,
        "time": _time(at),
        "region": region,
        "resources": [f"arn:aws:ec2:{region}:{LOCAL_ACCOUNT}:instance/{instance_id}"],
        "detail": {"instance-id": instance_id, **detail},
    }


def state_change_event(
    instance_id: str, state: str, *, region: str, at: datetime | None = None
) -> dict[str, Any]:
    """An 'EC2 Instance State-change Notification' as EventBridge delivers it."""
    return _ec2_event("EC2 Instance State-change Notification", instance_id, {"state": state}, region, at)


def spot_warning_event(
    instance_id: str, *, region: str, action: str = "terminate", at: datetime | None = None
) -> dict[str, Any]:
    """An 'EC2 Spot Instance Interruption Warning' as EventBridge delivers it."""
    return _ec2_event(
        "EC2 Spot Instance Interruption Warning", instance_id, {"instance-action": action}, region, at
    )


def health_event(
    instance_id: str,
    *,
    code: str,
    not_before: datetime,
    event_id: str,
    closed: bool = False,
    region: str,
    at: datetime | None = None,
) -> dict[str, Any]:
    """An 'AWS Health Event' for an EC2 scheduled change, as EventBridge delivers it."""
    type_code = "AWS_EC2_" + code.upper().replace("-", "_") + "_SCHEDULED"
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "AWS Health Event",
        "source": "aws.health",
        "account": LOCAL_ACCOUNT,
        "time": _time(at),
        "region": region,
        "resources": [instance_id],
        "detail": {
            "eventArn": f"arn:aws:health:{region}::event/EC2/{type_code}/{event_id}",
            "service": "EC2",
            "eventTypeCode": type_code,
            "eventTypeCategory": "scheduledChange",
            "eventRegion": region,
            "startTime": format_datetime(not_before.astimezone(UTC), usegmt=True),
            "statusCode": "closed" if closed else "upcoming",
            "affectedEntities": [{"entityValue": instance_id}],
        },
    }
