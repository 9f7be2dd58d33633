"""Spot warnings, scale-down and orphan GC against the real drain workflow on moto's Step Functions."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainThen, Instance, utcnow
from fleetkeeper.services import drains, instances
from fleetkeeper.services.context import build_context
from fleetkeeper.settings import Settings
from fleetkeeper_local.event_shapes import spot_warning_event
from fleetkeeper_local.invocation import invoke
from tests.integration.conftest import eventually
from tests.integration.functions import discover_and_collect, reconcile_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_given_a_spot_warning_then_the_worker_drains_with_the_interruption_as_deadline(
    control_plane, store, live_worker
):
    worker = live_worker()
    store.place_instance(Instance(id="i-spot", worker_id=""), worker, actor="test")

    result = invoke("ec2_events", spot_warning_event(worker.ec2_instance_id or "", region="us-east-1"))

    draining = store.get_worker(worker.id)
    assert result["outcome"] == "drain_started"
    assert draining.status == WorkerStatus.DRAINING
    assert draining.drain is not None
    assert draining.drain.then == DrainThen.TERMINATE
    assert draining.drain.timeout_seconds <= 120
    assert draining.drain.deadline - utcnow() <= timedelta(minutes=2)


def test_given_an_idle_busy_worker_then_scale_down_starts_a_real_drain(control_plane, store, live_worker):
    ctx = build_context(
        Settings.from_environ({**os.environ, "SCALE_DOWN_ENABLED": "true", "METRICS_INTERVAL_SECONDS": "0"})
    )
    live_worker()
    worker = live_worker()
    store.place_instance(Instance(id="i-idle", worker_id=""), worker, actor="test")
    worker = store.get_worker(worker.id)
    store.update_worker(
        worker, {"idle_since": utcnow() - timedelta(hours=1)}, actor="test", action="IdleSeeded"
    )

    report = reconcile_fleet(ctx)

    assert report.counters["scale_down_drain_count"] == 1
    drained = store.get_worker(worker.id)
    # The drain's workflow runs on its own: its begin step moves the SCHEDULED instance to the other
    # worker, and with nothing left it stops the worker. A read may land before or after that.
    assert drained.status in {WorkerStatus.DRAINING, WorkerStatus.STOPPING, WorkerStatus.STOPPED}
    assert drained.drain is not None
    assert drained.drain.requested_by == "scale-down"
    assert drained.drain.generation == worker.next_drain_generation


def test_given_a_draining_worker_whose_machine_vanished_then_gc_ends_it_and_closes_the_drain(
    control_plane, store, ec2, live_worker
):
    worker = live_worker()
    store.place_instance(Instance(id="i-stuck", worker_id=""), worker, actor="test")
    status = drains.start_worker_drain(control_plane.ctx, worker.id, actor="op", reason="maintenance")
    ec2.terminate_instances(InstanceIds=[worker.ec2_instance_id])

    # The only worker of the region: the circuit breaker (tested in test_safety_breakers.py) is off.
    settings = control_plane.ctx.settings.model_copy(update={"orphan_gc_max_share_percent": 100.0})
    report = discover_and_collect(build_context(settings))

    gone = store.get_worker(worker.id)
    assert report.counters["orphans_terminated"] == 1
    assert gone.status == WorkerStatus.TERMINATED
    assert gone.drain is not None
    assert gone.drain.outcome == DrainOutcome.ERROR
    assert status.execution_arn is not None
    finished: Any = control_plane.wait_for_execution(status.execution_arn, timeout=30)
    assert finished["status"] != "RUNNING"


def test_given_a_reconcile_and_a_discovery_then_get_stats_serves_their_counters(
    control_plane, store, live_worker
):
    live_worker()
    reconcile_fleet(control_plane.ctx)
    discover_and_collect(control_plane.ctx)

    status, body = control_plane.api("GET", "/api/v1/stats")

    assert status == 200
    assert body["counters"]["reconcile"]["outcome_success"] == 1
    assert body["counters"]["reconcile"]["running_worker_count"] == 1
    assert body["counters"]["discovery"]["discovered"] == 1
    assert "last_run_at" in body["counters"]["discovery"]


def test_given_a_busy_worker_desired_stopped_then_it_drains_and_stops_after_its_work(
    control_plane, store, live_worker
):
    worker = live_worker()
    placed = store.place_instance(Instance(id="i-busy", worker_id=""), worker, actor="test")
    worker = store.get_worker(worker.id)
    store.update_worker(
        worker, {"desired_status": WorkerStatus.STOPPED}, actor="test", action="DesiredStatusSet"
    )

    report = reconcile_fleet(control_plane.ctx)

    assert report.counters["desired_status_drains"] == 1
    draining = store.get_worker(worker.id)
    assert (draining.status, draining.drain.then) == (WorkerStatus.DRAINING, DrainThen.STOP)
    eventually(lambda: store.get_worker(worker.id).drain.task_token or None)
    instances.change_instance_state(control_plane.ctx, placed.id, InstanceState.COMPLETED, actor="test")
    eventually(lambda: store.get_worker(worker.id).status is WorkerStatus.STOPPING)
