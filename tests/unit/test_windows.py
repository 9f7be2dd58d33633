"""Cron windows (domain/windows.py): defects found across DST changes, validation of each field, and
what an answer costs."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from itertools import islice, takewhile
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from pydantic import ValidationError

from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason, blocked_until, window_at
from fleetkeeper.domain.windows import (
    HORIZON,
    CronWindow,
    Window,
    _cron,
    _days_of_year,
    check_duration,
    check_schedule,
    zone_of,
)

SCALE_DOWN = DisruptionReason.SCALE_DOWN


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def minutes(first: datetime, last: datetime) -> list[datetime]:
    """Every minute from `first` up to `last`, excluded."""
    return [first + timedelta(minutes=n) for n in range((last - first) // timedelta(minutes=1))]


def active_minutes(window: CronWindow, first: datetime, last: datetime) -> list[datetime]:
    return [m for m in minutes(first, last) if window.window_at(m).active]


# ---- defects found by a review, each across a DST change ---------------------------------------------


def test_given_new_yorks_fall_back_when_a_90m_window_starts_at_0130_then_it_applies_90_real_minutes():
    # 3 November 2024: 02:00 EDT falls back to 01:00 EST. 01:30 EDT (05:30 UTC) starts the window,
    # once; it applied only 30 of its 90 minutes, stopping when the clock read 01:00 again.
    night = CronWindow("30 1 * * *", timedelta(minutes=90), "America/New_York")

    assert active_minutes(night, utc(2024, 11, 3, 4, 0), utc(2024, 11, 3, 9, 0)) == minutes(
        utc(2024, 11, 3, 5, 30), utc(2024, 11, 3, 7, 0)
    )
    assert night.window_at(utc(2024, 11, 3, 6, 0)) == Window(active=True, until=utc(2024, 11, 3, 7, 0))
    # The second 01:30 (EST, 06:30 UTC) starts nothing: the next window is the next night's.
    assert night.window_at(utc(2024, 11, 3, 7, 0)).next_start == utc(2024, 11, 4, 6, 30)


def test_given_berlins_fall_back_when_a_window_starts_at_0230_then_it_applies_in_the_repeated_hour():
    # 25 October 2026: 03:00 CEST falls back to 02:00 CET. 02:30 CEST (00:30 UTC) starts a 1h window;
    # at 01:00 UTC (02:00 CET) it read inactive, with a next start in the past.
    night = CronWindow("30 2 * * *", timedelta(hours=1), "Europe/Berlin")

    assert night.window_at(utc(2026, 10, 25, 1, 0)) == Window(active=True, until=utc(2026, 10, 25, 1, 30))
    assert active_minutes(night, utc(2026, 10, 24, 23, 0), utc(2026, 10, 25, 3, 0)) == minutes(
        utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 1, 30)
    )
    for moment in minutes(utc(2026, 10, 24, 22, 0), utc(2026, 10, 25, 4, 0)):
        window = night.window_at(moment)
        assert window.active or (window.next_start is not None and window.next_start > moment), moment


def test_given_berlins_fall_back_then_a_freeze_is_blocked_until_its_real_end_not_a_past_start():
    policy = DisruptionPolicy(
        budgets=[Budget(max=0, schedule="30 2 * * *", duration="1h", timezone="Europe/Berlin")]
    )

    assert blocked_until(policy, SCALE_DOWN, utc(2026, 10, 25, 1, 0), members=3, in_use=0) == utc(
        2026, 10, 25, 1, 30
    )


def test_given_lord_howes_half_hour_fall_back_then_every_20_minutes_of_hour_2_starts_once():
    # Australia/Lord_Howe, 5 April 2026: 02:00 (+11) falls back to 01:30 (+10:30) at 15:00 UTC, so the
    # hour 02:00-03:00 happens once, after the repeated half hour. The 02:00 and 02:20 starts were
    # missed, and the day before the next start read 40 minutes late (02:40).
    twenty = CronWindow("*/20 2 * * *", timedelta(minutes=20), "Australia/Lord_Howe")

    assert twenty.window_at(utc(2026, 4, 3, 18, 0)).next_start == utc(2026, 4, 4, 15, 30)
    assert active_minutes(twenty, utc(2026, 4, 4, 14, 0), utc(2026, 4, 4, 18, 0)) == minutes(
        utc(2026, 4, 4, 15, 30), utc(2026, 4, 4, 16, 30)
    )


def test_given_lord_howes_half_hour_spring_forward_then_only_the_times_the_clock_shows_start():
    # 4 October 2026: 02:00 (+10:30) jumps to 02:30 (+11) at 15:30 UTC; 02:00 and 02:20 do not exist,
    # and a schedule with `*` in its minutes follows the clock: 02:40 (15:40 UTC) is the only start.
    twenty = CronWindow("*/20 2 * * *", timedelta(minutes=20), "Australia/Lord_Howe")
    fixed = CronWindow("20 2 * * *", timedelta(minutes=20), "Australia/Lord_Howe")

    assert active_minutes(twenty, utc(2026, 10, 3, 14, 0), utc(2026, 10, 3, 17, 0)) == minutes(
        utc(2026, 10, 3, 15, 40), utc(2026, 10, 3, 16, 0)
    )
    # A schedule that names its minute and hour keeps to the calendar: 02:20 starts right after the gap.
    assert fixed.window_at(utc(2026, 10, 3, 15, 0)).next_start == utc(2026, 10, 3, 15, 30)


def test_given_st_johns_midnight_changes_then_windows_are_answered():
    # Before 2011 Newfoundland changed its clocks at 00:01; cronsim's own DST steps never return for
    # these schedules there. Sunday 7 November 2010: 00:01 NDT (02:31 UTC) falls back to Saturday
    # 23:01 NST, so Sunday 00:00 shows twice, at 02:30 and 03:30 UTC, and both copies start.
    sunday_hours = CronWindow("0 * * * 0", timedelta(minutes=30), "America/St_Johns")
    midnight = CronWindow("*/20 0 * * *", timedelta(minutes=10), "America/St_Johns")

    assert sunday_hours.window_at(utc(2010, 11, 7, 2, 40)) == Window(
        active=True, until=utc(2010, 11, 7, 3, 0)
    )
    assert sunday_hours.window_at(utc(2010, 11, 7, 3, 10)).next_start == utc(2010, 11, 7, 3, 30)
    assert midnight.window_at(utc(2010, 11, 7, 2, 35)) == Window(active=True, until=utc(2010, 11, 7, 2, 40))
    # 00:20 NDT never showed; 00:20 NST (03:50 UTC) did.
    assert midnight.window_at(utc(2010, 11, 7, 2, 40)).next_start == utc(2010, 11, 7, 3, 30)
    assert midnight.window_at(utc(2010, 11, 7, 3, 40)).next_start == utc(2010, 11, 7, 3, 50)


# ---- overlapping windows -----------------------------------------------------------------------------


def test_given_windows_that_never_stop_overlapping_then_until_is_a_year_or_more_ahead():
    every_minute = CronWindow("* * * * *", timedelta(minutes=2), "Europe/Berlin")
    hourly = CronWindow("0 * * * *", timedelta(minutes=90), "Australia/Lord_Howe")
    at = utc(2026, 3, 2, 10, 0)

    for window in (every_minute, hourly):
        found = window.window_at(at)
        assert found.active
        assert found.until is not None
        assert at + HORIZON <= found.until <= at + HORIZON + timedelta(minutes=90)


def test_given_lord_howes_hourly_windows_of_61m_then_they_part_only_where_the_clock_skips_half_an_hour():
    # Where the clock skips or repeats half an hour, one hour's start follows the one before 90 real
    # minutes later: 01:00 (+10:30) then 03:00 (+11) on 4 October 2026.
    hourly = CronWindow("0 * * * *", timedelta(minutes=61), "Australia/Lord_Howe")

    assert hourly.window_at(utc(2026, 6, 1)).until == utc(2026, 10, 3, 15, 31)
    assert hourly.window_at(utc(2026, 10, 3, 15, 31)) == Window(
        active=False, next_start=utc(2026, 10, 3, 16, 0)
    )


def test_given_a_weekday_schedule_then_its_overlapping_windows_end_with_fridays():
    weekdays = CronWindow("*/10 9-16 * * mon-fri", timedelta(minutes=15), "Europe/Berlin")

    # Monday 2 March 2026 09:00 CET: every 10 minutes to 16:50, which ends at 17:05 CET.
    assert weekdays.window_at(utc(2026, 3, 2, 8, 0)).until == utc(2026, 3, 2, 16, 5)
    assert weekdays.next_change(utc(2026, 3, 6, 16, 5)) == utc(2026, 3, 9, 8, 0)


# ---- validation --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["localtime", "posixrules", "right/UTC", "posix/Europe/Berlin", "Factory", "europe/berlin", "Mars/Base"],
)
def test_given_a_name_outside_tzdatas_zone_list_then_it_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not an IANA time zone"):
        zone_of(name)


@pytest.mark.parametrize("name", ["UTC", "Europe/Berlin", "US/Eastern", "Australia/Lord_Howe", "Etc/GMT-14"])
def test_given_a_zone_or_link_of_tzdata_then_it_is_accepted(name: str) -> None:
    assert zone_of(name) == ZoneInfo(name)


@pytest.mark.parametrize(
    ("schedule", "day"), [("0 0 30 2 *", "30"), ("0 0 31 4 *", "31"), ("0 0 31 2,4,6 *", "31")]
)
def test_given_a_schedule_that_never_fires_then_it_is_refused_saying_so(schedule: str, day: str) -> None:
    with pytest.raises(ValueError, match=f"never fires: none of its months has a day {day}$"):
        check_schedule(schedule)


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        ("0 0 32 * *", "not a cron expression: Bad day-of-month"),
        ("0 25 * * *", "not a cron expression: Bad hour"),
        ("0 9 * *", "five fields"),
        ("0 0 9 * * *", "five fields"),
    ],
)
def test_given_a_malformed_schedule_then_the_message_says_what_is_wrong(schedule: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_schedule(schedule)


def test_given_leap_days_then_a_schedule_on_29_february_is_accepted():
    leap = CronWindow(check_schedule("0 0 29 2 *"), check_duration("1d"))

    assert leap.next_start(utc(2026, 1, 1)) == utc(2028, 2, 29)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"timezone": "posix/Europe/Berlin"}, "'posix/Europe/Berlin' is not an IANA time zone"),
        ({"timezone": "localtime"}, "'localtime' is not an IANA time zone"),
        ({"schedule": "0 0 30 2 *"}, "never fires"),
    ],
)
def test_given_a_budget_with_such_a_field_then_validation_names_the_field(fields, message):
    values = {"max": 0, "schedule": "0 9 * * *", "duration": "1h", **fields}

    with pytest.raises(ValidationError) as raised:
        Budget(**values)

    [error] = raised.value.errors()
    assert error["loc"] == (next(iter(fields)),)
    assert message in error["msg"]


# ---- cronsim's dates -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schedule",
    [
        "0 9 * * mon-fri",
        "30 2 L * *",
        "0 0 LW * *",
        "0 12 * * 5L",
        "15 6 * * 1#2",
        "0 0 1,15 * mon",
        "0 0 */10 2 *",
    ],
)
def test_given_a_schedule_then_its_local_starts_are_cronsims(schedule: str) -> None:
    # Dates are cronsim's; the times of day come from its fields. Naive times have no DST to get wrong.
    cron = _cron(schedule)
    matches = CronSim(schedule, datetime(2026, 1, 1) - timedelta(seconds=1))
    expected = list(islice(takewhile(lambda m: m.year < 2028, matches), 400))
    ours = [
        datetime(1970, 1, 1) + timedelta(days=day, seconds=second)
        for year in (2026, 2027)
        for day in _days_of_year(schedule, year)
        for second in cron.times
    ][:400]

    assert ours == expected


# ---- what an answer costs ----------------------------------------------------------------------------


def cpu_per_budget(policy: DisruptionPolicy, answer, calls: int = 50) -> float:
    """CPU seconds per budget of `answer(at)` over `calls` instants a few minutes apart."""
    at = utc(2026, 3, 2, 10, 0)
    answer(at - timedelta(days=1))  # schedules and zones read once, as a warm Lambda has them
    started = time.process_time()
    for n in range(calls):
        answer(at + timedelta(minutes=7 * n, seconds=n))
    return (time.process_time() - started) / calls / len(policy.budgets)


WORST = [
    ("* * * * *", "2m", 1),
    ("0 * * * *", "90m", 1),
    ("* * * * *", "2m", 20),
    ("0 * * * *", "90m", 20),
]


@pytest.mark.parametrize(("schedule", "duration", "count"), WORST)
def test_given_the_worst_schedules_then_an_answer_costs_under_5ms_of_cpu_per_budget(
    schedule, duration, count
):
    # The goal is 1 ms; 5 ms leaves room for a loaded machine. These cost 10 s and more each before.
    policy = DisruptionPolicy(
        budgets=[
            Budget(max=0, schedule=schedule, duration=duration, timezone=zone)
            for zone in ["Europe/Berlin", "Australia/Lord_Howe", "America/New_York", "UTC"] * 5
        ][:count]
    )

    def blocked(at: datetime) -> object:
        return blocked_until(policy, SCALE_DOWN, at, members=4, in_use=0)

    def windows(at: datetime) -> object:
        return [window_at(b, at) for b in policy.budgets]

    assert blocked(utc(2026, 3, 2, 10, 0)) is None  # frozen for more than a year: no change frees one
    assert cpu_per_budget(policy, blocked) < 0.005
    assert cpu_per_budget(policy, windows) < 0.005


def test_given_two_freezes_that_take_turns_then_blocked_until_stays_under_5ms_of_cpu_per_budget():
    # Every window change of one is covered by the other: blocked_until looks through all 64 changes.
    policy = DisruptionPolicy(
        budgets=[
            Budget(max=0, schedule="*/2 * * * *", duration="1m", timezone="Europe/Berlin"),
            Budget(max=0, schedule="1-59/2 * * * *", duration="1m", timezone="Europe/Berlin"),
        ]
    )

    def blocked(at: datetime) -> object:
        return blocked_until(policy, SCALE_DOWN, at, members=4, in_use=0)

    assert blocked(utc(2026, 3, 2, 10, 0)) is None
    assert cpu_per_budget(policy, blocked, calls=20) < 0.005
