"""Durations as operators write them: `2h`, `90m`, `1h30m`, `1d`, `45s`: days, hours, minutes and
seconds in that order, each at most once, at least one of them."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

# Written without a lookahead, so that every JSON Schema regex dialect reads the published pattern alike,
# and with [0-9]: Python's \d (and int()) also read other scripts' digits, "٣h" as three hours.
_N = "[0-9]+"
DURATION_PATTERN: Final = (
    f"^(?:{_N}d(?:{_N}h)?(?:{_N}m)?(?:{_N}s)?|{_N}h(?:{_N}m)?(?:{_N}s)?|{_N}m(?:{_N}s)?|{_N}s)$"
)
_DURATION = re.compile(DURATION_PATTERN)
_PART = re.compile(f"({_N})([dhms])")
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
# timedelta's own limit is 999,999,999 days; a duration beyond this is a typo, and is held here rather
# than overflowing, so that the caller's range check names it.
_LONGEST = timedelta(days=100_000)


def parse_duration(text: str) -> timedelta | None:
    """The duration `text` spells exactly, or None when it is not one."""
    if not _DURATION.fullmatch(text):
        return None
    seconds = sum(int(amount) * _SECONDS[unit] for amount, unit in _PART.findall(text))
    return min(timedelta(seconds=min(seconds, int(_LONGEST.total_seconds()))), _LONGEST)
