"""Local stand-ins for EventBridge: a scheduler for the reconcile/discover functions and an EC2 event pump.

Both run on daemon threads with start()/stop(), call the real handlers in-process with the event
shapes AWS sends (fleetkeeper_local.event_shapes), and never stop on a failed invocation: they log it
and go on, as a schedule would.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetkeeper_local import health
from fleetkeeper_local.event_shapes import health_event, schedule_input, state_change_event
from fleetkeeper_local.faults import EventStreamFaults, unhooked_client
from fleetkeeper_local.invocation import invoke
from fleetkeeper_local.loop import Loop
from fleetkeeper_local.stack import LOCAL_REGION

log = logging.getLogger("fleetkeeper_local.scheduler")

# Local intervals: short, so a user sees a worker move within seconds; AWS runs 60 s and 300 s.
DEFAULT_RECONCILE_SECONDS = 5.0
DEFAULT_DISCOVER_SECONDS = 30.0
DEFAULT_PUMP_SECONDS = 1.0


@dataclass(frozen=True)
class Schedule:
    name: str
    function: str
    every_seconds: float
    payload: dict[str, str] = field(default_factory=dict)


def default_schedules(region: str = LOCAL_REGION) -> list[Schedule]:
    """The reconcile schedule and the region's discovery schedule, with the stack's inputs.

    Intervals come from FLEETKEEPER_LOCAL_RECONCILE_SECONDS and FLEETKEEPER_LOCAL_DISCOVER_SECONDS.
    """
    return [
        Schedule(
            "fleetkeeper-reconcile",
            "reconcile",
            float(os.environ.get("FLEETKEEPER_LOCAL_RECONCILE_SECONDS", DEFAULT_RECONCILE_SECONDS)),
            schedule_input("reconcile"),
        ),
        Schedule(
            f"fleetkeeper-discover-{region}",
            "discover",
            float(os.environ.get("FLEETKEEPER_LOCAL_DISCOVER_SECONDS", DEFAULT_DISCOVER_SECONDS)),
            schedule_input("discover", region=region),
        ),
    ]


def _log_failure(name: str, interval: float) -> Callable[[Exception], None]:
    def report(_: Exception) -> None:
        log.exception("%s failed; trying again in %.1fs", name, interval)

    return report


class LocalScheduler:
    """Invokes the reconcile and discover handlers on short intervals with the schedules' inputs."""

    def __init__(self, schedules: list[Schedule] | None = None, *, region: str = LOCAL_REGION) -> None:
        self.schedules = schedules if schedules is not None else default_schedules(region)
        self._loops = [
            Loop(s.name, s.every_seconds, self._invoker(s), _log_failure(s.name, s.every_seconds))
            for s in self.schedules
        ]

    @staticmethod
    def _invoker(schedule: Schedule) -> Callable[[], Any]:
        def fire() -> Any:
            return invoke(schedule.function, dict(schedule.payload))

        return fire

    def start(self) -> None:
        for loop in self._loops:
            loop.start()

    def stop(self) -> None:
        for loop in self._loops:
            loop.stop()


class Ec2EventPump:
    """Polls the emulated EC2, diffs instance states and delivers 'EC2 Instance State-change
    Notification' events, because moto emits none.

    The first poll only takes a baseline. Afterwards every new instance and every state change is
    delivered, in the order seen, to the ec2_events handler (or to `deliver`). With `faults`, the
    events are duplicated, reordered, delayed or corrupted as EventBridge may deliver them.
    """

    def __init__(
        self,
        ec2: Any = None,
        *,
        region: str = LOCAL_REGION,
        interval_seconds: float | None = None,
        deliver: Callable[[dict[str, Any]], Any] | None = None,
        faults: EventStreamFaults | None = None,
    ) -> None:
        self._ec2 = ec2
        self.faults = faults
        self._region = region
        self._deliver = deliver or (lambda event: invoke("ec2_events", event))
        self._states: dict[str, str] | None = None
        # Each machine's simulated scheduled event as last seen (health.py): a change is a Health event.
        self._scheduled: dict[str, str] = {}
        interval = interval_seconds or float(
            os.environ.get("FLEETKEEPER_LOCAL_EVENT_PUMP_SECONDS", DEFAULT_PUMP_SECONDS)
        )
        name = "ec2-event-pump"
        self._loop = Loop(name, interval, self.poll_once, _log_failure(name, interval))

    def _client(self) -> Any:
        # The pump stands in for EventBridge, not for a caller of the EC2 API: it polls outside the
        # account's request budget (aws_rules) and the fault plans.
        if self._ec2 is None:
            self._ec2 = unhooked_client("ec2", self._region)
        return self._ec2

    def _current_states(self) -> tuple[dict[str, str], dict[str, str]]:
        """Each machine's state, and the simulated scheduled event of those that have one."""
        states: dict[str, str] = {}
        scheduled: dict[str, str] = {}
        for page in self._client().get_paginator("describe_instances").paginate():
            for reservation in page.get("Reservations", []):
                for instance in reservation.get("Instances", []):
                    states[instance["InstanceId"]] = instance["State"]["Name"]
                    tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
                    if health.EVENT_TAG in tags:
                        scheduled[instance["InstanceId"]] = tags[health.EVENT_TAG]
        return states, scheduled

    def poll_once(self) -> list[dict[str, Any]]:
        """Deliver an event for each state change since the last poll, and a Health event for each
        scheduled event simulated or cancelled since; returns the events delivered."""
        current, scheduled = self._current_states()
        previous, self._states = self._states, current
        seen, self._scheduled = self._scheduled, scheduled
        if previous is None:
            return []
        events = [
            state_change_event(instance_id, state, region=self._region)
            for instance_id, state in sorted(current.items())
            if previous.get(instance_id) != state
        ]
        for instance_id, value in sorted(scheduled.items()):
            parsed = health.parse_event_tag(value)
            if seen.get(instance_id) == value or parsed is None:
                continue
            code, not_before, event_id, state = parsed
            events.append(
                health_event(
                    instance_id,
                    code=code,
                    not_before=not_before,
                    event_id=event_id,
                    closed=state == health.CANCELLED,
                    region=self._region,
                )
            )
        if self.faults is not None:
            events = self.faults.mutate(events)
        return self.deliver(events)

    def deliver(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Hand each event to the handler; a failed delivery is logged, the next one still goes."""
        for event in events:
            try:
                self._deliver(event)
            except Exception:
                if self._loop.stopping:
                    break  # the stack stops under it: no traceback, and no more deliveries
                log.exception("delivering %s failed", event.get("detail"))
        return events

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
