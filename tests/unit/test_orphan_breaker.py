"""Orphan GC's circuit breaker: the threshold maths, and what an operator's confirmation covers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetkeeper.domain.orphan_breaker import (
    BreakerDecision,
    IdSet,
    OrphanBreaker,
    decide,
    fingerprint,
    share_percent,
    trips,
)

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("orphans", "live", "tripped"),
    [
        (1, 5, False),  # exactly 20 %: not more than the limit
        (2, 9, True),  # 22 %
        (1, 4, True),  # 25 %
        (20, 100, False),
        (21, 100, True),
        (1, 1, True),  # a region's only worker: 100 %
        (0, 10, False),
        (0, 0, False),
    ],
)
def test_given_a_share_of_orphans_then_the_breaker_trips_only_above_the_limit(orphans, live, tripped):
    assert trips(orphans, live, 20.0) is tripped


def test_given_the_limit_at_100_percent_then_the_breaker_never_trips():
    assert trips(7, 7, 100.0) is False


def test_given_an_empty_region_then_the_share_is_zero():
    assert (share_percent(0, 0), share_percent(1, 8)) == (0.0, 12.5)


def id_set(ids: list[str]) -> IdSet:
    return IdSet(count=len(set(ids)), fingerprint=fingerprint(ids), pages_key="p", pages=1)


def confirmed(ids: list[str], until: datetime) -> OrphanBreaker:
    return OrphanBreaker(
        region="eu-west-1",
        held=id_set(ids),
        confirmed=id_set(ids),
        confirmed_by="alice",
        confirmed_at=until - timedelta(hours=1),
        confirmed_until=until,
    )


class Pages:
    """The confirmed ids as the store would read them, counting the reads."""

    def __init__(self, ids: list[str]) -> None:
        self.ids = ids
        self.reads = 0

    def __call__(self) -> list[str]:
        self.reads += 1
        return self.ids


def verdict(
    breaker: OrphanBreaker | None, suspects: list[str], now: datetime = NOW, pages: Pages | None = None
) -> BreakerDecision:
    return decide(
        breaker,
        suspects,
        live=4,
        max_share_percent=20.0,
        now=now,
        confirmed_ids=pages or Pages(["w-1", "w-2"]),
    )


def test_given_no_confirmation_then_a_tripped_breaker_holds():
    assert verdict(None, ["w-1", "w-2"]) is BreakerDecision.HOLD


def test_given_a_confirmation_of_every_suspect_then_gc_proceeds():
    breaker = confirmed(["w-1", "w-2"], NOW + timedelta(minutes=5))
    assert verdict(breaker, ["w-2", "w-1"]) is BreakerDecision.CONFIRMED
    assert verdict(breaker, ["w-1"]) is BreakerDecision.CONFIRMED


def test_given_a_suspect_the_operator_never_saw_then_the_confirmation_does_not_cover_it():
    breaker = confirmed(["w-1", "w-2"], NOW + timedelta(minutes=5))
    assert verdict(breaker, ["w-1", "w-2", "w-3"]) is BreakerDecision.HOLD
    # As many suspects as confirmed workers, but not the same ones.
    assert verdict(breaker, ["w-1", "w-3"]) is BreakerDecision.HOLD


def test_given_the_confirmed_set_itself_then_its_pages_are_not_read():
    breaker = confirmed(["w-1", "w-2"], NOW + timedelta(minutes=5))
    pages = Pages(["w-1", "w-2"])

    assert verdict(breaker, ["w-2", "w-1"], pages=pages) is BreakerDecision.CONFIRMED
    assert pages.reads == 0  # the fingerprint says it is the same set
    assert verdict(breaker, ["w-1", "w-2", "w-3"], pages=pages) is BreakerDecision.HOLD
    assert pages.reads == 0  # more suspects than confirmed workers cannot be covered
    assert verdict(breaker, ["w-2"], pages=pages) is BreakerDecision.CONFIRMED
    assert pages.reads == 1  # a subset: only the ids can say


def test_given_an_expired_confirmation_then_the_breaker_holds_again():
    breaker = confirmed(["w-1", "w-2"], NOW - timedelta(seconds=1))
    assert verdict(breaker, ["w-1", "w-2"]) is BreakerDecision.HOLD
    assert verdict(breaker, ["w-1", "w-2"], now=NOW - timedelta(seconds=1)) is BreakerDecision.CONFIRMED


def test_given_a_share_within_the_limit_then_the_breaker_is_closed_whatever_was_confirmed():
    assert decide(None, ["w-1"], live=5, max_share_percent=20.0, now=NOW) is BreakerDecision.CLOSED


def test_given_sets_then_the_fingerprint_ignores_order_and_repeats_and_tells_sets_apart():
    assert fingerprint(["w-2", "w-1", "w-1"]) == fingerprint(["w-1", "w-2"])
    assert fingerprint(["w-1", "w-2"]) != fingerprint(["w-1", "w-3"])
    # Ids are length-prefixed, so no two different sets join into the same bytes.
    assert fingerprint(["ab", "c"]) != fingerprint(["a", "bc"])
