"""Where each reconcile shard starts inside the period (domain/stagger.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetkeeper.domain.sharding import MAX_SHARDS
from fleetkeeper.domain.stagger import (
    STAGGER_WINDOW_SECONDS,
    ShardStart,
    cron_minutes,
    shard_starts,
    start_wait,
)

DUE = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_given_a_one_minute_period_then_the_shards_spread_over_the_window_after_the_minute() -> None:
    starts = shard_starts(4, 1)

    assert [s.minute for s in starts] == [0, 0, 0, 0]
    assert [s.delay_seconds for s in starts] == [0.0, 3.8, 7.5, 11.2]


def test_given_a_period_of_as_many_minutes_as_shards_then_each_has_its_minute_and_no_wait() -> None:
    assert shard_starts(5, 5) == [ShardStart(m, 0.0) for m in range(5)]
    assert [s.minute for s in shard_starts(3, 10)] == [0, 3, 6]


def test_given_a_period_no_cron_can_offset_then_every_shard_waits_in_the_window() -> None:
    assert not cron_minutes(7)
    assert [s.minute for s in shard_starts(3, 7)] == [0, 0, 0]
    assert [s.delay_seconds for s in shard_starts(3, 7)] == [0.0, 5.0, 10.0]


@pytest.mark.parametrize("period", [1, 2, 3, 5, 7, 10, 15, 30, 60])
@pytest.mark.parametrize("shards", [1, 2, 3, 10, MAX_SHARDS])
def test_given_any_split_then_starts_are_distinct_inside_the_period_and_the_window(
    period: int, shards: int
) -> None:
    starts = shard_starts(shards, period)

    assert len(starts) == shards
    assert all(0 <= s.minute < period and 0 <= s.delay_seconds < STAGGER_WINDOW_SECONDS for s in starts)
    # Distinct to a tenth of a second while at most 150 shards share a minute.
    assert len(set(starts)) == shards
    assert starts[0] == ShardStart(0, 0.0)


def test_given_an_invocation_then_it_waits_until_its_delay_after_the_due_time_and_no_longer() -> None:
    assert start_wait(7.5, DUE, DUE) == 7.5
    assert start_wait(7.5, DUE, DUE + timedelta(seconds=5)) == 2.5
    assert start_wait(7.5, DUE, DUE + timedelta(seconds=40)) == 0.0
    assert start_wait(7.5, DUE, DUE - timedelta(seconds=3)) == 7.5  # clocks a little apart: never longer
    assert start_wait(7.5, None, DUE) == 7.5
    assert start_wait(0.0, DUE, DUE) == 0.0
