"""Drain limits that keep every execution inside Step Functions' own limits (docs/drains.md)."""

from __future__ import annotations

import math

from fleetkeeper.domain.drain_policy import MAX_RECHECKS_PER_DRAIN, recheck_heartbeat, worker_drain_timeout
from fleetkeeper.domain.models import MAX_DRAIN_TIMEOUT_SECONDS
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
