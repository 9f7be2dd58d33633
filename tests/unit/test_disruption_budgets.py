"""Disruption budgets: windows in their time zone across DST, the most restrictive budget, percentages,
and what a budget refuses to parse."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from pydantic import ValidationError

from fleetkeeper.domain.disruption import (
    Budget,
    DisruptionPolicy,
    DisruptionReason,
    PoolLoad,
    _blocked_until,  # the memo the test inspects
    assess,
    blocked_until,
    exceeded,
    pool_loads,
    pool_of_scope,
    window_at,
)
from fleetkeeper.domain.lifecycle import WorkerStatus

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")
SCALE_DOWN = DisruptionReason.SCALE_DOWN
ROLLOUT = DisruptionReason.ROLLOUT


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def budget(schedule: str | None = None, duration: str | None = None, tz: str | None = None, **kw) -> Budget:
    return Budget(max=kw.pop("max", 0), schedule=schedule, duration=duration, timezone=tz, **kw)


# ---- windows -----------------------------------------------------------------------------------------


def test_given_no_schedule_then_the_budget_always_applies():
    window = window_at(budget(), utc(2026, 3, 2, 3, 0))

    assert (window.active, window.until, window.next_start) == (True, None, None)


def test_given_a_working_hours_window_in_berlin_then_it_applies_from_its_start_until_duration_later():
    office = budget("0 9 * * mon-fri", "8h", "Europe/Berlin")

    # Monday 2 March 2026, CET (UTC+1): 09:00 local is 08:00 UTC.
    assert window_at(office, utc(2026, 3, 2, 7, 59)).next_start == utc(2026, 3, 2, 8, 0)
    assert not window_at(office, utc(2026, 3, 2, 7, 59)).active
    assert window_at(office, utc(2026, 3, 2, 8, 0)).until == utc(2026, 3, 2, 16, 0)
    # Half-open: at the end the window no longer applies, and the next one is the next weekday's.
    assert window_at(office, utc(2026, 3, 2, 16, 0)).next_start == utc(2026, 3, 3, 8, 0)
    # Friday's window is followed by Monday's.
    assert window_at(office, utc(2026, 3, 6, 16, 0)).next_start == utc(2026, 3, 9, 8, 0)


def test_given_a_start_inside_berlins_spring_forward_gap_then_the_window_starts_right_after_the_gap():
    night = budget("30 2 * * *", "1h", "Europe/Berlin")

    # 29 March 2026: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist that night.
    before = window_at(night, utc(2026, 3, 29, 0, 59))
    during = window_at(night, utc(2026, 3, 29, 1, 0))

    assert (before.active, before.next_start) == (False, utc(2026, 3, 29, 1, 0))
    assert during.active
    assert during.until == utc(2026, 3, 29, 2, 0)
    assert during.until.astimezone(BERLIN).hour == 4  # a full hour of elapsed time, 03:00 to 04:00
    # The next night is back at 02:30, now CEST.
    assert window_at(night, utc(2026, 3, 29, 2, 0)).next_start == utc(2026, 3, 30, 0, 30)


def test_given_a_start_at_a_time_berlins_fall_back_repeats_then_the_window_starts_once_at_the_first():
    night = budget("30 2 * * *", "1h", "Europe/Berlin")

    # 25 October 2026: 03:00 CEST falls back to 02:00 CET; 02:30 happens at 00:30 and at 01:30 UTC.
    first = window_at(night, utc(2026, 10, 25, 0, 30))
    second_copy = window_at(night, utc(2026, 10, 25, 1, 30))

    assert (first.active, first.until) == (True, utc(2026, 10, 25, 1, 30))
    assert not second_copy.active
    assert second_copy.next_start == utc(2026, 10, 26, 1, 30)


def test_given_new_york_dst_changes_then_the_same_rules_hold():
    early = budget("30 2 * * *", "1h", "America/New_York")
    late = budget("30 1 * * *", "1h", "America/New_York")

    # 8 March 2026: 02:00 EST jumps to 03:00 EDT (07:00 UTC).
    spring = window_at(early, utc(2026, 3, 8, 6, 59))
    assert spring.next_start == utc(2026, 3, 8, 7, 0)
    assert spring.next_start.astimezone(NEW_YORK).hour == 3
    # 1 November 2026: 01:30 happens at 05:30 UTC (EDT) and at 06:30 UTC (EST); the window starts once.
    assert window_at(late, utc(2026, 11, 1, 5, 30)).until == utc(2026, 11, 1, 6, 30)
    assert not window_at(late, utc(2026, 11, 1, 6, 30)).active
    assert window_at(late, utc(2026, 11, 1, 6, 30)).next_start == utc(2026, 11, 2, 6, 30)


def test_given_a_window_across_a_dst_change_then_its_duration_is_elapsed_time_not_wall_time():
    overnight = budget("0 22 * * sat", "8h", "Europe/Berlin")

    # Saturday 28 March 2026, 22:00 CET (21:00 UTC); the clocks jump that night.
    window = window_at(overnight, utc(2026, 3, 28, 21, 0))

    assert window.until == utc(2026, 3, 29, 5, 0)
    assert window.until.astimezone(BERLIN).hour == 7  # 8 real hours end at 07:00 CEST, not 06:00


def test_given_an_hourly_schedule_then_both_copies_of_the_repeated_hour_start_a_window():
    hourly = budget("0 * * * *", "30m", "Europe/Berlin")

    assert window_at(hourly, utc(2026, 10, 25, 0, 10)).active  # 02:10 CEST
    assert window_at(hourly, utc(2026, 10, 25, 1, 10)).active  # 02:10 CET
    assert not window_at(hourly, utc(2026, 10, 25, 1, 40)).active


def test_given_a_window_that_crosses_midnight_then_it_applies_on_the_next_day_until_its_end():
    friday_night = budget("0 22 * * fri", "4h")

    # Friday 6 March 2026 22:00 UTC to Saturday 02:00.
    saturday = window_at(friday_night, utc(2026, 3, 7, 1, 30))

    assert (saturday.active, saturday.until) == (True, utc(2026, 3, 7, 2, 0))
    assert not window_at(friday_night, utc(2026, 3, 7, 2, 0)).active
    assert not window_at(friday_night, utc(2026, 3, 5, 23, 0)).active  # a Thursday


def test_given_a_duration_longer_than_the_schedules_period_then_the_windows_make_one():
    daily = budget("0 9 * * *", "36h")
    hourly = budget("0 * * * *", "90m")
    weekdays = budget("0 9 * * mon-fri", "30h")

    # Every day at 09:00 for 36 hours: never a gap.
    always = window_at(daily, utc(2026, 3, 2, 8, 59))
    assert always.active
    assert always.until is not None
    assert always.until - utc(2026, 3, 2, 8, 59) > timedelta(days=20)
    assert window_at(hourly, utc(2026, 3, 2, 10, 59)).active
    # Monday 09:00 to Saturday 15:00: Friday's window ends 30h after Friday 09:00.
    assert window_at(weekdays, utc(2026, 3, 3, 12, 0)).until == utc(2026, 3, 7, 15, 0)
    assert window_at(weekdays, utc(2026, 3, 7, 15, 0)).next_start == utc(2026, 3, 9, 9, 0)


# ---- assessing ---------------------------------------------------------------------------------------


def test_given_max_zero_in_a_window_then_it_is_a_freeze_and_outside_it_no_pool_budget_applies():
    policy = DisruptionPolicy(budgets=[budget("0 9 * * mon-fri", "8h", "Europe/Berlin", max=0)])

    frozen = assess(policy, SCALE_DOWN, utc(2026, 3, 2, 9, 0), members=10, in_use=0)
    night = assess(policy, SCALE_DOWN, utc(2026, 3, 2, 20, 0), members=10, in_use=0)

    assert (frozen.allowed, frozen.limiting, frozen.admits) == (0, 0, False)
    assert frozen.next_change == utc(2026, 3, 2, 16, 0)
    # Outside every window the stage default governs the reason.
    assert (night.allowed, night.applying, night.admits) == (None, (), True)
    assert night.next_change == utc(2026, 3, 3, 8, 0)


def test_given_several_budgets_then_the_most_restrictive_that_covers_the_reason_wins():
    policy = DisruptionPolicy(
        budgets=[
            Budget(max=5),
            Budget(max="10%"),
            budget("0 9 * * *", "8h", max=0, reasons=[ROLLOUT]),
        ]
    )
    at = utc(2026, 3, 2, 10, 0)

    scale_down = assess(policy, SCALE_DOWN, at, members=30, in_use=2)
    rollout = assess(policy, ROLLOUT, at, members=30, in_use=0)

    assert (scale_down.allowed, scale_down.limiting, scale_down.applying) == (3, 1, (0, 1))
    assert (scale_down.available, scale_down.admits) == (1, True)
    assert (rollout.allowed, rollout.limiting, rollout.admits) == (0, 2, False)


@pytest.mark.parametrize(
    ("maximum", "members", "allowed"),
    [("10%", 3, 1), ("10%", 10, 1), ("25%", 10, 3), ("0%", 50, 0), ("100%", 0, 0), ("50%", 7, 4), (2, 1, 2)],
)
def test_given_a_percentage_then_it_is_of_the_pools_members_rounded_up(maximum, members, allowed):
    assert Budget(max=maximum).allowed(members) == allowed


def test_given_a_freeze_then_it_is_blocked_until_the_window_ends_unless_another_budget_still_blocks():
    freeze = budget("0 9 * * *", "8h", max=0)
    policy = DisruptionPolicy(budgets=[freeze])
    also_one = DisruptionPolicy(budgets=[freeze, Budget(max=1)])

    assert blocked_until(policy, SCALE_DOWN, utc(2026, 3, 2, 10, 0), members=4, in_use=0) == utc(
        2026, 3, 2, 17, 0
    )
    # One in use and an always-on budget of one: the window's end frees nothing.
    assert blocked_until(also_one, SCALE_DOWN, utc(2026, 3, 2, 10, 0), members=4, in_use=1) is None
    assert blocked_until(also_one, SCALE_DOWN, utc(2026, 3, 2, 10, 0), members=4, in_use=0) == utc(
        2026, 3, 2, 17, 0
    )


def test_given_an_operator_disruption_beyond_a_budget_then_the_most_restrictive_exceeded_one_is_named():
    policy = DisruptionPolicy(budgets=[Budget(max=3), Budget(max="10%"), budget("0 9 * * *", "1h", max=0)])

    assert exceeded(policy, utc(2026, 3, 2, 12, 0), members=20, in_use=2) is None
    over = exceeded(policy, utc(2026, 3, 2, 12, 0), members=20, in_use=3)
    assert over is not None
    assert (over.index, over.allowed) == (1, 2)
    in_window = exceeded(policy, utc(2026, 3, 2, 9, 0), members=20, in_use=1)
    assert in_window is not None
    assert in_window.index == 2


# ---- counting ----------------------------------------------------------------------------------------


def test_given_scopes_then_their_pools_are_counted_with_members_and_disruptions():
    cells = {
        ("lab#labs", WorkerStatus.RUNNING): 3,
        ("big#labs", WorkerStatus.DRAINING): 1,
        ("lab#labs", WorkerStatus.STOPPED): 4,
        ("lab#batch", WorkerStatus.STOPPING): 2,
        ("lab#-", WorkerStatus.DRAINING): 5,
    }

    assert pool_of_scope("lab#-") is None
    assert pool_of_scope("lab#labs") == "labs"
    assert pool_loads(cells) == {"labs": PoolLoad(4, 1), "batch": PoolLoad(2, 2)}


# ---- what a budget refuses ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"max": True}, "max"),
        ({"max": -1}, "max"),
        ({"max": "101%"}, "max"),
        ({"max": "12.5%"}, "max"),
        ({"max": 1, "reasons": ["nap"]}, "reasons.0"),
        ({"max": 1, "reasons": ["drift", "drift"]}, "reasons"),
        ({"max": 1, "reasons": []}, "reasons"),
        ({"max": 1, "schedule": "0 9 * *", "duration": "1h"}, "schedule"),
        ({"max": 1, "schedule": "0 0 9 * * *", "duration": "1h"}, "schedule"),
        ({"max": 1, "schedule": "0 25 * * *", "duration": "1h"}, "schedule"),
        ({"max": 1, "schedule": "0 9 * * mon-fry", "duration": "1h"}, "schedule"),
        ({"max": 1, "schedule": "0 9 * * *"}, "duration"),
        ({"max": 1, "duration": "1h"}, "duration"),
        ({"max": 1, "schedule": "0 9 * * *", "duration": "8 hours"}, "duration"),
        ({"max": 1, "schedule": "0 9 * * *", "duration": "30s"}, "duration"),
        ({"max": 1, "schedule": "0 9 * * *", "duration": "400d"}, "duration"),
        ({"max": 1, "schedule": "0 9 * * *", "duration": "1h", "timezone": "Europe/Berlín"}, "timezone"),
        ({"max": 1, "schedule": "0 9 * * *", "duration": "1h", "timezone": "../etc/passwd"}, "timezone"),
        ({"max": 1, "timezone": "UTC"}, "timezone"),
    ],
)
def test_given_a_bad_budget_then_the_error_names_the_field(fields, field):
    with pytest.raises(ValidationError) as raised:
        Budget(**fields)

    assert [".".join(str(p) for p in e["loc"]) for e in raised.value.errors()] == [field]


def test_given_text_counts_and_spacing_then_the_budget_is_held_in_one_form():
    parsed = Budget(max="3", schedule=" 0  9 * *   mon-fri ", duration="8h", timezone="Europe/Berlin")

    assert (parsed.max, parsed.schedule) == (3, "0 9 * * mon-fri")
    assert Budget(max="007%").max == "7%"


def test_given_overlapping_windows_when_many_refusals_ask_at_one_instant_then_the_answer_is_computed_once():
    # Windows that overlap (every 5 minutes for 90) are one long window: its end is a walk over many
    # matches. A rollout step asks for each worker it may not drain, at the step's one instant.
    policy = DisruptionPolicy(
        budgets=[
            Budget(
                max=1,
                reasons=[DisruptionReason.ROLLOUT],
                schedule=f"*/{m} * * * *",
                duration="90m",
                timezone=zone,
            )
            for m, zone in ((15, "Europe/Berlin"), (10, "Asia/Tokyo"), (5, "America/New_York"))
        ]
    )
    at = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    first = blocked_until(policy, DisruptionReason.ROLLOUT, at, members=10, in_use=1)
    before = _blocked_until.cache_info()

    again = [blocked_until(policy, DisruptionReason.ROLLOUT, at, members=10, in_use=1) for _ in range(25)]

    after = _blocked_until.cache_info()
    assert again == [first] * 25
    assert (after.hits - before.hits, after.misses - before.misses) == (25, 0)
