"""Cron windows against a brute-force oracle: two years walked minute by minute in each zone.

The oracle shares no code with domain/windows.py. It reads each minute's local wall time from zoneinfo,
keeps the latest wall time seen, and so knows a repeated time (the clock went back) from a new one and
the times a jump skipped. A schedule that names its minutes and hours starts at the first copy of a
repeated time and, for a skipped time, at the first minute after the jump; one whose minute or hour
field starts with `*` starts whenever the clock shows a matching time. A window is active at minute m
when some start s has s <= m < s + duration.
"""

from __future__ import annotations

import os
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetkeeper.domain.windows import HORIZON, CronWindow

ZONES = ["America/New_York", "Europe/Berlin", "Australia/Lord_Howe", "Pacific/Auckland", "America/Santiago"]
# Hourly, daily (at times some zone skips or repeats, and around midnight, where Santiago changes its
# clocks), every 20 minutes within one hour, and weekdays.
SCHEDULES = [
    "0 * * * *",
    "30 * * * *",
    "*/20 * * * *",
    "30 1 * * *",
    "30 2 * * *",
    "0 0 * * *",
    "*/20 2 * * *",
    "*/20 0 * * *",
    "0,30 1-3 * * 1-5",
]
START = datetime(2026, 1, 1, tzinfo=UTC)
MINUTES = 731 * 1440  # two years
HORIZON_MINUTES = HORIZON // timedelta(minutes=1)
EXAMPLES = int(os.environ.get("FLEETKEEPER_PROPERTY_EXAMPLES", "12"))  # `make stress` runs 60


def values(field: str, low: int, high: int) -> set[int]:
    """The numbers a cron field of digits, `*`, ranges, steps and lists names."""
    found: set[int] = set()
    for part in field.split(","):
        base, _, step = part.partition("/")
        if base == "*":
            first, last = low, high
        elif "-" in base:
            first, last = (int(n) for n in base.split("-"))
        else:
            first = int(base)
            last = high if step else first
        found.update(range(first, last + 1, int(step or 1)))
    return found


@dataclass(frozen=True)
class Zone:
    walls: array[int]  # the local wall time of each minute, in minutes since 1970-01-01 00:00 local
    changes: tuple[int, ...]  # the minutes at which the wall clock does not move on by one minute


@cache
def zone(name: str) -> Zone:
    tz = ZoneInfo(name)
    base = int(START.timestamp()) // 60

    def offset(minute: int) -> int:
        found = datetime.fromtimestamp((base + minute) * 60, tz).utcoffset()
        assert found is not None
        return found // timedelta(minutes=1)

    walls = array("q")
    hourly = [offset(hour * 60) for hour in range(MINUTES // 60 + 1)]
    for hour in range(MINUTES // 60):
        # No zone changes its offset twice within an hour: the same offset at both ends holds between.
        if hourly[hour] == hourly[hour + 1]:
            walls.extend(range(base + hour * 60 + hourly[hour], base + hour * 60 + hourly[hour] + 60))
        else:
            walls.extend(base + minute + offset(minute) for minute in range(hour * 60, hour * 60 + 60))
    changes = tuple(m for m in range(1, MINUTES) if walls[m] - walls[m - 1] != 1)
    return Zone(walls, changes)


@cache
def starts(name: str, schedule: str) -> tuple[int, ...]:
    """The minutes (from START) at which the schedule starts in zone `name`."""
    minute, hour, dom, month, dow = schedule.split()
    minutes, hours = values(minute, 0, 59), values(hour, 0, 23)
    days_of_month, months, weekdays = values(dom, 1, 31), values(month, 1, 12), values(dow, 0, 6)
    walls = zone(name).walls
    first_day, last_day = walls[0] // 1440 - 1, walls[-1] // 1440 + 1
    matching: set[int] = set()
    for day in range(first_day, last_day + 1):
        d = date(1970, 1, 1) + timedelta(days=day)
        if d.day in days_of_month and d.month in months and d.isoweekday() % 7 in weekdays:
            matching.update(day * 1440 + h * 60 + m for h in hours for m in minutes)
    keeps_calendar = not minute.startswith("*") and not hour.startswith("*")
    found = []
    latest = walls[0] - 1
    for index, wall in enumerate(walls):
        if wall > latest:
            fires = wall in matching
            if keeps_calendar and wall > latest + 1:
                fires = fires or any(w in matching for w in range(latest + 1, wall))
            latest = wall
        else:
            fires = not keeps_calendar and wall in matching
        if fires:
            found.append(index)
    return tuple(found)


@cache
def merged(name: str, schedule: str, length: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The windows made one where they overlap or touch: their beginnings and their ends."""
    begins: list[int] = []
    ends: list[int] = []
    for start in starts(name, schedule):
        if ends and start <= ends[-1]:
            ends[-1] = start + length
        else:
            begins.append(start)
            ends.append(start + length)
    return tuple(begins), tuple(ends)


def at(minute: int) -> datetime:
    return START + timedelta(minutes=minute)


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, str, int, list[int]]:
    name = draw(st.sampled_from(ZONES))
    schedule = draw(st.sampled_from(SCHEDULES))
    length = draw(
        st.sampled_from([1, 19, 20, 21, 30, 40, 59, 60, 61, 90, 120, 180, 240]) | st.integers(1, 300)
    )
    changes = zone(name).changes
    # Most instants lie within a few hours of a change of the clocks; the rest anywhere in the first
    # year, so that a window is followed its full horizon inside the oracle's two years.
    near = st.builds(
        lambda change, shift: change + shift,
        st.sampled_from([c for c in changes if c < 366 * 1440]),
        st.integers(-length - 240, 240),
    )
    anywhere = st.integers(2 * 1440, 364 * 1440)
    minutes = draw(st.lists(near | anywhere, min_size=20, max_size=40))
    return name, schedule, length, minutes


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases())
def test_property_windows_agree_with_the_minute_by_minute_oracle(
    case: tuple[str, str, int, list[int]],
) -> None:
    name, schedule, length, minutes = case
    window = CronWindow(schedule, timedelta(minutes=length), name)
    found = starts(name, schedule)
    begins, ends = merged(name, schedule, length)
    for minute in minutes:
        got = window.window_at(at(minute))
        index = bisect_right(begins, minute) - 1
        active = index >= 0 and minute < ends[index]
        assert got.active is active, (name, schedule, length, at(minute))
        if active:
            assert got.until is not None
            if ends[index] - minute <= HORIZON_MINUTES:
                assert got.until == at(ends[index]), (name, schedule, length, at(minute))
            else:  # followed a year ahead: a moment at least that far until which it applies
                assert at(minute + HORIZON_MINUTES) <= got.until <= at(ends[index]), (name, schedule, length)
            assert got.next_start is None
        else:
            following = found[bisect_right(found, minute)]
            assert got.next_start == at(following), (name, schedule, length, at(minute))
            assert window.next_change(at(minute)) == at(following)


def test_the_oracle_sees_each_zones_changes_of_the_clocks() -> None:
    # Two a year in each zone, so both years' spring forward and fall back are walked.
    assert {name: len(zone(name).changes) for name in ZONES} == dict.fromkeys(ZONES, 4)
    # Lord Howe moves its clocks by 30 minutes; a skipped half hour shows as a jump of 31 minutes.
    walls = zone("Australia/Lord_Howe").walls
    assert sorted(walls[c] - walls[c - 1] for c in zone("Australia/Lord_Howe").changes) == [-29, -29, 31, 31]


def test_the_oracle_starts_a_skipped_daily_time_after_the_gap_and_a_repeated_one_once() -> None:
    # Europe/Berlin, 29 March 2026: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 25 October 2026:
    # 03:00 CEST falls back to 02:00 CET, so 02:30 happens at 00:30 and at 01:30 UTC.
    found = starts("Europe/Berlin", "30 2 * * *")
    minute_of = {at(m): m for m in found}
    assert datetime(2026, 3, 29, 1, 0, tzinfo=UTC) in minute_of
    assert datetime(2026, 10, 25, 0, 30, tzinfo=UTC) in minute_of
    assert datetime(2026, 10, 25, 1, 30, tzinfo=UTC) not in minute_of
    # Every 20 minutes of hour 2 follows the clock: both copies, nothing in the gap.
    clock = {at(m) for m in starts("Europe/Berlin", "*/20 2 * * *")}
    assert {datetime(2026, 10, 25, 0, 20, tzinfo=UTC), datetime(2026, 10, 25, 1, 20, tzinfo=UTC)} <= clock
    assert not [s for s in clock if s.date() == date(2026, 3, 29)]
