"""Orphan GC's circuit breaker: when too many workers look orphaned at once, believe none of them.

A mass disappearance is more often our own blindness (a wrong region or account, a tag stripped by a
script, an EC2 answer cut short) than a mass termination. So when more than a set share of a region's
live workers look orphaned in one discovery pass, GC retires none of them and says which it held back.
It resumes by itself once the share is back within the limit, or when an operator confirmed the
held-back set (the confirmation expires, and covers only workers it named).

The breaker names its sets of workers by size and fingerprint only: the ids themselves are pages of
their own (store/breakers.py), because the mass disappearance the breaker exists for may hold back tens
of thousands of workers, far more than one item holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Iterable
from datetime import datetime
from enum import StrEnum

from pydantic import Field

from fleetkeeper.domain.models import Record, UtcDatetime

# What a fingerprint looks like: the first 128 bits of a SHA-256, in hex.
FINGERPRINT_PATTERN = r"^[0-9a-f]{32}$"
# How many ids of a set are shown with the breaker and named in an event (EventBridge caps an entry at
# 256 KB); the whole set is read page by page.
PREVIEW_IDS = 100


class BreakerDecision(StrEnum):
    CLOSED = "closed"  # within the limit: GC proceeds
    HOLD = "hold"  # over the limit: GC retires none of the suspects
    CONFIRMED = "confirmed"  # over the limit, but an operator confirmed every suspect: GC proceeds


class IdSet(Record):
    """A set of worker ids kept in pages beside the breaker: how many, which (by fingerprint), and where
    its pages are (`pages` items under `pages_key`)."""

    count: int = Field(ge=1)
    fingerprint: str = Field(pattern=FINGERPRINT_PATTERN)
    pages_key: str = Field(min_length=1)
    pages: int = Field(ge=1)


class OrphanBreaker(Record):
    """The breaker of one region, as the last discovery pass left it."""

    region: str
    version: int = Field(default=0, ge=0)
    # Workers the last pass held back; None when the breaker is closed.
    held: IdSet | None = None
    live_workers: int = Field(default=0, ge=0)
    share_percent: float = Field(default=0.0, ge=0)
    tripped_at: UtcDatetime | None = None
    # An operator's confirmation: the workers it covers, by whom and until when (spent by the pass that
    # retires the last of them).
    confirmed: IdSet | None = None
    confirmed_by: str | None = None
    confirmed_at: UtcDatetime | None = None
    confirmed_until: UtcDatetime | None = None

    @property
    def holding(self) -> bool:
        return self.held is not None

    def id_sets(self) -> list[IdSet]:
        """The sets whose pages this breaker refers to."""
        return [s for s in (self.held, self.confirmed) if s is not None]


def fingerprint(ids: Iterable[str]) -> str:
    """Names a set of worker ids whatever their order or repeats: equal sets, equal fingerprints."""
    digest = hashlib.sha256()
    for worker_id in sorted(set(ids)):
        raw = worker_id.encode()
        digest.update(f"{len(raw)}:".encode() + raw)
    return digest.hexdigest()[:32]


def share_percent(orphans: int, live: int) -> float:
    """The orphans' share of the region's live workers, in percent (0 for an empty region)."""
    return 100.0 * orphans / live if live > 0 else 0.0


def trips(orphans: int, live: int, max_share_percent: float) -> bool:
    """More than `max_share_percent` of `live` workers orphaned. Compared in integers scaled by 100 so
    that exactly at the limit (1 of 5 at 20 %) never trips through a rounding error."""
    if orphans <= 0 or live <= 0:
        return False
    return orphans * 100 > max_share_percent * live


def confirmation_covers(
    breaker: OrphanBreaker | None,
    suspects: Collection[str],
    *,
    now: datetime,
    confirmed_ids: Callable[[], Collection[str]],
) -> bool:
    """Whether an unexpired operator confirmation names every current suspect (a worker that became
    suspect after the confirmation was given is not covered: the operator never saw it).

    The confirmed ids are asked for (`confirmed_ids()`, pages to read) only when the set's size and
    fingerprint cannot decide: the suspects are fewer than the confirmed workers and not the same set.
    """
    if breaker is None or breaker.confirmed is None or breaker.confirmed_until is None or not suspects:
        return False
    if now > breaker.confirmed_until:
        return False
    unique = set(suspects)
    if len(unique) > breaker.confirmed.count:
        return False
    if fingerprint(unique) == breaker.confirmed.fingerprint:
        return True
    return unique <= set(confirmed_ids())


def decide(
    breaker: OrphanBreaker | None,
    suspects: Collection[str],
    *,
    live: int,
    max_share_percent: float,
    now: datetime,
    confirmed_ids: Callable[[], Collection[str]] = tuple,
) -> BreakerDecision:
    if not trips(len(suspects), live, max_share_percent):
        return BreakerDecision.CLOSED
    if confirmation_covers(breaker, suspects, now=now, confirmed_ids=confirmed_ids):
        return BreakerDecision.CONFIRMED
    return BreakerDecision.HOLD
