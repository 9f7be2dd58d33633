"""The emulated machines' health: scheduled events and status checks that moto does not have.

moto's DescribeInstanceStatus answers `ok` for every running machine and lists no scheduled events.
A simulated signal is kept on the machine itself, as a tag the emulator's EC2 holds (so a command of
another process, `python -m fleetkeeper_local simulate ...`, reaches the running stack), and this module
hooks moto's instances (in the moto server's own process, as machines.py does for SSM):

- `retirement`: a scheduled event (`instance-retirement` by default) not before a moment;
  DescribeInstanceStatus lists it, and the event pump (scheduler.py) delivers the AWS Health
  scheduled change to the EC2 events handler, as EventBridge does on AWS;
- `impair`: the instance status check fails (`impaired`); `silence`: no status at all (`insufficient-data`);
- `disconnect`: the machine's SSM agent stops answering: Systems Manager says `ConnectionLost` from then
  on, and Run Command no longer reaches it (machines.py answers DescribeInstanceInformation);
- `recover`: the checks pass again, the agent answers again, and a scheduled event is cancelled
  (`[Canceled]`, and a closed Health event).

Only the local stack uses this; it is never shipped to Lambda.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any, Final

EVENT_TAG: Final = "fleetkeeper-local:scheduled-event"
STATUS_TAG: Final = "fleetkeeper-local:status"
# When the machine's SSM agent last answered, once it stopped answering (an ISO time).
AGENT_LOST_TAG: Final = "fleetkeeper-local:agent-lost"
IMPAIRED: Final = "impaired"
SILENT: Final = "insufficient-data"
CANCELLED: Final = "cancelled"
DESCRIPTION: Final = "The instance is running on degraded hardware"


def event_tag(code: str, not_before: datetime, event_id: str, state: str = "scheduled") -> str:
    """The tag value of a simulated scheduled event: `code|not before|id|scheduled or cancelled`."""
    return f"{code}|{not_before.astimezone(UTC).isoformat()}|{event_id}|{state}"


def parse_event_tag(value: str) -> tuple[str, datetime, str, str] | None:
    parts = value.split("|")
    if len(parts) != 4:
        return None
    code, when, event_id, state = parts
    try:
        return code, datetime.fromisoformat(when), event_id, state
    except ValueError:
        return None


def _tag(ec2: Any, instance_id: str, key: str) -> str | None:
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    tags = reservations[0]["Instances"][0].get("Tags", [])
    return next((t["Value"] for t in tags if t["Key"] == key), None)


def retire(ec2: Any, instance_id: str, *, within: timedelta, code: str = "instance-retirement") -> str:
    """Schedule an event for the machine `within` from now; returns its event id."""
    event_id = f"instance-event-{instance_id.removeprefix('i-')[:12]}"
    not_before = datetime.now(UTC) + within
    ec2.create_tags(
        Resources=[instance_id], Tags=[{"Key": EVENT_TAG, "Value": event_tag(code, not_before, event_id)}]
    )
    return event_id


def impair(ec2: Any, instance_id: str, *, status: str = IMPAIRED) -> None:
    ec2.create_tags(Resources=[instance_id], Tags=[{"Key": STATUS_TAG, "Value": status}])


def disconnect(ec2: Any, instance_id: str) -> None:
    """The machine's SSM agent stops answering now (its EC2 checks still pass)."""
    last_ping = datetime.now(UTC).isoformat()
    ec2.create_tags(Resources=[instance_id], Tags=[{"Key": AGENT_LOST_TAG, "Value": last_ping}])


def agent_lost_since(tags: dict[str, str]) -> datetime | None:
    """When the agent of a machine with these tags last answered, if it stopped answering."""
    found = tags.get(AGENT_LOST_TAG)
    try:
        return datetime.fromisoformat(found) if found else None
    except ValueError:
        return None


def recover(ec2: Any, instance_id: str) -> None:
    """Checks pass and the agent answers again; a scheduled event is cancelled."""
    ec2.delete_tags(Resources=[instance_id], Tags=[{"Key": STATUS_TAG}, {"Key": AGENT_LOST_TAG}])
    found = _tag(ec2, instance_id, EVENT_TAG)
    parsed = parse_event_tag(found) if found else None
    if parsed is not None:
        code, not_before, event_id, _ = parsed
        cancelled = event_tag(code, not_before, event_id, CANCELLED)
        ec2.create_tags(Resources=[instance_id], Tags=[{"Key": EVENT_TAG, "Value": cancelled}])


def tags_of(instance: Any) -> dict[str, str]:
    backend_tags = instance.ec2_backend.tags.get(instance.id, {})
    return dict(backend_tags)


_lock = threading.Lock()
_installed = False


def install() -> None:
    """Make moto's DescribeInstanceStatus answer with the simulated signals (once per process)."""
    global _installed  # noqa: PLW0603 - one patch per process, by design
    with _lock:
        if _installed:
            return
        from moto.ec2.models.instances import Instance  # noqa: PLC0415 - moto loads here, not at import

        original = Instance.instance_status

        def instance_status(self: Any) -> dict[str, Any]:
            # The instance check alone: the machine's own fault, not the host's (the system check).
            answer: dict[str, Any] = original.fget(self)  # type: ignore[attr-defined]
            simulated = tags_of(self).get(STATUS_TAG)
            if answer.get("Status") != "ok" or simulated is None:
                return answer
            passed = "failed" if simulated == IMPAIRED else simulated
            return {"Details": [{"Name": "reachability", "Status": passed}], "Status": simulated}

        Instance.instance_status = property(instance_status)  # type: ignore[method-assign,assignment]
        Instance.events = property(_events_of)  # type: ignore[attr-defined]
        _installed = True


def _events_of(instance: Any) -> list[dict[str, Any]]:
    parsed = parse_event_tag(tags_of(instance).get(EVENT_TAG, ""))
    if parsed is None:
        return []
    code, not_before, event_id, state = parsed
    prefix = "[Canceled] " if state == CANCELLED else ""
    return [
        {
            "Code": code,
            "Description": prefix + DESCRIPTION,
            "InstanceEventId": event_id,
            "NotBefore": not_before,
            "NotAfter": not_before + timedelta(hours=2),
        }
    ]
