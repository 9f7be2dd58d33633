"""One worker's failure stays its own: the cycle, the other workers and the drain sweep go on."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainRecord, Instance, Worker, utcnow
from fleetkeeper.services import workers
from fleetkeeper.store import keys
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import (
    LAB_IMAGE_NAME,
    SCALE_DOWN,
    ensure_template,
    instances_tagged,
    launch,
    report_cpu,
)

pytestmark = pytest.mark.integration

S = WorkerStatus


def write_naive_timeslot(dynamodb: Any, table_name: str, instance_id: str) -> None:
    """What a record written before timeslots had to carry a timezone looks like: no offset at all."""
    dynamodb.update_item(
        TableName=table_name,
        Key=serialize(keys.instance_key(instance_id)),
        UpdateExpression="SET timeslot_start = :t",
        ExpressionAttributeValues={
            ":t": {"S": (utcnow() + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S")}
        },
    )


def draining_with_a_waiting_token(store: FleetStore, worker: Worker) -> Worker:
    store.place_instance(Instance(id=f"i-busy-{worker.id}", worker_id=""), worker, actor="test")
    worker = store.get_worker(worker.id)
    now = utcnow()
    record = DrainRecord(
        generation=1,
        started_at=now,
        deadline=now + timedelta(hours=1),
        timeout_seconds=3600,
        requested_by="test",
        # The reconcile function always knows its drain workflow; these tests' context has none, so the
        # drain names its execution as a started drain does.
        execution_arn=f"arn:aws:states:us-east-1:123456789012:execution:fleetkeeper-drain:drain-{worker.id}-g1",
        task_token="token-of-a-waiting-drain",  # noqa: S106 - a task token, not a secret
    )
    return store.transition_worker(
        worker, S.DRAINING, cause=Cause.CONTROL, actor="test", changes={"drain": record}
    )


def test_given_an_instance_with_a_naive_timeslot_in_the_table_then_only_its_worker_fails_its_step(
    make_ctx, store, dynamodb, table_name, live_worker, *, lab_image
):
    ctx = make_ctx(**SCALE_DOWN)
    bad = live_worker()
    placed = store.place_instance(
        Instance(id="i-naive", worker_id="", timeslot_start=utcnow() + timedelta(minutes=5)),
        bad,
        actor="test",
    )
    bad = store.update_worker(
        store.get_worker(bad.id),
        {"idle_since": utcnow() - timedelta(minutes=31)},
        actor="test",
        action="IdleSeeded",
    )
    write_naive_timeslot(dynamodb, table_name, placed.id)
    report_cpu(bad, 1.0)
    healthy = live_worker()
    healthy = store.update_worker(healthy, {"desired_status": S.STOPPED}, actor="test", action="Desired")
    pending = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    drained = draining_with_a_waiting_token(store, live_worker())
    # The sweep's heartbeat on the waiting drain is answered "no such task": seen, and harmless.
    plan = faults.FaultPlan(faults=[faults.sfn_task_does_not_exist(1.0)])

    with plan.installed():
        report = reconcile_fleet(make_ctx(**SCALE_DOWN))

    assert report.completed
    assert report.counters["worker_errors"] == 1
    failed = store.get_worker(bad.id)
    assert (failed.status, failed.reconcile_attempts) == (S.RUNNING, 1)
    assert failed.next_reconcile_at is not None
    assert "timeslot_start" in (failed.last_reconcile_error or "")
    assert store.get_worker(healthy.id).status == S.STOPPING
    assert store.get_worker(pending.id).status == S.PROVISIONING
    assert store.get_worker(drained.id).status == S.DRAINING
    assert plan.injected["stepfunctions:TaskDoesNotExist"] == 1  # the drain sweep ran
    assert ctx.stats.read("reconcile").counters["worker_errors"] == 1


def test_given_a_template_stored_with_a_tag_ec2_refuses_then_only_its_workers_fail_and_ec2_stays_readable(
    ctx, store, ec2, live_worker, lab_image
):
    # Stored before the API checked tag characters: on the local stack its NUL once reached EC2, whose
    # every later DescribeInstances answer was unreadable XML, and the whole fleet stalled PENDING.
    ensure_template(store)
    ensure_template(store, "tainted", tags={"team": "labs\u0000"})
    tainted = workers.create_worker(store, template="tainted", region="us-east-1", actor="test")
    fine = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    running = live_worker()

    report = reconcile_fleet(ctx)
    failed, launched = store.get_worker(tainted.id), store.get_worker(fine.id)
    later = reconcile_fleet(ctx)

    assert failed.status == S.FAILED
    assert "template 'tainted' launches with tags EC2 refuses" in (failed.status_reason or "")
    assert "U+0000" in (failed.status_reason or "")
    assert instances_tagged(ec2, tainted.id) == []
    assert launched.status == S.PROVISIONING
    assert report.counters["provisioned_count"] == 1
    # EC2 still answers for the whole region: the next cycle reads every machine.
    assert later.completed
    assert (later.counters["region_unavailable"], later.counters["reconcile_errors"]) == (0, 0)
    assert store.get_worker(fine.id).status == S.RUNNING
    assert store.get_worker(running.id).status == S.RUNNING
    assert len(ec2.describe_instances()["Reservations"]) == 2


def test_given_ec2_throttles_one_region_then_its_workers_back_off_and_the_other_region_converges(
    make_ctx, store, ec2, live_worker, lab_image
):
    ensure_template(store)
    eu = boto3.client("ec2", region_name="eu-west-1")
    eu_image = eu.register_image(Name=LAB_IMAGE_NAME, RootDeviceName="/dev/sda1")["ImageId"]
    far = workers.create_worker(store, template="lab", region="eu-west-1", actor="test")
    far_instance = launch(eu, far.id, eu_image)
    far = store.transition_worker(
        far, S.PROVISIONING, cause=Cause.CONTROL, actor="test", changes={"ec2_instance_id": far_instance}
    )
    near = store.update_worker(live_worker(), {"desired_status": S.STOPPED}, actor="test", action="Desired")
    throttled = faults.ec2_throttling(
        1.0,
        operations=frozenset({"DescribeInstances"}),
        when=lambda _op, params: far_instance in params.values(),
    )
    plan = faults.FaultPlan(seed=7, faults=[throttled])

    with plan.installed():
        report = reconcile_fleet(make_ctx())
        waiting = store.get_worker(far.id)
        later = reconcile_fleet(
            make_ctx(), now=(waiting.next_reconcile_at or utcnow()) + timedelta(seconds=1)
        )

    assert report.completed
    assert throttled.injected >= 1
    assert report.counters["region_unavailable"] == 1
    assert report.counters["reconcile_errors"] == 1
    assert report.counters["worker_errors"] == 0
    assert (waiting.status, waiting.reconcile_attempts) == (S.PROVISIONING, 1)
    assert "RequestLimitExceeded" in (waiting.last_reconcile_error or "")
    assert store.get_worker(near.id).status == S.STOPPED  # the other region converged meanwhile
    # Still throttled: the backoff grows, the worker is never decided blind.
    assert later.counters["region_unavailable"] == 1
    assert store.get_worker(far.id).reconcile_attempts == 2
    assert store.get_worker(far.id).status == S.PROVISIONING


def test_given_a_final_ec2_error_on_one_workers_stop_then_it_waits_the_longest_backoff_and_others_converge(
    make_ctx, store, ec2, live_worker
):
    refused = store.update_worker(
        live_worker(), {"desired_status": S.STOPPED}, actor="test", action="Desired"
    )
    other = store.update_worker(live_worker(), {"desired_status": S.STOPPED}, actor="test", action="Desired")
    denied = faults.Fault(
        "ec2",
        "UnauthorizedOperation",
        frozenset({"StopInstances"}),
        when=lambda _op, params: refused.ec2_instance_id in params.values(),
    )
    plan = faults.FaultPlan(faults=[denied])

    with plan.installed():
        first = reconcile_fleet(make_ctx())
        now = utcnow()
        second = reconcile_fleet(make_ctx(), now=now)

    assert (first.completed, second.completed) == (True, True)
    assert first.counters["final_errors"] == second.counters["final_errors"] == 1
    waiting = store.get_worker(refused.id)
    assert waiting.status == S.STOPPING
    assert "UnauthorizedOperation" in (waiting.last_reconcile_error or "")
    assert waiting.next_reconcile_at is not None
    assert waiting.next_reconcile_at - now == timedelta(seconds=60)  # the longest backoff, at once
    assert store.get_worker(other.id).status == S.STOPPED
