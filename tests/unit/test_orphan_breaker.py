"""Orphan GC's circuit breaker: the threshold maths, and what an operator's confirmation covers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetkeeper.domain.orphan_breaker import BreakerDecision, OrphanBreaker, decide, share_percent, trips

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


def confirmed(ids: list[str], until: datetime) -> OrphanBreaker:
    return OrphanBreaker(
        region="eu-west-1",
        held_back=ids,
        confirmed_ids=ids,
        confirmed_by="alice",
        confirmed_at=until - timedelta(hours=1),
        confirmed_until=until,
    )


def verdict(breaker: OrphanBreaker | None, suspects: list[str], now: datetime = NOW) -> BreakerDecision:
    return decide(breaker, suspects, live=4, max_share_percent=20.0, now=now)


def test_given_no_confirmation_then_a_tripped_breaker_holds():
    assert verdict(None, ["w-1", "w-2"]) is BreakerDecision.HOLD


def test_given_a_confirmation_of_every_suspect_then_gc_proceeds():
    breaker = confirmed(["w-1", "w-2"], NOW + timedelta(minutes=5))
    assert verdict(breaker, ["w-2", "w-1"]) is BreakerDecision.CONFIRMED
    assert verdict(breaker, ["w-1"]) is BreakerDecision.CONFIRMED


def test_given_a_suspect_the_operator_never_saw_then_the_confirmation_does_not_cover_it():
    breaker = confirmed(["w-1", "w-2"], NOW + timedelta(minutes=5))
    assert verdict(breaker, ["w-1", "w-2", "w-3"]) is BreakerDecision.HOLD


def test_given_an_expired_confirmation_then_the_breaker_holds_again():
    breaker = confirmed(["w-1", "w-2"], NOW - timedelta(seconds=1))
    assert verdict(breaker, ["w-1", "w-2"]) is BreakerDecision.HOLD
    assert verdict(breaker, ["w-1", "w-2"], now=NOW - timedelta(seconds=1)) is BreakerDecision.CONFIRMED


def test_given_a_share_within_the_limit_then_the_breaker_is_closed_whatever_was_confirmed():
    assert decide(None, ["w-1"], live=5, max_share_percent=20.0, now=NOW) is BreakerDecision.CLOSED
