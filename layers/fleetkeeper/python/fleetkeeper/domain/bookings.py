"""Bookings: placements with a future timeslot that wait for capacity (docs/capacity.md, "Bookings").

A `POST /api/v1/instances` into a pool whose policy has `bookings: true`, with a `timeslot_start` at
least the pool's lead time ahead, that finds no free slot, waits as WAITING_FOR_CAPACITY instead of
failing, while `max_workers` x the template's capacity still has room for it. `lead` below is the pool
template's launch lead time (services/lead_time.launch_lead): how long a new worker takes to RUNNING.

A booking's clock, for a timeslot starting at `t`:
- it should be on a RUNNING worker by `t - lead` (`expected_ready_by`);
- so its worker is asked for one lead time before that, from `t - 2 x lead` on: it is then *due*, raises
  the pool's target, and is placed as soon as a RUNNING worker of the pool has room;
- with less than `lead` left before `t`, still waiting, it is *at risk* (metric and alarm);
- at `t`, still waiting, it has failed: FAILED with reason `no_capacity_by_timeslot`.

A booking keeps the template it asked for, or none when it asked for its pool alone (`takes`): the
pool's policy may change its template while the booking waits.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Final

# The reason a booking that no worker took by its timeslot's start ends FAILED with.
NO_CAPACITY_BY_TIMESLOT: Final = "no_capacity_by_timeslot"
# How far ahead a booking may hold room: a timeslot years away would keep its place in the pool's room
# for ever. Farther placements that find no room are refused as any other (409 NO_CAPACITY).
BOOKING_HORIZON: Final = timedelta(days=366)


class Phase(StrEnum):
    """Where a waiting booking is on its clock at an instant."""

    WAITING = "waiting"  # not due yet: it asks for nothing
    DUE = "due"  # its worker should be coming up: it raises the target and is placed on room
    AT_RISK = "at_risk"  # due, and less than the lead time is left
    OVERDUE = "overdue"  # its timeslot has started: it fails


def bookable(timeslot_start: datetime | None, lead: timedelta, now: datetime) -> bool:
    """Whether a placement with this timeslot may wait for capacity: it starts at least `lead` ahead and
    within BOOKING_HORIZON."""
    return timeslot_start is not None and lead <= timeslot_start - now <= BOOKING_HORIZON


def expected_ready_by(timeslot_start: datetime, lead: timedelta) -> datetime:
    """When the booking should be on a RUNNING worker: one lead time before its timeslot."""
    return timeslot_start - lead


def due_until(now: datetime, lead: timedelta) -> datetime:
    """The latest timeslot start a booking can have and be due at `now` (the cycle's query bound)."""
    return now + 2 * lead


def phase(timeslot_start: datetime, lead: timedelta, now: datetime) -> Phase:
    """The booking's phase at `now`."""
    if now >= timeslot_start:
        return Phase.OVERDUE
    if now > expected_ready_by(timeslot_start, lead):
        return Phase.AT_RISK
    if timeslot_start <= due_until(now, lead):
        return Phase.DUE
    return Phase.WAITING


def takes(booked_template: str | None, template: str | None) -> bool:
    """Whether a worker of `template` may take a booking that asked for `booked_template`: one asked
    for its pool alone (None) goes on any worker of the pool, as a placement asking for the pool alone
    would; one asked for a template keeps it."""
    return booked_template is None or booked_template == template


def booking_room(max_workers: int | None, slots_per_worker: int, occupied: int) -> int:
    """How many bookings the pool may hold waiting: the slots `max_workers` x `slots_per_worker` leave
    beside the `occupied` ones (0 without a cap: an unbounded pool books nothing)."""
    if max_workers is None:
        return 0
    return max(max_workers * max(slots_per_worker, 1) - occupied, 0)
