"""The drain watchdog, run by the reconcile cycle's sweep: no open drain without a live execution."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.lifecycle import Cause, InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, PoolDrainThen, Worker, utcnow
from fleetkeeper.services import catalog, drains, instances
from fleetkeeper.services.context import Context, build_context
from fleetkeeper.settings import get_settings
from fleetkeeper_local import faults
from fleetkeeper_local.stack import remember_provisioned
from tests.integration.conftest import ControlPlane, eventually
from tests.integration.functions import reconcile_fleet, run_step, run_watchdog, sweep_waiting_drains

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def mark_draining(ctx: Context, worker: Worker, **record_fields: Any) -> DrainRecord:
    """What start_worker_drain writes before StartExecution, two minutes ago; no execution follows."""
    started = utcnow() - timedelta(minutes=2)
    generation = worker.next_drain_generation
    record = DrainRecord(
        generation=generation,
        started_at=started,
        deadline=started + timedelta(minutes=30),
        timeout_seconds=1800,
        requested_by="op",
        execution_arn=ctx.workflows.execution_arn(drains.execution_name("drain", worker.id, generation)),
    ).model_copy(update=record_fields)
    ctx.store.transition_worker(
        ctx.store.get_worker(worker.id),
        WorkerStatus.DRAINING,
        cause=Cause.CONTROL,
        actor="op",
        changes={"drain": record},
    )
    return record


def test_given_a_crash_between_the_drain_write_and_its_start_then_the_sweep_starts_it(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ctx = control_plane.ctx
    worker = ec2_worker()
    mark_draining(ctx, worker)

    swept = sweep_waiting_drains(ctx)

    assert swept["restarted"] == 1
    record = ctx.store.get_worker(worker.id).drain
    assert record is not None
    assert (record.restarts, record.generation) == (1, 1)
    assert record.execution_arn is not None
    assert record.execution_arn.endswith("-g1-r1")
    assert control_plane.wait_for_execution(record.execution_arn)["status"] == "SUCCEEDED"
    final = ctx.store.get_worker(worker.id)
    assert final.status is WorkerStatus.STOPPING
    assert final.drain is not None
    assert final.drain.outcome is DrainOutcome.SUCCESS
    trail = [e.action for e in ctx.store.audit_trail("worker", worker.id)]
    assert "WorkerDrainRestarted" in trail


def test_given_an_execution_that_vanished_then_a_new_one_for_the_same_generation_finishes_the_drain(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ctx = control_plane.ctx
    worker = ec2_worker()
    status, body = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})
    assert status == 201
    status, started = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/drain", {"timeout_seconds": 600}
    )
    assert status == 202

    def token() -> str | None:
        record = ctx.store.get_worker(worker.id).drain
        return record.task_token if record else None

    first_token = eventually(token)
    # Step Functions answers that the execution does not exist (it vanished).
    vanished = faults.Fault(
        "stepfunctions", "ExecutionDoesNotExist", frozenset({"DescribeExecution"}), limit=1
    )
    with faults.FaultPlan(faults=[vanished]).installed():
        verdicts = run_watchdog(build_context(get_settings()), grace=timedelta(0))

    assert verdicts["restarted"] == 1
    record = ctx.store.get_worker(worker.id).drain
    assert record is not None
    assert record.execution_arn != started["execution_arn"]
    # The replacement waits for the same work, with its own token, until the same deadline.
    eventually(lambda: (token() or first_token) != first_token)
    assert started["deadline"] == record.deadline.isoformat().replace("+00:00", "Z")
    assert run_watchdog(ctx, grace=timedelta(0))["running"] == 1
    instances.change_instance_state(ctx, body["id"], InstanceState.COMPLETED, actor="workload")
    assert control_plane.wait_for_execution(record.execution_arn or "")["status"] == "SUCCEEDED"
    assert ctx.store.get_worker(worker.id).status is WorkerStatus.STOPPING


def test_given_a_drain_out_of_restarts_then_it_is_closed_in_error_with_an_alert_and_the_worker_moves_on(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker], alert_feed: Callable[[], list[Any]]
) -> None:
    ctx = control_plane.ctx
    worker = ec2_worker()
    lost = ctx.workflows.execution_arn(drains.execution_name("drain", worker.id, 1, drains.MAX_RESTARTS))
    mark_draining(ctx, worker, restarts=drains.MAX_RESTARTS, execution_arn=lost)

    swept = sweep_waiting_drains(ctx)

    assert swept["closed"] == 1
    record = ctx.store.get_worker(worker.id).drain
    assert record is not None
    assert record.outcome is DrainOutcome.ERROR
    assert "execution does not exist" in (record.error or "")
    alerts = alert_feed()
    assert len(alerts) == 1
    assert worker.id in alerts[0]["Subject"]
    # Nothing is left to wait for: the next reconcile cycle stops the empty worker.
    reconcile_fleet(ctx)
    assert ctx.store.get_worker(worker.id).status is WorkerStatus.STOPPING


def test_given_an_execution_that_failed_without_recording_its_error_then_the_drain_is_closed(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    """RecordError itself failed: the execution ended in DrainFailed while the record says RUNNING."""
    ctx = control_plane.ctx
    sfn, iam = boto3.client("stepfunctions"), boto3.client("iam")
    role = iam.create_role(RoleName=f"gave-up-{uuid.uuid4().hex[:6]}", AssumeRolePolicyDocument="{}")["Role"]
    definition = {"StartAt": "Give up", "States": {"Give up": {"Type": "Fail", "Error": "DrainFailed"}}}
    machine = sfn.create_state_machine(
        name=f"gave-up-{uuid.uuid4().hex[:6]}", definition=json.dumps(definition), roleArn=role["Arn"]
    )["stateMachineArn"]
    # It stands for the stage's drain workflow, whose executions the watchdog's grant covers.
    remember_provisioned("state-machine", machine)
    failed = sfn.start_execution(stateMachineArn=machine)["executionArn"]
    assert control_plane.wait_for_execution(failed)["status"] == "FAILED"
    worker = ec2_worker()
    mark_draining(ctx, worker, execution_arn=failed)

    verdicts = run_watchdog(ctx)

    assert verdicts["closed"] == 1
    record = ctx.store.get_worker(worker.id).drain
    assert record is not None
    assert record.outcome is DrainOutcome.ERROR
    assert "FAILED: DrainFailed" in (record.error or "")


def test_given_a_pool_drain_whose_execution_never_started_then_the_sweep_starts_it(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ctx = control_plane.ctx
    ec2_worker(pool="labs")
    pool = ctx.store.get_pool("labs")
    started = utcnow() - timedelta(minutes=2)
    ctx.store.save_pool(
        pool,
        {
            "status": PoolStatus.DRAINING,
            "drain_started_at": started,
            "drain_timeout_seconds": 600,
            "drain_then": PoolDrainThen.NONE,
            "drain_generation": 1,
            "drain_outcome": DrainOutcome.RUNNING,
            "drain_requested_by": "op",
            "drain_execution_arn": ctx.workflows.execution_arn(drains.execution_name("pool", "labs", 1)),
        },
        actor="op",
        action="PoolDrainStarted",
    )

    assert sweep_waiting_drains(ctx)["restarted"] == 1

    after = ctx.store.get_pool("labs")
    assert after.drain_restarts == 1
    assert after.drain_execution_arn is not None
    assert control_plane.wait_for_execution(after.drain_execution_arn)["status"] == "SUCCEEDED"
    assert ctx.store.get_pool("labs").status is PoolStatus.INACTIVE


def test_given_a_pool_finish_retried_after_a_crash_then_it_starts_the_drains_it_marked_but_never_started(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ctx = control_plane.ctx
    marked, untouched = ec2_worker(pool="edge"), ec2_worker(pool="edge")
    catalog.ensure_pool(ctx.store, "edge", actor="test")
    pool = ctx.store.save_pool(
        ctx.store.get_pool("edge"),
        {
            "status": PoolStatus.DRAINING,
            "drain_started_at": utcnow(),
            "drain_timeout_seconds": 600,
            "drain_then": PoolDrainThen.STOP,
            "drain_generation": 1,
            "drain_outcome": DrainOutcome.RUNNING,
            "drain_requested_by": "op",
        },
        actor="op",
        action="PoolDrainStarted",
    )
    # The first attempt marked one worker for this pool drain and died before starting its execution.
    mark_draining(ctx, marked, reason="pool edge drained (drain 1)", requested_by=drains.WORKFLOW_ACTOR)

    result = run_step(
        ctx,
        drains.StepRequest(step="pool_finish", drain=drains.DrainInput.of_pool(ctx, pool)),
    )

    assert sorted(result["drained_workers"]) == sorted([marked.id, untouched.id])

    def both_stopping() -> bool:
        return all(ctx.store.get_worker(w.id).status is WorkerStatus.STOPPING for w in (marked, untouched))

    eventually(both_stopping, timeout=30)


@pytest.fixture
def alert_feed(control_plane: ControlPlane) -> Callable[[], list[Any]]:
    """Messages published to the operators' SNS topic, via an SQS subscription."""
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=f"alerts-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    boto3.client("sns").subscribe(
        TopicArn=control_plane.resources.topic_arn, Protocol="sqs", Endpoint=queue_arn
    )
    return lambda: [
        json.loads(m["Body"])
        for m in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
    ]


def test_given_a_finishing_drain_closed_by_the_watchdog_then_its_unrun_before_stop_operation_is_audited(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ctx = control_plane.ctx
    worker = ec2_worker()
    template = ctx.store.get_template(worker.template)
    ctx.store.put_template(template.model_copy(update={"before_stop": ["deregister-license"]}), actor="test")
    lost = ctx.workflows.execution_arn(drains.execution_name("drain", worker.id, 1, drains.MAX_RESTARTS))
    # Lost after Finish marked it (no cancel can undo it) and before its operations ran.
    mark_draining(ctx, worker, restarts=drains.MAX_RESTARTS, execution_arn=lost, finishing_at=utcnow())

    assert sweep_waiting_drains(ctx)["closed"] == 1
    reconcile_fleet(ctx)

    assert ctx.store.get_worker(worker.id).status is WorkerStatus.STOPPING
    trail = ctx.store.audit_trail("worker", worker.id)
    failed = [e for e in trail if e.action == "BeforeStopOperationFailed"]
    assert [(e.details or {}).get("operation") for e in failed] == ["deregister-license"]
