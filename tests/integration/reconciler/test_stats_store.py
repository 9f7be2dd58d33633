"""Counters and the run lease on DynamoDB Local."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.store.stats import StatsStore
from fleetkeeper_local import faults

pytestmark = pytest.mark.integration

T0 = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def stats(dynamodb, table_name) -> StatsStore:
    return StatsStore(dynamodb, table_name)


def test_given_counters_from_concurrent_writers_then_none_is_lost(stats):
    def add() -> None:
        for _ in range(20):
            stats.record("reconcile", counters={"provisioned_count": 1, "drift_corrections": 2})

    threads = [threading.Thread(target=add) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    counters = stats.read("reconcile").counters
    assert counters == {"provisioned_count": 80, "drift_corrections": 160}


def test_given_gauges_and_timestamps_then_the_latest_value_wins(stats):
    stats.record("reconcile", gauges={"running_worker_count": 7}, timestamps={"last_run_at": T0})
    stats.record(
        "reconcile", gauges={"running_worker_count": 5}, timestamps={"last_run_at": T0 + timedelta(minutes=1)}
    )

    read = stats.read("reconcile")
    assert read.gauges == {"running_worker_count": 5}
    assert read.timestamps == {"last_run_at": (T0 + timedelta(minutes=1)).isoformat()}


def test_given_notes_then_each_is_replaced_whole_and_left_out_of_the_stats_view(stats):
    first = {"labs": "repair brake, 2 of 8 unhealthy", "gpu": "x"}
    stats.record("reconcile", notes={"repair_blocked": first})
    stats.record("reconcile", notes={"repair_blocked": {"gpu": "repair brake, 3 of 4 unhealthy"}})

    assert stats.read("reconcile").notes == {"repair_blocked": {"gpu": "repair brake, 3 of 4 unhealthy"}}

    stats.record("reconcile", counters={"provisioned_count": 1}, notes={"repair_blocked": {}})

    assert stats.read("reconcile").notes == {"repair_blocked": {}}
    assert stats.counters_by_scope() == {"reconcile": {"provisioned_count": 1}}


def test_given_several_scopes_then_the_stats_view_lists_each_flat(stats):
    stats.record("reconcile", counters={"provisioned_count": 2})
    stats.record("discovery", counters={"orphans_terminated": 10}, gauges={"discovered": 3})

    flat = stats.counters_by_scope()

    assert flat == {
        "discovery": {"orphans_terminated": 10, "discovered": 3},
        "reconcile": {"provisioned_count": 2},
    }
    assert stats.read("never-recorded").counters == {}


def test_given_a_held_lease_then_others_wait_until_it_expires_or_is_released(stats):
    assert stats.acquire_lease("reconcile", "a", now=T0, until=T0 + timedelta(minutes=5))
    assert not stats.acquire_lease(
        "reconcile", "b", now=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=6)
    )
    assert stats.acquire_lease(
        "reconcile", "b", now=T0 + timedelta(minutes=6), until=T0 + timedelta(minutes=11)
    )

    stats.release_lease("reconcile", "a", now=T0 + timedelta(minutes=7))  # no longer a's: a no-op
    assert not stats.acquire_lease(
        "reconcile", "c", now=T0 + timedelta(minutes=8), until=T0 + timedelta(minutes=9)
    )

    stats.release_lease("reconcile", "b", now=T0 + timedelta(minutes=8))
    assert stats.acquire_lease(
        "reconcile", "c", now=T0 + timedelta(minutes=8, seconds=1), until=T0 + timedelta(minutes=9)
    )


# ---- the conditional writes go through the table's one mapping, retried like every call ----------


def _throttled_once(operation: str) -> faults.Fault:
    return faults.dynamodb_throttling(1.0, limit=1, operations=frozenset({operation}))


def test_given_a_throttled_lease_write_then_the_lease_is_taken_after_backoff(table_name):
    throttled = _throttled_once("PutItem")
    with faults.FaultPlan(faults=[throttled]).installed():
        hooked = StatsStore(client("dynamodb"), table_name)
        assert hooked.acquire_lease("reconcile", "a", now=T0, until=T0 + timedelta(minutes=5))
        assert not hooked.acquire_lease("reconcile", "b", now=T0, until=T0 + timedelta(minutes=5))
    assert throttled.injected == 1


def test_given_a_throttled_release_then_the_lease_is_released_after_backoff(stats, table_name):
    assert stats.acquire_lease("reconcile", "a", now=T0, until=T0 + timedelta(minutes=5))
    throttled = _throttled_once("UpdateItem")
    with faults.FaultPlan(faults=[throttled]).installed():
        StatsStore(client("dynamodb"), table_name).release_lease("reconcile", "a", now=T0)
    assert throttled.injected == 1
    assert stats.acquire_lease(
        "reconcile", "b", now=T0 + timedelta(seconds=1), until=T0 + timedelta(minutes=5)
    )


def test_given_a_throttled_claim_then_it_is_claimed_after_backoff_and_only_once(table_name):
    throttled = _throttled_once("UpdateItem")
    with faults.FaultPlan(faults=[throttled]).installed():
        hooked = StatsStore(client("dynamodb"), table_name)
        claim = {"now": T0, "free_before": T0 - timedelta(minutes=10)}
        assert hooked.claim_timestamp("scale_down", "last_scale_down_at", **claim)
        assert not hooked.claim_timestamp("scale_down", "last_scale_down_at", **claim)
    assert throttled.injected == 1
