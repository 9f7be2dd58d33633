"""Orphan GC's circuit breaker: when too many workers look orphaned at once, believe none of them.

A mass disappearance is more often our own blindness (a wrong region or account, a tag stripped by a
script, an EC2 answer cut short) than a mass termination. So when more than a set share of a region's
live workers look orphaned in one discovery pass, GC retires none of them and says which it held back.
It resumes by itself once the share is back within the limit, or for one pass when an operator confirmed
the held-back set (the confirmation expires, and covers only workers it named).
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from enum import StrEnum

from pydantic import Field

from fleetkeeper.domain.models import Record, UtcDatetime


class BreakerDecision(StrEnum):
    CLOSED = "closed"  # within the limit: GC proceeds
    HOLD = "hold"  # over the limit: GC retires none of the suspects
    CONFIRMED = "confirmed"  # over the limit, but an operator confirmed every suspect: GC proceeds


class OrphanBreaker(Record):
    """The breaker of one region, as the last discovery pass left it."""

    region: str
    version: int = Field(default=0, ge=0)
    # Workers the last pass held back; empty when the breaker is closed.
    held_back: list[str] = Field(default_factory=list)
    live_workers: int = Field(default=0, ge=0)
    share_percent: float = Field(default=0.0, ge=0)
    tripped_at: UtcDatetime | None = None
    # An operator's confirmation: the workers it covers, by whom and when (spent by the pass using it).
    confirmed_ids: list[str] = Field(default_factory=list)
    confirmed_by: str | None = None
    confirmed_at: UtcDatetime | None = None
    confirmed_until: UtcDatetime | None = None

    @property
    def holding(self) -> bool:
        return bool(self.held_back)


def share_percent(orphans: int, live: int) -> float:
    """The orphans' share of the region's live workers, in percent (0 for an empty region)."""
    return 100.0 * orphans / live if live > 0 else 0.0


def trips(orphans: int, live: int, max_share_percent: float) -> bool:
    """More than `max_share_percent` of `live` workers orphaned. Compared in integers scaled by 100 so
    that exactly at the limit (1 of 5 at 20 %) never trips through a rounding error."""
    if orphans <= 0 or live <= 0:
        return False
    return orphans * 100 > max_share_percent * live


def confirmation_covers(breaker: OrphanBreaker | None, suspects: Collection[str], *, now: datetime) -> bool:
    """Whether an unexpired operator confirmation names every current suspect (a worker that became
    suspect after the confirmation was given is not covered: the operator never saw it)."""
    if breaker is None or breaker.confirmed_until is None or not suspects:
        return False
    if now > breaker.confirmed_until:
        return False
    return set(suspects) <= set(breaker.confirmed_ids)


def decide(
    breaker: OrphanBreaker | None,
    suspects: Collection[str],
    *,
    live: int,
    max_share_percent: float,
    now: datetime,
) -> BreakerDecision:
    if not trips(len(suspects), live, max_share_percent):
        return BreakerDecision.CLOSED
    if confirmation_covers(breaker, suspects, now=now):
        return BreakerDecision.CONFIRMED
    return BreakerDecision.HOLD
