"""A booking's clock, its room under max_workers, its legal moves and its index keys."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetkeeper.domain.bookings import (
    BOOKING_HORIZON,
    Phase,
    bookable,
    booking_room,
    due_until,
    expected_ready_by,
    phase,
    takes,
)
from fleetkeeper.domain.capacity import CapacityPolicy, Rule, capacity_target
from fleetkeeper.domain.errors import IllegalTransition
from fleetkeeper.domain.lifecycle import InstanceState, check_instance_transition
from fleetkeeper.domain.models import Instance
from fleetkeeper.store import keys

S = InstanceState
LEAD = timedelta(minutes=10)
SLOT = datetime(2030, 3, 4, 9, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("before_slot", "expected"),
    [
        (timedelta(minutes=30), Phase.WAITING),
        (timedelta(minutes=20), Phase.DUE),  # two lead times ahead: its worker is asked for now
        (timedelta(minutes=10), Phase.DUE),  # exactly when it should be ready: still on time
        (timedelta(minutes=9), Phase.AT_RISK),
        (timedelta(0), Phase.OVERDUE),
        (-timedelta(minutes=1), Phase.OVERDUE),
    ],
)
def test_given_the_time_left_before_a_timeslot_then_the_booking_is_in_its_phase(
    before_slot: timedelta, expected: Phase
) -> None:
    assert phase(SLOT, LEAD, SLOT - before_slot) == expected


def test_given_a_timeslot_then_it_is_bookable_only_a_lead_time_ahead_and_ready_one_lead_before() -> None:
    assert bookable(SLOT, LEAD, SLOT - LEAD)
    assert not bookable(SLOT, LEAD, SLOT - LEAD + timedelta(seconds=1))
    assert not bookable(None, LEAD, SLOT - timedelta(days=1))


def test_given_a_timeslot_beyond_the_horizon_then_it_cannot_wait_for_capacity() -> None:
    assert bookable(SLOT, LEAD, SLOT - BOOKING_HORIZON)
    assert not bookable(SLOT, LEAD, SLOT - BOOKING_HORIZON - timedelta(seconds=1))
    assert expected_ready_by(SLOT, LEAD) == SLOT - LEAD
    assert due_until(SLOT - 2 * LEAD, LEAD) == SLOT


def test_given_max_workers_then_the_room_for_bookings_is_what_the_occupied_slots_leave() -> None:
    assert booking_room(2, 4, occupied=5) == 3
    assert booking_room(2, 4, occupied=9) == 0
    assert booking_room(None, 4, occupied=0) == 0


def test_given_a_booking_then_one_for_the_pool_alone_takes_any_template_and_one_for_a_template_its_own() -> (
    None
):
    assert takes(None, "lab-v2")
    assert takes("lab", "lab")
    assert not takes("lab", "lab-v2")


def test_given_a_waiting_booking_then_it_is_placed_failed_or_ended_and_nothing_else() -> None:
    for target in (S.SCHEDULED, S.FAILED, S.TERMINATED):
        check_instance_transition(S.WAITING_FOR_CAPACITY, target)
    for target in (S.INSTANTIATING, S.RUNNING, S.COMPLETED):
        with pytest.raises(IllegalTransition):
            check_instance_transition(S.WAITING_FOR_CAPACITY, target)
    with pytest.raises(IllegalTransition):
        check_instance_transition(S.SCHEDULED, S.WAITING_FOR_CAPACITY)


def test_given_bookings_due_then_they_set_the_target_and_say_how_many() -> None:
    policy = CapacityPolicy(template="lab", max_workers=5, bookings=True)

    target = capacity_target(policy, SLOT, running=1, free_slots=0, slots_per_worker=4, bookings=6)

    assert (target.workers, target.rule, target.bookings) == (3, Rule.BOOKINGS, 6)
    assert capacity_target(policy, SLOT, running=1, free_slots=0, slots_per_worker=4).rule == Rule.MIN_WORKERS


def test_given_a_waiting_booking_then_its_pool_queue_is_its_parent_ordered_by_timeslot() -> None:
    booking = Instance(id="i-1", worker_id="", pool="labs", state=S.WAITING_FOR_CAPACITY, timeslot_start=SLOT)
    placed = booking.model_copy(update={"worker_id": "w-1", "state": S.SCHEDULED})
    failed = booking.model_copy(update={"state": S.FAILED})

    waiting = keys.instance_index_attributes(booking)

    assert (waiting["GSI2PK"], waiting["GSI2SK"]) == ("BOOKINGS#labs", "2030-03-04T09:00:00.000000Z#i-1")
    assert keys.booking_sort(SLOT) < keys.booking_sort(SLOT + timedelta(microseconds=1))
    assert keys.instance_index_attributes(placed)["GSI2PK"] == "WORKER#w-1"
    assert "GSI2PK" not in keys.instance_index_attributes(failed)
