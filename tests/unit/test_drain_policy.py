"""Drain limits that keep every execution inside Step Functions' own limits (docs/drains.md)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from fleetkeeper.domain.drain_policy import (
    MAX_DEADLINE_MOVES,
    MAX_RECHECKS_PER_DRAIN,
    drain_heartbeat,
    moved,
    moved_deadline,
    recheck_heartbeat,
    worker_drain_timeout,
)
from fleetkeeper.domain.models import MAX_DRAIN_TIMEOUT_SECONDS, DrainRecord
from fleetkeeper.services.drains import execution_name

DAY = 24 * 3600
# A Standard execution runs at most one year.
EXECUTION_LIFETIME_SECONDS = 365 * DAY


def test_given_the_longest_drain_then_its_execution_has_days_left_to_force_and_finish() -> None:
    assert EXECUTION_LIFETIME_SECONDS - MAX_DRAIN_TIMEOUT_SECONDS >= 5 * DAY
    assert worker_drain_timeout(400 * DAY, None) == MAX_DRAIN_TIMEOUT_SECONDS


def test_given_the_longest_drain_then_it_rechecks_at_most_the_bounded_number_of_times() -> None:
    heartbeat = recheck_heartbeat(300, MAX_DRAIN_TIMEOUT_SECONDS)
    assert math.ceil(MAX_DRAIN_TIMEOUT_SECONDS / heartbeat) <= MAX_RECHECKS_PER_DRAIN


def test_given_an_ordinary_drain_then_its_safety_net_recheck_keeps_the_configured_heartbeat() -> None:
    assert recheck_heartbeat(300, 4 * 3600) == 300
    assert recheck_heartbeat(300, 7 * DAY) == 756


def test_given_a_restart_then_the_execution_name_is_new_and_within_the_limit() -> None:
    assert execution_name("drain", "w-1", 3) == "drain-w-1-g3"
    assert execution_name("drain", "w-1", 3, 2) == "drain-w-1-g3-r2"
    long_name = execution_name("pool", "p" * 200, 12, 3)
    assert len(long_name) <= 80
    assert long_name.endswith("-g12-r3")


STARTED = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def drain_record(timeout_seconds: int, **fields: object) -> DrainRecord:
    return DrainRecord(
        generation=1,
        started_at=STARTED,
        deadline=STARTED + timedelta(seconds=timeout_seconds),
        timeout_seconds=timeout_seconds,
        requested_by="test",
        **fields,  # type: ignore[arg-type]
    )


def test_given_a_timeout_that_ended_in_the_past_then_the_moved_deadline_is_now_never_earlier() -> None:
    now = STARTED + timedelta(seconds=90.5)
    assert moved_deadline(STARTED, 3600, now) == (STARTED + timedelta(hours=1), 3600)
    assert moved_deadline(STARTED, 60, now) == (now, 91)


def test_given_a_drain_extended_many_times_then_its_rechecks_stay_within_one_budget() -> None:
    """Each move spreads only what is left of the re-check budget: a drain of the longest timeout,
    moved again and again, still re-checks at most MAX_RECHECKS_PER_DRAIN times in all."""
    heartbeat = 300
    record = drain_record(MAX_DRAIN_TIMEOUT_SECONDS // 2)
    now = STARTED
    for _ in range(MAX_DEADLINE_MOVES):
        # Wait most of the way to the deadline, then move it later again.
        now = now + (record.deadline - now) * 0.9
        timeout = min(record.timeout_seconds + 86_400, MAX_DRAIN_TIMEOUT_SECONDS)
        deadline, timeout = moved_deadline(STARTED, timeout, now)
        record = record.model_copy(update=moved(record, deadline, timeout, now, heartbeat))
    assert record.rechecks_spent <= MAX_RECHECKS_PER_DRAIN
    left = (record.deadline - now).total_seconds()
    assert (
        record.rechecks_spent + math.ceil(left / drain_heartbeat(heartbeat, record))
        <= MAX_RECHECKS_PER_DRAIN + 1
    )
