"""Durations as operators type them: `90s`, `15m`, `2h`, `1h30m`, `1d`, or plain seconds."""

from __future__ import annotations

import re

_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds in `text`; raises ValueError naming the accepted forms."""
    value = text.strip().lower()
    if value.isdigit():
        return int(value)
    parts = _PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise ValueError(f"'{text}' is not a duration: use e.g. 90s, 15m, 2h, 1h30m or seconds")
    return round(sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts))


def format_seconds(seconds: float) -> str:
    """A short human duration: `45s`, `12m05s`, `2h03m`, `-1m10s` for the past."""
    sign = "-" if seconds < 0 else ""
    total = round(abs(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"
