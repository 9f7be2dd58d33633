"""The capacity policy's rules: what it accepts, and the target it sets at an instant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from fleetkeeper.domain.capacity import (
    BlockedReason,
    CapacityPolicy,
    Rule,
    Shortfall,
    blocked_after,
    blocked_reason,
    capacity_target,
    member_moves,
    problems,
    shortfall,
)
from fleetkeeper.domain.lifecycle import WorkerStatus

BERLIN_MORNINGS = {"schedule": "0 8 * * *", "duration": "2h", "timezone": "Europe/Berlin"}


def policy(**fields: Any) -> CapacityPolicy:
    return CapacityPolicy.model_validate({"template": "lab", "max_workers": 50, **fields})


def error_fields(body: dict[str, Any]) -> list[str]:
    with pytest.raises(ValidationError) as raised:
        CapacityPolicy.model_validate(body)
    return [".".join(str(p) for p in e["loc"]) for e in raised.value.errors()]


def capped(cap: int = 9, **fields: Any) -> dict[str, Any]:
    return {"template": "lab", "max_workers": cap, **fields}


def raising(**fields: Any) -> list[dict[str, Any]]:
    return [{**BERLIN_MORNINGS, "min_workers": 1, **fields}]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (capped(4, min_workers=5), "max_workers"),
        ({"template": "lab"}, "max_workers"),
        ({"min_workers": 1}, "min_workers"),
        ({"headroom_slots": 4}, "headroom_slots"),
        ({"warm_workers": 2}, "warm_workers"),
        ({"bookings": True}, "bookings"),
        ({"schedules": raising()}, "schedules"),
        (capped(2, warm_workers=3), "warm_workers"),
        (capped(2, schedules=raising(min_workers=3)), "schedules"),
        (capped(schedules=[{"schedule": "0 8 * * *", "min_workers": 1}]), "schedules.0.duration"),
        (capped(schedules=raising(timezone="Europe/Atlantis")), "schedules.0.timezone"),
        (capped(schedules=raising(schedule="0 8 * * mon-fry")), "schedules.0.schedule"),
        (capped(schedules=[BERLIN_MORNINGS]), "schedules.0.warm_workers"),
        (capped(schedules=[{"duration": "2h", "min_workers": 1}]), "schedules.0.schedule"),
        (capped(10_001), "max_workers"),
        (capped(min_workers=1.0), "min_workers"),
        (capped(nodes=1), "nodes"),
        (capped(schedules=raising() * 21), "schedules"),
    ],
)
def test_given_a_bad_policy_when_validated_then_the_error_names_the_field(
    body: dict[str, Any], field: str
) -> None:
    assert error_fields(body) == [field]


def test_given_a_policy_without_a_template_then_it_asks_for_nothing() -> None:
    empty = CapacityPolicy()

    assert (empty.active, empty.max_workers, empty.min_workers) == (False, None, 0)
    assert CapacityPolicy(max_workers=3).active is False


def test_given_headroom_that_max_workers_cannot_hold_then_problems_name_the_field() -> None:
    asked = policy(max_workers=2, headroom_slots=9, schedules=[{**BERLIN_MORNINGS, "headroom_slots": 10}])

    assert [field for field, _ in problems(asked, slots_per_worker=4)] == [
        "capacity.headroom_slots",
        "capacity.schedules.0.headroom_slots",
    ]
    assert problems(asked, slots_per_worker=5) == []


def test_given_min_workers_only_then_it_sets_the_target() -> None:
    target = capacity_target(
        policy(min_workers=3), datetime(2025, 1, 6, tzinfo=UTC), running=1, free_slots=4, slots_per_worker=4
    )

    assert (target.workers, target.rule, target.capped) == (3, Rule.MIN_WORKERS, False)


def test_given_headroom_then_the_target_adds_workers_for_the_missing_free_slots() -> None:
    at = datetime(2025, 1, 6, tzinfo=UTC)
    asked = policy(min_workers=1, headroom_slots=6)

    # Two RUNNING workers with 1 free slot between them need 5 more slots: two workers of 4.
    target = capacity_target(asked, at, running=2, free_slots=1, slots_per_worker=4)
    assert (target.workers, target.rule) == (4, Rule.HEADROOM)
    # Enough free slots already: the running workers are the target.
    assert capacity_target(asked, at, running=2, free_slots=6, slots_per_worker=4).workers == 2


def test_given_a_target_above_max_workers_then_it_is_capped_and_says_so() -> None:
    target = capacity_target(
        policy(max_workers=3, headroom_slots=12),
        datetime(2025, 1, 6, tzinfo=UTC),
        running=0,
        free_slots=0,
        slots_per_worker=4,
    )
    assert (target.workers, target.capped, target.wanted) == (3, False, 3)

    bookings = capacity_target(
        policy(max_workers=3),
        datetime(2025, 1, 6, tzinfo=UTC),
        running=0,
        free_slots=0,
        slots_per_worker=4,
        bookings=20,
    )
    assert (bookings.workers, bookings.wanted, bookings.capped, bookings.rule) == (3, 5, True, Rule.BOOKINGS)


def test_given_warm_workers_then_they_fill_what_the_cap_leaves() -> None:
    at = datetime(2025, 1, 6, tzinfo=UTC)

    assert (
        capacity_target(
            policy(max_workers=5, min_workers=2, warm_workers=2),
            at,
            running=0,
            free_slots=0,
            slots_per_worker=1,
        ).warm
        == 2
    )
    assert (
        capacity_target(
            policy(max_workers=5, min_workers=4, warm_workers=2),
            at,
            running=0,
            free_slots=0,
            slots_per_worker=1,
        ).warm
        == 1
    )


def test_given_a_berlin_schedule_then_it_applies_at_08_local_through_both_dst_changes() -> None:
    asked = policy(schedules=[{**BERLIN_MORNINGS, "headroom_slots": 40, "warm_workers": 3}])

    def target_at(at: datetime) -> tuple[int, Rule, int | None, int]:
        found = capacity_target(asked, at, running=0, free_slots=0, slots_per_worker=4)
        return found.workers, found.rule, found.schedule, found.warm

    # Winter (CET, UTC+1): 08:00 local is 07:00 UTC. Saturday 29 March 2025, the day before the change.
    assert target_at(datetime(2025, 3, 29, 7, 0, tzinfo=UTC)) == (10, Rule.SCHEDULE, 0, 3)
    assert target_at(datetime(2025, 3, 29, 6, 59, tzinfo=UTC))[1] == Rule.MIN_WORKERS
    # Sunday 30 March 2025, clocks spring forward at 02:00: 08:00 CEST is 06:00 UTC.
    assert target_at(datetime(2025, 3, 30, 6, 0, tzinfo=UTC)) == (10, Rule.SCHEDULE, 0, 3)
    assert target_at(datetime(2025, 3, 30, 5, 59, tzinfo=UTC))[0] == 0
    # The window lasts two elapsed hours: open at 07:59 UTC, closed at 08:00 UTC.
    assert target_at(datetime(2025, 3, 30, 7, 59, tzinfo=UTC))[1] == Rule.SCHEDULE
    assert target_at(datetime(2025, 3, 30, 8, 0, tzinfo=UTC)) == (0, Rule.MIN_WORKERS, None, 0)
    # Sunday 26 October 2025, clocks fall back at 03:00: 08:00 CET is 07:00 UTC again.
    assert target_at(datetime(2025, 10, 25, 6, 0, tzinfo=UTC))[1] == Rule.SCHEDULE
    assert target_at(datetime(2025, 10, 26, 6, 0, tzinfo=UTC))[1] == Rule.MIN_WORKERS
    assert target_at(datetime(2025, 10, 26, 7, 0, tzinfo=UTC))[1] == Rule.SCHEDULE
    assert target_at(datetime(2025, 10, 26, 9, 0, tzinfo=UTC))[1] == Rule.MIN_WORKERS


def test_given_rules_that_tie_then_the_first_named_sets_the_target() -> None:
    at = datetime(2025, 1, 6, 8, 30, tzinfo=UTC)
    asked = policy(min_workers=2, schedules=[{"schedule": "0 8 * * *", "duration": "1h", "min_workers": 2}])

    target = capacity_target(asked, at, running=0, free_slots=0, slots_per_worker=4)
    assert (target.rule, target.schedules) == (Rule.MIN_WORKERS, (0,))


def test_given_a_target_then_the_shortfall_starts_warm_workers_before_creating_any() -> None:
    at = datetime(2025, 1, 6, tzinfo=UTC)
    target = capacity_target(
        policy(min_workers=6, warm_workers=1), at, running=2, free_slots=0, slots_per_worker=4
    )

    # 4 missing, 1 launching already: 3 to bring up, 2 of them warm; one created to run, one to refill.
    found = shortfall(target, running=2, launching=1, refilling=0, stopping=0, stopped=2)
    assert (found.start, found.create, found.warm) == (2, 2, 1)
    # At target with its warm worker (stopped, still stopping or still launching): nothing to do.
    assert shortfall(target, running=6, launching=0, refilling=0, stopping=0, stopped=1) == Shortfall(0, 0, 0)
    assert shortfall(target, running=6, launching=0, refilling=0, stopping=1, stopped=0) == Shortfall(0, 0, 0)
    # A warm worker being launched counts for the warm set: it is never asked for twice.
    assert shortfall(target, running=6, launching=0, refilling=1, stopping=0, stopped=0).create == 0


def test_given_refills_of_the_warm_set_launching_then_every_missing_running_worker_is_still_woken() -> None:
    at = datetime(2025, 1, 6, tzinfo=UTC)
    target = capacity_target(
        policy(min_workers=6, warm_workers=2), at, running=2, free_slots=0, slots_per_worker=4
    )

    # 4 RUNNING missing and 4 warm: all 4 start now; the 2 refills in flight are the warm set's.
    found = shortfall(target, running=2, launching=0, refilling=2, stopping=0, stopped=4)
    assert found == Shortfall(start=4, create=0, warm=0)
    # With only 2 warm to start, the other 2 are launched to run, not left to the refills.
    assert shortfall(target, running=2, launching=0, refilling=2, stopping=0, stopped=2) == Shortfall(2, 2, 0)


def test_given_more_workers_launching_to_run_than_the_target_then_the_warm_set_is_still_refilled() -> None:
    at = datetime(2025, 1, 6, tzinfo=UTC)
    target = capacity_target(
        policy(min_workers=2, warm_workers=2), at, running=1, free_slots=0, slots_per_worker=4
    )

    assert shortfall(target, running=1, launching=3, refilling=0, stopping=0, stopped=0) == Shortfall(0, 2, 2)


def test_given_a_worker_joining_or_leaving_a_pool_then_its_member_count_moves_once() -> None:
    assert member_moves(None, ("labs", WorkerStatus.PENDING)) == {"labs": 1}
    assert member_moves(("labs", WorkerStatus.RUNNING), ("labs", WorkerStatus.STOPPED)) == {}
    assert member_moves(("labs", WorkerStatus.TERMINATING), ("labs", WorkerStatus.TERMINATED)) == {"labs": -1}
    assert member_moves(("labs", WorkerStatus.PENDING), ("labs", WorkerStatus.FAILED)) == {"labs": -1}
    assert member_moves(("labs", WorkerStatus.TERMINATED), ("labs", WorkerStatus.RUNNING)) == {"labs": 1}
    assert member_moves(None, (None, WorkerStatus.PENDING)) == {}


def test_given_capacity_refusals_in_a_row_then_the_backoff_doubles_and_other_errors_block_nothing() -> None:
    now = datetime(2025, 1, 6, tzinfo=UTC)
    first = blocked_after(None, "InsufficientInstanceCapacity", "no m5.large", now)
    assert first is not None
    assert (first.reason, first.retry_at - now, first.refusals) == (
        BlockedReason.INSUFFICIENT_CAPACITY,
        timedelta(minutes=1),
        1,
    )
    # A second refusal within the backoff is the same one.
    assert blocked_after(first, "InsufficientInstanceCapacity", None, now + timedelta(seconds=30)) == first
    later = now + timedelta(minutes=2)
    second = blocked_after(first, "VcpuLimitExceeded", None, later)
    assert second is not None
    assert (second.reason, second.retry_at - later, second.since) == (
        BlockedReason.QUOTA,
        timedelta(minutes=2),
        now,
    )
    assert blocked_after(None, "InvalidAMIID.NotFound", None, now) is None
    assert blocked_reason("RequestLimitExceeded") == BlockedReason.THROTTLED
