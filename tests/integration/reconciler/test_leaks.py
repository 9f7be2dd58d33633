"""Every running machine carrying the managed tag belongs to a live worker or is terminated."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.services import workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.functions import discover_and_collect, reconcile_fleet
from tests.integration.reconciler.support import claimed_and_launched, ec2_state, ensure_template, launch

pytestmark = pytest.mark.integration

S = WorkerStatus
GONE = ("shutting-down", "terminated")


def claimed_then_abandoned(store: FleetStore, ec2: Any, image: str) -> tuple[Worker, str]:
    """A PENDING worker whose RunInstances went through but whose reconciler died before recording it,
    and which the user then asked to terminate."""
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    worker, machine = claimed_and_launched(
        store, ec2, worker, image, claimed_at=utcnow() - timedelta(minutes=6)
    )
    worker = store.update_worker(worker, {"desired_status": S.TERMINATED}, actor="test", action="Desired")
    return worker, machine


def retired_on_purpose(store: FleetStore, ec2: Any, image: str) -> tuple[Worker, str]:
    """What the reconciler did before: a PENDING worker marked TERMINATED while its machine ran on."""
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    machine = launch(ec2, worker.id, image)
    worker = store.transition_worker(
        worker,
        S.TERMINATED,
        cause=Cause.CONTROL,
        actor="reconciler",
        changes={"terminated_by": "reconciler", "terminated_reason": "abandoned before launch"},
    )
    return worker, machine


def test_given_a_worker_abandoned_after_its_launch_was_claimed_then_its_machine_is_terminated_first(
    ctx, store, ec2, lab_image
):
    worker, machine = claimed_then_abandoned(store, ec2, lab_image)

    report = reconcile_fleet(ctx)

    retired = store.get_worker(worker.id)
    assert retired.status == S.TERMINATED
    assert retired.ec2_instance_id == machine
    assert ec2_state(ec2, machine) in GONE
    assert report.counters["abandoned_launches_terminated"] == 1


def test_given_a_worker_abandoned_while_its_launch_is_in_flight_then_it_waits_for_the_launch(
    ctx, store, ec2, lab_image
):
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    worker = store.update_worker(
        worker,
        {"launch_claimed_at": utcnow(), "desired_status": S.TERMINATED},
        actor="test",
        action="LaunchClaimed",
    )

    reconcile_fleet(ctx)

    assert store.get_worker(worker.id).status == S.PENDING


def test_given_a_machine_whose_worker_was_retired_on_purpose_then_discovery_terminates_it(
    ctx, store, ec2, lab_image
):
    worker, machine = retired_on_purpose(store, ec2, lab_image)

    report = discover_and_collect(ctx)

    assert ec2_state(ec2, machine) in GONE
    assert report.counters["leaked_machines"] == 1
    assert report.counters["leaked_machines_terminated"] == 1
    assert report.counters["resurrected"] == 0
    assert store.get_worker(worker.id).status == S.TERMINATED
    assert ctx.stats.read("discovery").counters["leaked_machines"] == 1


def test_given_report_only_then_a_leaked_machine_is_reported_and_left_running(
    make_ctx, store, ec2, lab_image
):
    _, machine = retired_on_purpose(store, ec2, lab_image)

    report = discover_and_collect(make_ctx(GC_MODE="report-only"))

    assert ec2_state(ec2, machine) == "running"
    assert report.counters["leaked_machines"] == 1
    assert report.counters["leaked_machines_terminated"] == 0
    assert report.as_dict()["regions"][0]["leaked_machines"] == [machine]


def test_given_a_second_machine_tagged_for_a_live_worker_then_discovery_terminates_only_the_second(
    ctx, store, ec2, live_worker, lab_image
):
    worker = live_worker()
    extra = launch(ec2, worker.id, lab_image)

    report = discover_and_collect(ctx)

    assert ec2_state(ec2, extra) in GONE
    assert ec2_state(ec2, worker.ec2_instance_id or "") == "running"
    assert store.get_worker(worker.id).status == S.RUNNING
    assert report.counters["leaked_machines"] == 1


def test_given_the_indexes_lag_when_a_worker_just_recorded_its_machine_then_discovery_leaves_both_alone(
    make_ctx, table_name, ec2, lab_image
):
    plan = faults.FaultPlan(index_lag_seconds=60)
    with plan.installed():
        lagging = FleetStore(client("dynamodb"), table_name)
        ensure_template(lagging)
        worker = workers.create_worker(lagging, template="lab", region="us-east-1", actor="test")
        machine = launch(ec2, worker.id, lab_image)
        lagging.transition_worker(
            worker, S.PROVISIONING, cause=Cause.CONTROL, actor="test", changes={"ec2_instance_id": machine}
        )

        report = discover_and_collect(make_ctx())

    assert plan.hidden_by_lag >= 1
    assert ec2_state(ec2, machine) == "running"
    assert (report.counters["leaked_machines"], report.counters["imported"]) == (0, 0)
    assert lagging.get_worker(worker.id).status == S.PROVISIONING
