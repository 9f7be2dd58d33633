"""Idle detection from CloudWatch and scale-down through the reconcile cycle, guard by guard."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainThen, Instance, Worker, utcnow
from fleetkeeper.store.repository import FleetStore
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import SCALE_DOWN as ENABLED
from tests.integration.reconciler.support import report_cpu

pytestmark = pytest.mark.integration


def idle_for(store: FleetStore, worker: Worker, minutes: int) -> Worker:
    return store.update_worker(
        worker, {"idle_since": utcnow() - timedelta(minutes=minutes)}, actor="test", action="IdleSeeded"
    )


def test_given_low_cpu_then_idle_since_is_set_once_with_a_metrics_snapshot(make_ctx, store, live_worker):
    ctx = make_ctx(METRICS_INTERVAL_SECONDS="60")
    worker = live_worker()
    report_cpu(worker, 1.5)

    first = reconcile_fleet(ctx)
    marked = store.get_worker(worker.id)
    reconcile_fleet(ctx)

    assert marked.idle_since is not None
    assert marked.metrics is not None
    assert marked.metrics.cpu_utilization == 1.5
    assert first.counters["metrics_collected_count"] == 1
    assert store.get_worker(worker.id).version == marked.version  # still idle: nothing new to write


def test_given_high_cpu_then_idle_since_is_cleared(make_ctx, store, live_worker):
    ctx = make_ctx(METRICS_INTERVAL_SECONDS="60")
    worker = idle_for(store, live_worker(), 5)
    report_cpu(worker, 80.0)

    reconcile_fleet(ctx)

    assert store.get_worker(worker.id).idle_since is None


def test_given_an_empty_worker_idle_for_the_window_then_it_is_stopped_at_once(
    make_ctx, store, ec2, live_worker
):
    ctx = make_ctx(**ENABLED)
    keep = live_worker()
    worker = idle_for(store, live_worker(), 31)
    report_cpu(worker, 1.0)

    report = reconcile_fleet(ctx)

    assert store.get_worker(worker.id).status == WorkerStatus.STOPPING
    assert store.get_worker(keep.id).status == WorkerStatus.RUNNING
    assert report.counters["scale_down_stop_count"] == 1


def test_given_an_idle_worker_with_instances_then_a_drain_is_started(
    make_ctx, store, live_worker, drains_started
):
    ctx = make_ctx(**ENABLED)
    live_worker()
    worker = live_worker()
    store.place_instance(Instance(id="i-quiet", worker_id=""), worker, actor="test")
    idle_for(store, store.get_worker(worker.id), 31)

    report = reconcile_fleet(ctx)

    assert [(d["worker_id"], d["then"]) for d in drains_started] == [(worker.id, DrainThen.STOP)]
    assert report.counters["scale_down_drain_count"] == 1


@pytest.mark.parametrize(
    ("overrides", "guard"),
    [
        ({"SCALE_DOWN_ENABLED": "false"}, "disabled"),
        ({"MIN_WORKERS": "2"}, "min_workers"),
    ],
)
def test_given_a_fleet_guard_then_the_idle_worker_stays_and_the_refusal_is_counted(
    make_ctx, store, live_worker, overrides, guard
):
    ctx = make_ctx(**{**ENABLED, **overrides})
    live_worker()
    worker = idle_for(store, live_worker(), 31)

    report = reconcile_fleet(ctx)

    assert store.get_worker(worker.id).status == WorkerStatus.RUNNING
    assert report.counters[f"scale_down_refused_{guard}"] == 1


def test_given_a_scale_down_in_the_scope_then_cooldown_refuses_the_next_one(make_ctx, store, live_worker):
    ctx = make_ctx(**ENABLED)
    live_worker()
    first = idle_for(store, live_worker(), 31)
    second = idle_for(store, live_worker(), 31)

    report = reconcile_fleet(ctx)

    statuses = sorted(str(store.get_worker(w.id).status) for w in (first, second))
    assert statuses == ["RUNNING", "STOPPING"]
    assert report.counters["scale_down_refused_cooldown"] == 1
    assert reconcile_fleet(ctx).counters["scale_down_refused_cooldown"] == 1


def test_given_no_cooldown_then_every_idle_worker_of_a_scope_above_its_minimum_stops_in_one_cycle(
    make_ctx, store, live_worker
):
    # A stop is a disruption like a drain: the stage default bounds it too, and allows both here.
    ctx = make_ctx(**ENABLED, SCALE_DOWN_COOLDOWN_SECONDS="0", MIN_WORKERS="1", MAX_CONCURRENT_DRAINS="2")
    live_worker()
    idle = [idle_for(store, live_worker(), 31) for _ in range(2)]

    report = reconcile_fleet(ctx)

    # Nothing to claim without a cooldown: only the minimum per scope holds the scope's workers.
    assert [store.get_worker(w.id).status for w in idle] == [WorkerStatus.STOPPING] * 2
    assert report.counters["scale_down_stop_count"] == 2
    assert report.counters["scale_down_refused_cooldown"] == 0


def test_given_do_not_disrupt_then_the_idle_worker_stays(make_ctx, store, live_worker):
    ctx = make_ctx(**ENABLED)
    live_worker()
    worker = live_worker()
    worker = store.update_worker(worker, {"do_not_disrupt": True}, actor="test", action="Pinned")
    idle_for(store, worker, 31)

    report = reconcile_fleet(ctx)

    assert report.counters["scale_down_refused_do_not_disrupt"] == 1
    assert store.get_worker(worker.id).status == WorkerStatus.RUNNING


def test_given_do_not_disrupt_until_then_the_idle_worker_stays_until_it_lapses(make_ctx, store, live_worker):
    ctx = make_ctx(**ENABLED)
    live_worker()
    worker = live_worker()
    until = utcnow() + timedelta(minutes=10)
    worker = store.update_worker(worker, {"do_not_disrupt_until": until}, actor="test", action="Pinned")
    idle_for(store, worker, 31)

    protected = reconcile_fleet(ctx)
    lapsed = reconcile_fleet(ctx, now=until + timedelta(seconds=1))

    assert protected.counters["scale_down_refused_do_not_disrupt"] == 1
    assert lapsed.counters["scale_down_refused_do_not_disrupt"] == 0
    assert store.get_worker(worker.id).status == WorkerStatus.STOPPING


def test_given_a_timeslot_starting_soon_then_the_idle_worker_is_not_drained(
    make_ctx, store, live_worker, drains_started
):
    ctx = make_ctx(**ENABLED)
    live_worker()
    worker = live_worker()
    store.place_instance(
        Instance(id="i-soon", worker_id="", timeslot_start=utcnow() + timedelta(minutes=5)),
        worker,
        actor="test",
    )
    idle_for(store, store.get_worker(worker.id), 31)

    report = reconcile_fleet(ctx)

    assert report.counters["scale_down_refused_upcoming_timeslot"] == 1
    assert drains_started == []


def test_given_the_disruption_budget_is_used_then_no_further_drain(
    make_ctx, store, live_worker, drains_started
):
    ctx = make_ctx(**ENABLED, MAX_CONCURRENT_DRAINS="1", SCALE_DOWN_COOLDOWN_SECONDS="0")
    live_worker()
    busy = []
    for n in range(2):
        worker = live_worker()
        store.place_instance(Instance(id=f"i-b{n}", worker_id=""), worker, actor="test")
        busy.append(idle_for(store, store.get_worker(worker.id), 31))

    report = reconcile_fleet(ctx)

    assert len(drains_started) == 1
    assert report.counters["scale_down_refused_disruption_budget"] == 1
