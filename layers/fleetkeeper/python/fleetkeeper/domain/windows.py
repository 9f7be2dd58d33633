"""Cron windows: a cron schedule of starts, a duration and an IANA time zone, and when they apply.

Disruption budgets apply in them (docs/disruption.md, "Time zones and daylight saving time"), and so
will anything else that applies on a schedule. The rule:

- A window is active at an instant t when some start s of the schedule has s <= t < s + duration.
  The duration is elapsed time: an 8h window is 8 real hours even across a DST change. Windows that
  overlap or touch are one window, and `until` is where it ends.
- The starts are the schedule's matches on the zone's local clock, read as Debian's cron and cronsim
  read them where the clock jumps or repeats:
  - a schedule that names both its minutes and its hours (neither field starts with `*`: `30 2 * * *`,
    `0 9-17 * * mon-fri`) keeps to the calendar: a start at a local time the zone skips (spring
    forward) happens at the first instant after the gap, and a start at a local time that happens
    twice (fall back) happens once, at the first of the two;
  - a schedule whose minute or hour field starts with `*` (`0 * * * *`, `*/20 2 * * *`) follows the
    clock: it starts whenever the clock shows a matching time, so never inside a gap, and in both
    copies of a repeated time.
- `next_start` is the first start after t, never one before it; None when it applies at t or never
  starts again. A window that keeps applying is followed a year (HORIZON) ahead: past that, `until`
  is a moment a year or more ahead until which it applies at least.

cronsim parses the schedule and matches dates; the times are reckoned here, on the local calendar
and the zone's UTC offsets, not with cronsim's own DST steps, which are wrong in zones that shift by
30 minutes (Australia/Lord_Howe) and never return in America/St_Johns before 2011. Matching the
schedule on whole days and following the zone's offsets lets an answer jump over a window that keeps
being extended instead of walking its starts one by one: every answer costs a few dozen steps.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from functools import cache, lru_cache
from importlib import resources
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError

from fleetkeeper.domain.durations import parse_duration

MIN_DURATION = timedelta(minutes=1)
MAX_DURATION = timedelta(days=366)
# How far ahead a window that keeps applying is followed.
HORIZON = timedelta(days=366)

_DAY = 86_400
_EPOCH = date(1970, 1, 1).toordinal()
_EPOCH_TIME = datetime(1970, 1, 1, tzinfo=UTC)
# cronsim gives up on a schedule that has not matched for 50 years; so does this module.
_SEARCH_YEARS = 50
# A zone's offset is probed this often to find its changes, which are then pinned to the second:
# no zone of tzdata has changed its offset twice within two days since 2000.
_PROBE = 6 * 3600
# Bounds on the loops of one answer; none is reached by a schedule that fires at least every 50 years.
_MAX_SPANS = 64
_MAX_STEPS = 64
# Names zoneinfo loads that are no place's zone: the placeholder for "no zone" (in tzdata's list), the
# machine's own setting, and the `posix/` and `right/` copies some systems carry.
_NOT_ZONES = frozenset({"Factory", "localtime", "posixrules"})
_NOT_ZONE_TREES = ("posix/", "right/")


# ---- validation ----------------------------------------------------------------------------------


def check_schedule(text: str) -> str:
    """The five-field cron `text` with its spacing made single; ValueError saying what is wrong."""
    normalized = " ".join(text.split())
    fields = normalized.split(" ")
    # cronsim also reads a sixth field of seconds; windows are planned to the minute.
    if len(fields) != 5:
        raise ValueError("five fields: minute hour day-of-month month day-of-week, e.g. 0 9 * * mon-fri")
    try:
        _cron(normalized)
    except CronSimError as exc:
        # cronsim refuses a day of the month that none of the months has with the words it uses for
        # a malformed one; the day is fine when any month would do.
        if str(exc) == "Bad day-of-month" and _parses(" ".join([*fields[:3], "*", fields[4]])):
            raise ValueError(f"never fires: none of its months has a day {fields[2]}") from exc
        raise ValueError(f"not a cron expression: {exc}") from exc
    today = datetime.now(UTC).date().toordinal() - _EPOCH
    if _next_day(normalized, today) is None:
        raise ValueError(f"never fires: it matches no date in the next {_SEARCH_YEARS} years")
    return normalized


def _parses(text: str) -> bool:
    try:
        CronSim(text, datetime(2000, 1, 1))
    except CronSimError:
        return False
    return True


def check_duration(text: str) -> timedelta:
    """The length of a window written as `text` (8h, 90m, 1h30m, 1d); ValueError when it is not one."""
    length = parse_duration(text.strip())
    if length is None:
        raise ValueError("a duration such as 8h, 90m, 1h30m or 1d")
    if not MIN_DURATION <= length <= MAX_DURATION:
        raise ValueError("from 1m to 366d")
    return length


@cache
def zone_names() -> frozenset[str]:
    """The names of tzdata's zones and links (`Europe/Berlin`, `UTC`, `US/Eastern`), from the tzdata
    package's list, as zoneinfo.available_timezones reads it first; that function also reads every file
    of the machine's zoneinfo directories, a fifth of a second of a cold start."""
    names = resources.files("tzdata").joinpath("zones").read_text(encoding="utf-8").split()
    return frozenset(n for n in names if n not in _NOT_ZONES and not n.startswith(_NOT_ZONE_TREES))


def zone_of(name: str) -> ZoneInfo:
    """The IANA time zone `name`; ValueError naming it when tzdata's list has no such zone."""
    if name not in zone_names():
        raise ValueError(f"'{name}' is not an IANA time zone, e.g. Europe/Berlin or UTC")
    return ZoneInfo(name)


# ---- windows -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Window:
    """Whether windows apply at an instant, until when, or when they apply next (all UTC).

    `until` is None for something that always applies (no schedule); `next_start` is None when it
    applies now, or when its schedule never starts again.
    """

    active: bool
    until: datetime | None = None
    next_start: datetime | None = None


@dataclass(frozen=True)
class CronWindow:
    """Windows `duration` long starting at each match of `schedule` in `timezone` (validated by the
    check functions; see the module's docstring)."""

    schedule: str
    duration: timedelta
    timezone: str = "UTC"

    def window_at(self, at: datetime) -> Window:
        """The window at `at`."""
        now = _seconds(at)
        held = _recent.get(self)
        if held is not None and held[0] <= now < held[1]:
            return held[2]
        cron = _cron(self.schedule)
        length = self.duration // timedelta(seconds=1)
        # The first start of a window that could cover `now`; it covers `now` when it is not later.
        first = _start_after(cron, self.timezone, now - length)
        if first is None or first > now:
            window, holds_until = Window(active=False, next_start=_instant(first)), first
        else:
            cap = now + HORIZON // timedelta(seconds=1)
            end = _window_end(cron, self.timezone, first, length, cap)
            # An end past the horizon is the end so far, which a later moment would find further on.
            window, holds_until = Window(active=True, until=_instant(end)), (end if end < cap else now + 1)
        if len(_recent) >= _MAX_RECENT:
            _recent.clear()
        _recent[self] = (now, _FOREVER if holds_until is None else holds_until, window)
        return window

    def next_start(self, at: datetime) -> datetime | None:
        """The first start after `at`."""
        return _instant(_start_after(_cron(self.schedule), self.timezone, _seconds(at)))

    def next_change(self, at: datetime) -> datetime | None:
        """When the windows next start or stop applying after `at`."""
        window = self.window_at(at)
        return window.until if window.active else window.next_start


# The last answer of each CronWindow and the seconds [from, to) it holds for: the same answer until
# the window's next change. Callers ask about moments inside one window again and again: a view asks
# per reason, and `blocked_until` steps from change to change of every budget of a pool.
_recent: dict[CronWindow, tuple[int, int, Window]] = {}
_MAX_RECENT = 4096
_FOREVER = 2**62


def _seconds(at: datetime) -> int:
    # Starts fall on whole minutes and durations are whole seconds, so whole seconds decide every answer.
    return math.floor(at.timestamp())


def _instant(seconds: int | None) -> datetime | None:
    return None if seconds is None else _EPOCH_TIME + timedelta(seconds=seconds)


# ---- the schedule on the local calendar (seconds since 1970-01-01 00:00 local, no zone) -------------


@dataclass(frozen=True, eq=False)
class _Cron:
    """A schedule as cronsim parsed it: the days it starts on and its start times on such a day."""

    text: str
    sim: CronSim
    # The seconds after local midnight at which it starts, on a day it starts, ascending.
    times: tuple[int, ...]
    follows_clock: bool

    def starts_at(self, wall: int) -> bool:
        day, second = divmod(wall, _DAY)
        index = bisect_left(self.times, second)
        return index < len(self.times) and self.times[index] == second and _next_day(self.text, day) == day


@lru_cache(maxsize=1024)
def _cron(schedule: str) -> _Cron:
    # cronsim's parsed fields and its day rule (L, W, #, day-of-month or day-of-week) are read as they
    # are, so dates match as cronsim matches them (tests/unit/test_windows.py holds them to its iteration).
    sim = CronSim(schedule, datetime(2000, 1, 1))
    times = tuple(sorted(hour * 3600 + minute * 60 for hour in sim.hours for minute in sim.minutes))
    minute, hour = schedule.split()[:2]
    return _Cron(schedule, sim, times, minute.startswith("*") or hour.startswith("*"))


@lru_cache(maxsize=4096)
def _days_of_year(schedule: str, year: int) -> tuple[int, ...]:
    """The days of `year` (counted from 1970-01-01) on which `schedule` starts, by cronsim's day rules."""
    sim = _cron(schedule).sim
    days: list[int] = []
    for month in sorted(sim.months):
        first = date(year, month, 1).toordinal()
        last = date(year + month // 12, month % 12 + 1, 1).toordinal()
        days.extend(n - _EPOCH for n in range(first, last) if sim.match_day(date.fromordinal(n)))
    return tuple(days)


@lru_cache(maxsize=4096)
def _year_of_day(day: int) -> int:
    return date.fromordinal(day + _EPOCH).year


@lru_cache(maxsize=16_384)
def _next_day(schedule: str, day: int) -> int | None:
    """The first day from `day` on on which `schedule` starts."""
    year = _year_of_day(day)
    for candidate in range(year, min(year + _SEARCH_YEARS, 9998) + 1):
        days = _days_of_year(schedule, candidate)
        index = bisect_left(days, day)
        if index < len(days):
            return days[index]
    return None


def _previous_day(schedule: str, day: int) -> int | None:
    """The last day up to `day` on which `schedule` starts."""
    year = _year_of_day(day)
    for candidate in range(year, max(year - _SEARCH_YEARS, 1) - 1, -1):
        days = _days_of_year(schedule, candidate)
        index = bisect_right(days, day)
        if index:
            return days[index - 1]
    return None


def _next_wall(cron: _Cron, wall: int) -> int | None:
    """The first local time at or after `wall` at which the schedule starts."""
    day, second = divmod(wall, _DAY)
    index = bisect_left(cron.times, second)
    if index < len(cron.times) and _next_day(cron.text, day) == day:
        return day * _DAY + cron.times[index]
    following = _next_day(cron.text, day + 1)
    return None if following is None else following * _DAY + cron.times[0]


def _previous_wall(cron: _Cron, wall: int) -> int | None:
    """The last local time at or before `wall` at which the schedule starts."""
    day, second = divmod(wall, _DAY)
    index = bisect_right(cron.times, second)
    if index and _next_day(cron.text, day) == day:
        return day * _DAY + cron.times[index - 1]
    before = _previous_day(cron.text, day - 1)
    return None if before is None else before * _DAY + cron.times[-1]


@lru_cache(maxsize=1024)
def _long_waits(schedule: str, length: int) -> tuple[int, ...]:
    """The positions in a day's start times after which the next start of the day is more than
    `length` seconds later."""
    times = _cron(schedule).times
    return tuple(i for i in range(len(times) - 1) if times[i + 1] - times[i] > length)


@lru_cache(maxsize=4096)
def _day_breaks(schedule: str, year: int, length: int) -> tuple[int, ...]:
    """The positions in _days_of_year after which the next day's first start is more than `length`
    seconds after the day's last start."""
    times = _cron(schedule).times
    days = _days_of_year(schedule, year)
    spread = times[-1] - times[0]
    breaks = [i for i in range(len(days) - 1) if (days[i + 1] - days[i]) * _DAY - spread > length]
    if days:
        following = _next_day(schedule, days[-1] + 1)
        if following is None or (following - days[-1]) * _DAY - spread > length:
            breaks.append(len(days) - 1)
    return tuple(breaks)


def _chain(cron: _Cron, wall: int, length: int, limit: int) -> int:
    """The last local start time reached from the start at `wall` by steps of at most `length` from
    one start to the next, all before `limit`: whole days at a time where no wait within a day is longer."""
    times = cron.times
    waits = _long_waits(cron.text, length)
    day, second = divmod(wall, _DAY)
    index = bisect_left(times, second)
    if waits:
        # Each day has a long wait, so the chain ends on this day or the next one it reaches.
        for _ in range(3):
            found = bisect_left(waits, index)
            last = day * _DAY + times[waits[found] if found < len(waits) else -1]
            if last >= limit:
                return _last_before(cron, limit, wall)
            following = None if found < len(waits) else _next_day(cron.text, day + 1)
            if following is None or following * _DAY + times[0] - last > length:
                return last
            if following * _DAY + times[0] >= limit:
                return last
            day, index = following, 0
        return last
    for _ in range(_SEARCH_YEARS):
        year = _year_of_day(day)
        days = _days_of_year(cron.text, year)
        breaks = _day_breaks(cron.text, year, length)
        found = bisect_left(breaks, bisect_left(days, day))
        last = days[breaks[found] if found < len(breaks) else -1] * _DAY + times[-1]
        if last >= limit:
            return _last_before(cron, limit, wall)
        if found < len(breaks):
            return last
        following = _next_day(cron.text, days[-1] + 1)
        if following is None:
            return last
        day = following
    return last


def _last_before(cron: _Cron, limit: int, wall: int) -> int:
    """The last start before `limit` of a chain from `wall` that goes beyond it."""
    previous = _previous_wall(cron, limit - 1)
    return wall if previous is None else previous


# ---- the zone's offsets ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Span:
    """A stretch of time with one UTC offset (seconds east), from `start` (seconds since the epoch) to
    the next span's start; `before` is the offset just before it (the same where only a year begins)."""

    start: int
    offset: int
    before: int


def _year_start(year: int) -> int:
    return (date(year, 1, 1).toordinal() - _EPOCH) * _DAY


def _offset(zone: ZoneInfo, at: int) -> int:
    offset = datetime.fromtimestamp(at, zone).utcoffset()
    return 0 if offset is None else offset // timedelta(seconds=1)


@lru_cache(maxsize=1024)
def _spans_of_year(zone_name: str, year: int) -> tuple[tuple[int, ...], tuple[_Span, ...]]:
    """The spans of one UTC year, and their starts."""
    zone = ZoneInfo(zone_name)
    start, end = _year_start(year), _year_start(year + 1)
    spans = [_Span(start, _offset(zone, start), _offset(zone, start - 1))]
    probe_from = start
    while probe_from < end - 1:
        probe = min(probe_from + _PROBE, end - 1)
        if _offset(zone, probe) == spans[-1].offset:
            probe_from = probe
            continue
        low, high = probe_from, probe
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if _offset(zone, middle) == spans[-1].offset else (low, middle)
        spans.append(_Span(high, _offset(zone, high), spans[-1].offset))
        probe_from = high
    return tuple(span.start for span in spans), tuple(spans)


def _span_at(zone_name: str, at: int) -> tuple[_Span, int]:
    """The span holding the instant `at`, and where it ends."""
    year = time.gmtime(at).tm_year
    starts, spans = _spans_of_year(zone_name, year)
    index = bisect_right(starts, at) - 1
    end = starts[index + 1] if index + 1 < len(starts) else _year_start(year + 1)
    return spans[index], end


def _lowest_wall(cron: _Cron, span: _Span) -> int:
    """The first local time of a span at which a start can happen: a schedule kept to the calendar
    started at the times a fall back repeats in their first copy, before the span."""
    if not cron.follows_clock and span.before > span.offset:
        return span.start + span.before
    return span.start + span.offset


def _moved_start(cron: _Cron, span: _Span) -> bool:
    """Whether a schedule kept to the calendar starts at the span's start, a spring forward whose gap
    holds one of its times."""
    if cron.follows_clock or span.before >= span.offset:
        return False
    found = _next_wall(cron, span.start + span.before)
    return found is not None and found < span.start + span.offset


def _start_after(cron: _Cron, zone_name: str, at: int) -> int | None:
    """The first start after the instant `at`."""
    span, end = _span_at(zone_name, at)
    for _ in range(_MAX_SPANS):
        if span.start > at and _moved_start(cron, span):
            return span.start
        wall = _next_wall(cron, max(_lowest_wall(cron, span), at + span.offset + 1))
        if wall is None:
            return None
        if wall < end + span.offset:
            return wall - span.offset
        # No start in this span: skip to the one holding that time (a day early, for the offsets).
        span, end = _span_at(zone_name, max(end, wall - span.offset - _DAY))
    return None


def _window_end(cron: _Cron, zone_name: str, first: int, length: int, cap: int) -> int:
    """The end of the window starting at `first` together with every window that starts before the
    one before it ends; followed until `cap`, past which the end so far is the answer."""
    start, end = first, first + length
    # Most windows end before the next one starts.
    following = _start_after(cron, zone_name, first)
    if following is None or following > end:
        return end
    for _ in range(_MAX_STEPS):
        span, span_end = _span_at(zone_name, start)
        wall = start + span.offset
        last = start
        if wall >= _lowest_wall(cron, span) and cron.starts_at(wall):
            last = _chain(cron, wall, length, min(span_end, cap) + span.offset) - span.offset
        end = last + length
        if end >= cap:
            return end
        following = _start_after(cron, zone_name, last)
        if following is None or following > end:
            return end
        start = following
    return end
