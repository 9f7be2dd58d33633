"""Drain steps racing cancels, state reports and forged answers, on DynamoDB Local and moto's Step Functions.

The races are made deterministic with a botocore hook on the real DynamoDB client: the competing write
(a cancel, a state report) commits just before force's own write is sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.errors import Conflict, DrainFinishing
from fleetkeeper.domain.lifecycle import (
    ACTIVE_INSTANCE_STATES,
    Cause,
    InstanceState,
    PoolStatus,
    WorkerStatus,
)
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, Worker, utcnow
from fleetkeeper.services import drains, instances
from fleetkeeper.services.context import Context
from tests.integration.conftest import ControlPlane, eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def place(plane: ControlPlane, worker_id: str) -> str:
    status, body = plane.api("POST", "/api/v1/instances", {"worker_id": worker_id})
    assert status == 201, body
    return str(body["id"])


def expired_drain(ctx: Context, worker: Worker) -> drains.DrainInput:
    """The worker DRAINING under a drain whose deadline has passed, as mark_draining writes it."""
    started = utcnow() - timedelta(minutes=5)
    record = DrainRecord(
        generation=worker.next_drain_generation,
        started_at=started,
        deadline=started + timedelta(seconds=60),
        timeout_seconds=60,
        requested_by="op",
    )
    ctx.store.transition_worker(
        ctx.store.get_worker(worker.id),
        WorkerStatus.DRAINING,
        cause=Cause.CONTROL,
        actor="op",
        changes={"drain": record},
    )
    return drains.DrainInput(
        kind="worker",
        worker_id=worker.id,
        generation=record.generation,
        timeout_seconds=record.timeout_seconds,
        started_at=record.started_at,
        deadline=record.deadline,
        requested_by=record.requested_by,
        then=record.then.value,
        heartbeat_seconds=300,
    )


@contextmanager
def before_first_forced_end(action: Callable[[str], object]) -> Iterator[None]:
    """Run `action(instance_id)` once, just before the first drain_timeout end is sent to DynamoDB."""
    events = client("dynamodb").meta.events
    fired = threading.Event()

    def hook(params: dict[str, Any], **_: Any) -> None:
        body = params.get("body")
        text = body.decode() if isinstance(body, bytes) else str(body)
        if fired.is_set() or "drain_timeout" not in text:
            return
        fired.set()
        items = json.loads(text)["TransactItems"]
        ending = next(
            i["Put"]["Item"]["id"]["S"] for i in items if "Put" in i and "state" in i["Put"]["Item"]
        )
        action(ending)

    events.register("before-call.dynamodb.TransactWriteItems", hook)
    try:
        yield
    finally:
        events.unregister("before-call.dynamodb.TransactWriteItems", hook)
    assert fired.is_set(), "force never tried to end an instance"


def test_given_a_cancel_while_forcing_then_it_is_refused_as_finishing_and_every_instance_is_forced(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ctx = control_plane.ctx
    worker = ec2_worker()
    placed = [place(control_plane, worker.id), place(control_plane, worker.id)]
    drain = expired_drain(ctx, worker)
    refused: list[Exception] = []

    def cancel(_: str) -> None:
        try:
            drains.cancel_worker_drain(ctx, worker.id, actor="alice")
        except DrainFinishing as finishing:
            refused.append(finishing)

    # The force marked the drain finishing before ending anything: the cancel comes too late.
    with before_first_forced_end(cancel):
        drains.force(ctx, drain)

    assert len(refused) == 1
    after = ctx.store.get_worker(worker.id)
    assert after.drain is not None
    assert after.drain.outcome is DrainOutcome.RUNNING  # the workflow records the timeout next
    assert after.active_instances == 0
    assert all(ctx.store.get_instance(i).state not in ACTIVE_INSTANCE_STATES for i in placed)


def test_given_a_state_report_while_forcing_then_force_still_ends_every_instance_before_finish(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ctx = control_plane.ctx
    worker = ec2_worker()
    placed = [place(control_plane, worker.id) for _ in range(3)]
    drain = expired_drain(ctx, worker)

    def report_on_another(ending: str) -> None:
        # A workload reports RUNNING on another instance: its version moves under force's read.
        other = next(i for i in placed if i != ending)
        instances.change_instance_state(ctx, other, InstanceState.RUNNING, actor="workload")

    with before_first_forced_end(report_on_another):
        forced = drains.force(ctx, drain)

    assert forced == {"forced_instances": 3}
    assert ctx.store.get_worker(worker.id).active_instances == 0
    assert [ctx.store.get_instance(i).state for i in placed] == [InstanceState.TERMINATED] * 3
    drains.finish(ctx, drain)
    final = ctx.store.get_worker(worker.id)
    assert final.status is WorkerStatus.STOPPING
    assert final.drain is not None
    assert (final.drain.outcome, final.drain.forced_instances) == (DrainOutcome.TIMED_OUT, 3)


def test_given_a_forged_success_while_work_runs_then_the_drain_waits_again(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    worker = ec2_worker()
    instance = place(control_plane, worker.id)
    status, started = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/drain", {"timeout_seconds": 600}
    )
    assert status == 202
    store = control_plane.ctx.store

    def token() -> str | None:
        record = store.get_worker(worker.id).drain
        return record.task_token if record else None

    forged = eventually(token)
    boto3.client("stepfunctions").send_task_success(taskToken=forged, output=json.dumps({"empty": True}))

    # The finish step re-reads, finds work, and the workflow goes back to waiting with a new token.
    eventually(lambda: (token() or forged) != forged)
    assert store.get_worker(worker.id).status is WorkerStatus.DRAINING
    assert control_plane.execution(started["execution_arn"])["status"] == "RUNNING"
    entered = control_plane.states_entered(started["execution_arn"])
    assert entered[entered.index("Finish") + 1] == "Recheck"

    instances.change_instance_state(control_plane.ctx, instance, InstanceState.COMPLETED, actor="workload")
    assert control_plane.wait_for_execution(started["execution_arn"])["status"] == "SUCCEEDED"
    final = store.get_worker(worker.id)
    assert final.status is WorkerStatus.STOPPING
    assert final.drain is not None
    assert final.drain.outcome is DrainOutcome.SUCCESS


def test_given_concurrent_cancels_of_one_draining_pool_then_exactly_one_wins(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ctx = control_plane.ctx
    ec2_worker(pool="labs")
    status, body = control_plane.api("POST", "/api/v1/instances", {"pool": "labs"})
    assert status == 201, body
    drains.start_pool_drain(ctx, "labs", actor="op", timeout_seconds=600)
    eventually(lambda: ctx.store.get_pool("labs").drain_task_token)
    barrier = threading.Barrier(4)
    answers: list[str] = []

    def cancel() -> None:
        barrier.wait()
        try:
            drains.cancel_pool_drain(ctx, "labs", actor="op")
            answers.append("ok")
        except Conflict:
            answers.append("conflict")

    threads = [threading.Thread(target=cancel) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(answers) == ["conflict", "conflict", "conflict", "ok"]
    pool = ctx.store.get_pool("labs")
    assert (pool.status, pool.drain_outcome) == (PoolStatus.ACTIVE, DrainOutcome.CANCELLED)
    trail = [e.action for e in ctx.store.audit_trail("pool", "labs")]
    assert trail.count("PoolDrainCancelled") == 1


def test_given_a_pool_whose_drain_completed_then_cancel_is_409(
    control_plane: ControlPlane, ec2_worker: Callable[..., Worker]
) -> None:
    ec2_worker(pool="edge")
    _, pool = control_plane.api("POST", "/api/v1/pools/edge/drain", {})
    assert control_plane.wait_for_execution(pool["drain_execution_arn"])["status"] == "SUCCEEDED"

    status, body = control_plane.api("POST", "/api/v1/pools/edge/cancel-drain")

    assert status == 409
    assert body["details"]["current_status"] == "inactive"
    assert control_plane.ctx.store.get_pool("edge").status is PoolStatus.INACTIVE
