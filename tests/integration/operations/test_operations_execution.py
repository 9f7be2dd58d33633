"""The reconciler runs operations with SSM Run Command (moto), with SSM's failures injected into the real
client: success, failure retried with backoff up to the limit, timeout, system information, isolation."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.operations import Operation, OperationStatus, system_info_due
from fleetkeeper.services import operations
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.store.codec import serialize
from fleetkeeper_local import faults
from fleetkeeper_local.controlplane import refresh_process_caches
from tests.integration.functions import reconcile_fleet

pytestmark = pytest.mark.integration

LICENSE_SERVER = {"licenseServer": "licenses.example.com"}


def cycle(ctx: Context, now: datetime, workers: list[Worker] | None = None) -> Counter[str]:
    counters: Counter[str] = Counter()
    operations.reconcile_operations(ctx, workers or [], now, counters)
    return counters


def read(ctx: Context, op: Operation) -> Operation:
    return ctx.store.get_operation(op.worker_id, op.id)


def sent_commands(worker: Worker) -> list[dict[str, Any]]:
    listed = boto3.client("ssm", region_name=worker.region).list_commands(InstanceId=worker.ec2_instance_id)
    return list(listed["Commands"])


def test_given_a_pending_operation_when_the_reconciler_runs_then_ssm_runs_it_and_it_succeeds(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    op = operations.request(ctx, worker.id, "register-license", LICENSE_SERVER, actor="op")
    now = utcnow()

    sent = cycle(ctx, now)
    running = read(ctx, op)
    done = cycle(ctx, now + timedelta(seconds=5))

    assert (running.status, running.attempts, sent["operations_running"]) == (OperationStatus.RUNNING, 1, 1)
    final = read(ctx, op)
    assert (final.status, final.attempts, done["operations_success"]) == (OperationStatus.SUCCESS, 1, 1)
    [command] = sent_commands(worker)
    assert command["DocumentName"] == "fleetkeeper-dev-RegisterLicense"
    assert command["Parameters"] == {
        "licenseServer": ["licenses.example.com"],
        "licenseParameter": ["/fleetkeeper/test/license"],
    }
    assert command["CommandId"] == final.command_id
    # The lock went with the finish: the next operation is accepted.
    assert operations.request(ctx, worker.id, "collect-system-info", {}, actor="op").status == "PENDING"


def emitted(output: str) -> Counter[tuple[str, str]]:
    """(metric, operation) of every per-operation EMF line printed."""
    found: Counter[tuple[str, str]] = Counter()
    for line in output.splitlines():
        if not line.startswith('{"_aws"'):
            continue
        record = json.loads(line)
        for metric in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]:
            if "operation" in record:
                found[metric["Name"], record["operation"]] += 1
    return found


def test_given_a_failing_command_then_it_is_retried_after_a_backoff_and_failed_when_attempts_are_spent(
    ctx: Context, machine_worker: Callable[..., Worker], capsys: pytest.CaptureFixture[str]
) -> None:
    worker = machine_worker()
    op = operations.request(ctx, worker.id, "register-license", LICENSE_SERVER, actor="op")
    t0 = utcnow()
    plan = faults.FaultPlan(faults=[faults.ssm_command_result("Failed", stderr="license server refused")])

    with plan.installed():
        cycle(ctx, t0)  # attempt 1 sent
        first = cycle(ctx, t0 + timedelta(seconds=5))  # ...and failed: back to PENDING after 30 s
        waiting = read(ctx, op)
        early = cycle(ctx, t0 + timedelta(seconds=20))  # the backoff holds
        cycle(ctx, t0 + timedelta(seconds=40))  # attempt 2 sent
        last = cycle(ctx, t0 + timedelta(seconds=45))  # ...and failed: the limit (2) is reached
        cycle(ctx, t0 + timedelta(hours=1))  # nothing more is sent

    assert (waiting.status, waiting.attempts, first["operations_pending"]) == (OperationStatus.PENDING, 1, 1)
    assert waiting.next_attempt_at == t0 + timedelta(seconds=35)
    assert not early
    final = read(ctx, op)
    assert (final.status, final.attempts, last["operations_failed"]) == (OperationStatus.FAILED, 2, 1)
    assert "Failed" in str(final.error)
    assert "license server refused" in str(final.output)
    assert len(sent_commands(worker)) == 2
    actions = [e.action for e in ctx.store.audit_trail("worker", worker.id) if "Operation" in e.action]
    assert actions == ["OperationRequested", "OperationAttemptFailed", "OperationFailed"]
    assert ctx.store.operation_lock(worker.id) is None
    assert emitted(capsys.readouterr().out) == {
        ("OperationRetried", "register-license"): 1,
        ("OperationFailed", "register-license"): 1,
    }


def test_given_a_command_that_never_finishes_then_it_is_cancelled_and_failed_at_its_timeout(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    op = operations.request(ctx, worker.id, "collect-system-info", {}, actor="op")
    t0 = utcnow()
    cancel = faults.ssm_cancel_accepted()
    plan = faults.FaultPlan(faults=[faults.ssm_command_result("InProgress"), cancel])

    with plan.installed():
        cycle(ctx, t0)
        cycle(ctx, t0 + timedelta(seconds=59))
        still = read(ctx, op)
        cycle(ctx, t0 + timedelta(seconds=60))

    assert still.status == OperationStatus.RUNNING
    final = read(ctx, op)
    assert (final.status, final.error) == (OperationStatus.FAILED, "timed out after 60 s")
    assert cancel.injected == 1


def test_given_a_sender_that_died_before_recording_its_command_then_the_command_is_adopted_not_sent_twice(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    op = operations.request(ctx, worker.id, "register-license", LICENSE_SERVER, actor="op")
    t0 = utcnow()

    def records_the_command(operation: str, params: dict[str, Any]) -> bool:
        return "command_id" in json.dumps(params)

    crash = faults.Fault(
        "dynamodb", "Crashed", frozenset({"TransactWriteItems"}), crash=True, when=records_the_command
    )
    with faults.FaultPlan(faults=[crash]).installed(), pytest.raises(faults.InvocationCrashed):
        cycle(default_context(), t0)  # the context (and its table client) as the plan rebuilt it
    orphaned = read(ctx, op)
    cycle(ctx, t0 + timedelta(seconds=30))  # the sender may still be at it: left alone
    cycle(ctx, t0 + timedelta(seconds=61))  # past the grace: the command is found and adopted
    adopted = read(ctx, op)
    cycle(ctx, t0 + timedelta(seconds=65))

    assert (orphaned.status, orphaned.command_id) == (OperationStatus.RUNNING, None)
    [command] = sent_commands(worker)
    assert (adopted.command_id, adopted.attempts) == (command["CommandId"], 1)
    assert read(ctx, op).status == OperationStatus.SUCCESS


def test_given_a_send_whose_answer_is_lost_then_it_is_looked_up_not_sent_again(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    op = operations.request(ctx, worker.id, "register-license", LICENSE_SERVER, actor="op")
    t0 = utcnow()
    # SSM ran the command, but the answer the caller got was a 500.
    lost = faults.Fault("ssm", "InternalServerError", frozenset({"SendCommand"}), status=500, after=True)

    with faults.FaultPlan(faults=[lost]).installed():
        cycle(ctx, t0)
        cycle(ctx, t0 + timedelta(seconds=61))  # the command is found by its comment and adopted
        cycle(ctx, t0 + timedelta(seconds=65))

    assert lost.injected == 1
    [command] = sent_commands(worker)
    final = read(ctx, op)
    assert (final.status, final.attempts, final.command_id) == (
        OperationStatus.SUCCESS,
        1,
        command["CommandId"],
    )


def test_given_ssm_throttling_through_every_retry_then_the_attempt_fails_and_waits_its_backoff(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    op = operations.request(ctx, worker.id, "register-license", LICENSE_SERVER, actor="op")
    plan = faults.FaultPlan(faults=[faults.ssm_throttling(1.0, operations=frozenset({"SendCommand"}))])

    with plan.installed():
        cycle(ctx, utcnow())

    after = read(ctx, op)
    assert (after.status, after.attempts) == (OperationStatus.PENDING, 1)
    assert "ThrottlingException" in str(after.error)
    assert sent_commands(worker) == []


def test_given_a_running_worker_due_for_system_information_then_its_json_lands_on_the_worker(
    ctx: Context, machine_worker: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    interval = 3600
    monkeypatch.setenv("SYSTEM_INFO_INTERVAL_SECONDS", str(interval))
    refresh_process_caches()
    ctx = default_context()
    worker = machine_worker()
    now = next(
        t
        for t in (utcnow() + timedelta(minutes=m) for m in range(61))
        if system_info_due(worker.id, None, t, interval, 60)
    )
    info = {"labs": 3, "nodes": ["n1", "n2"], "version": "2.7.1"}
    plan = faults.FaultPlan(faults=[faults.ssm_command_result("Success", stdout=json.dumps(info))])

    with plan.installed():
        asked = cycle(ctx, now, [worker])
        cycle(ctx, now + timedelta(seconds=5), [ctx.store.get_worker(worker.id)])
        again = cycle(ctx, now + timedelta(seconds=10), [ctx.store.get_worker(worker.id)])

    assert asked["system_info_requested"] == 1
    stored = ctx.store.get_worker(worker.id)
    assert stored.system_info == info
    assert stored.system_info_at == now + timedelta(seconds=5)
    assert again["system_info_requested"] == 0  # collected: not asked again within the interval
    assert len(sent_commands(worker)) == 1


def test_given_a_bad_operation_record_then_only_it_fails_and_the_others_run(
    ctx: Context, machine_worker: Callable[..., Worker], table_name: str
) -> None:
    worker = machine_worker()
    good = operations.request(ctx, worker.id, "register-license", LICENSE_SERVER, actor="op")
    # An item the index lists as PENDING but that is no valid operation.
    boto3.client("dynamodb").put_item(
        TableName=table_name,
        Item=serialize(
            {
                "PK": "WORKER#w-broken",
                "SK": "OPERATION#op-0-broken",
                "GSI1PK": "OPERATION#PENDING",
                "GSI1SK": "w-broken#op-0-broken",
                "status": "SLEEPING",
            }
        ),
    )

    counters = cycle(ctx, utcnow())

    assert counters["operation_errors"] == 1
    assert read(ctx, good).status == OperationStatus.RUNNING


# Last in the module: its EC2 fixture resets the emulator, and SSM's backend is slow to build again.
def test_given_a_reconcile_cycle_then_it_sends_pending_operations_after_the_workers_steps(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    op = operations.request(ctx, worker.id, "register-license", LICENSE_SERVER, actor="op")

    report = reconcile_fleet(ctx)

    sent = read(ctx, op)
    assert (sent.status, report.counters["operations_running"]) == (OperationStatus.RUNNING, 1)
    assert [c["CommandId"] for c in sent_commands(worker)] == [sent.command_id]
    assert report.completed
    assert ctx.store.get_worker(worker.id).status is WorkerStatus.RUNNING
