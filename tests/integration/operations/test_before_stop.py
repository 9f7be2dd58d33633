"""A template's before_stop operations run on the drained worker before StopInstances; their failure or
timeout is audited and never keeps the worker from stopping."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.errors import DrainNotStartable, Unavailable
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.operations import Operation, OperationOrigin, OperationStatus, new_operation_id
from fleetkeeper.services import drains, operations
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from fleetkeeper_local.bounds import batch_write
from tests.integration.functions import reconcile_fleet
from tests.integration.operations.conftest import start_drain

pytestmark = pytest.mark.integration


@pytest.fixture
def settings_overrides() -> dict[str, str]:
    return {"BEFORE_STOP_TIMEOUT_SECONDS": "1"}


@contextmanager
def calls_to_aws(region: str) -> Iterator[list[str]]:
    """The SSM and EC2 operations called through the service's clients, in order."""
    seen: list[str] = []

    def record(event_name: str, **_: Any) -> None:
        seen.append(event_name.rsplit(".", 1)[-1])

    clients = [client("ssm", region), client("ec2", region)]
    for each in clients:
        each.meta.events.register("before-call.*.*", record)
    try:
        yield seen
    finally:
        for each in clients:
            each.meta.events.unregister("before-call.*.*", record)


def actions(ctx: Context, worker: Worker) -> list[str]:
    return [e.action for e in ctx.store.audit_trail("worker", worker.id)]


def test_given_a_before_stop_operation_when_the_drain_finishes_then_it_runs_before_stop_instances(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)

    with calls_to_aws(drained_worker.region) as calls:
        drains.finish(ctx, drain)

    assert calls[0] == "SendCommand"
    assert calls[-1] == "StopInstances"
    assert calls.count("StopInstances") == 1
    [op] = ctx.store.list_operations(drained_worker.id).items
    assert (op.name, op.origin, op.status) == (
        "deregister-license",
        OperationOrigin.BEFORE_STOP,
        OperationStatus.SUCCESS,
    )
    trail = actions(ctx, drained_worker)
    assert trail.index("OperationSucceeded") < trail.index("WorkerDrainCompleted")
    assert ctx.store.get_worker(drained_worker.id).status is WorkerStatus.STOPPING


def test_given_a_failing_before_stop_operation_then_it_is_audited_and_the_worker_still_stops(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)
    plan = faults.FaultPlan(faults=[faults.ssm_command_result("Failed", stderr="license server down")])

    with plan.installed(), calls_to_aws(drained_worker.region) as calls:
        drains.finish(ctx, drain)

    [op] = ctx.store.list_operations(drained_worker.id).items
    assert op.status is OperationStatus.FAILED
    trail = actions(ctx, drained_worker)
    assert trail.index("BeforeStopOperationFailed") < trail.index("WorkerDrainCompleted")
    assert calls[-1] == "StopInstances"
    assert ctx.store.get_worker(drained_worker.id).status is WorkerStatus.STOPPING


def test_given_a_before_stop_operation_that_outlasts_its_timeout_then_it_is_cancelled_and_the_stop_goes_on(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)
    cancel = faults.ssm_cancel_accepted()
    plan = faults.FaultPlan(faults=[faults.ssm_command_result("InProgress"), cancel])

    with plan.installed(), calls_to_aws(drained_worker.region) as calls:
        drains.finish(ctx, drain)

    [op] = ctx.store.list_operations(drained_worker.id).items
    assert op.status is OperationStatus.CANCELLED
    assert cancel.injected == 1
    failed = [
        e
        for e in ctx.store.audit_trail("worker", drained_worker.id)
        if e.action == "BeforeStopOperationFailed"
    ]
    assert [e.reason for e in failed] == ["timed out before the stop"]
    assert calls[-1] == "StopInstances"
    assert ctx.store.get_worker(drained_worker.id).status is WorkerStatus.STOPPING
    assert ctx.store.operation_lock(drained_worker.id) is None


def reads_the_template(_operation: str, params: dict[str, Any]) -> bool:
    return bool(params.get("Key", {}).get("SK", {}).get("S") == "TEMPLATE")


def test_given_the_template_read_throttled_past_its_retries_then_finish_fails_unstopped_and_its_retry_runs_it(
    ctx: Context, drained_worker: Worker
) -> None:
    # A passing fault must not stop the worker without its operations: the step fails as Unavailable
    # (the workflow retries it), nothing is stopped, and the retry resumes and runs the operation before
    # the stop. Swallowing it instead stopped workers with no operation and no audit under throttling.
    drain = start_drain(ctx, drained_worker)
    throttle = faults.dynamodb_throttling(1.0, operations=frozenset({"GetItem"}), when=reads_the_template)
    throttled = faults.FaultPlan(faults=[throttle])

    # The plan's hooks are on the clients of the context built inside it.
    with throttled.installed(), calls_to_aws(drained_worker.region) as calls, pytest.raises(Unavailable):
        drains.finish(default_context(), drain)
    assert throttle.injected > 1  # past the client's own retries
    assert "StopInstances" not in calls
    assert ctx.store.get_worker(drained_worker.id).status is WorkerStatus.DRAINING

    with calls_to_aws(drained_worker.region) as retried:
        drains.finish(ctx, drain)

    assert retried[-1] == "StopInstances"
    succeeded = [op for op in ctx.store.list_operations(drained_worker.id).items if op.finished]
    assert [(op.name, op.status) for op in succeeded] == [("deregister-license", OperationStatus.SUCCESS)]
    trail = actions(ctx, drained_worker)
    assert "BeforeStopOperationFailed" not in trail
    assert trail.index("OperationSucceeded") < trail.index("WorkerDrainCompleted")


def test_given_a_drained_worker_without_a_machine_then_each_before_stop_operation_is_audited_as_not_run(
    ctx: Context, store: FleetStore, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)
    current = store.get_worker(drained_worker.id)
    store.update_worker(current, {"ec2_instance_id": None}, actor="test", action="MachineForgotten")

    with calls_to_aws(drained_worker.region) as calls:
        drains.finish(ctx, drain)

    assert calls == []  # nothing to run it on, nothing to stop
    trail = ctx.store.audit_trail("worker", drained_worker.id)
    failed = [e for e in trail if e.action == "BeforeStopOperationFailed"]
    assert [(e.details or {}).get("operation") for e in failed] == ["deregister-license"]
    assert [e.reason for e in failed] == ["not run: the worker has no machine"]
    assert ctx.store.get_worker(drained_worker.id).status is WorkerStatus.STOPPING


def test_given_the_machine_stopped_from_outside_while_before_stop_runs_then_its_failure_claims_no_status(
    ctx: Context, store: FleetStore, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)

    def stopped_from_outside(_operation: str, _params: dict[str, Any]) -> bool:
        current = store.get_worker(drained_worker.id)
        if current.status is WorkerStatus.DRAINING:
            store.transition_worker(current, WorkerStatus.STOPPED, cause=Cause.EC2, actor="ec2-events")
        return True

    failed = faults.ssm_command_result("Failed", stderr="machine went away", when=stopped_from_outside)
    with faults.FaultPlan(faults=[failed]).installed(), pytest.raises(DrainNotStartable):
        drains.finish(ctx, drain)

    trail = ctx.store.audit_trail("worker", drained_worker.id)
    assert "BeforeStopOperationFailed" in [e.action for e in trail]
    # The trail replays: the failure, audited after the worker stopped, does not claim it DRAINING.
    status: str | None = None
    for event in trail:
        assert event.from_status in (None, status), (
            f"{event.action} from {event.from_status}, trail at {status}"
        )
        status = event.to_status or status
    assert status == WorkerStatus.STOPPED


@contextmanager
def items_read_by_queries() -> Iterator[list[int]]:
    """How many items each DynamoDB Query of the service's client read (ScannedCount), in order."""
    scanned: list[int] = []

    def record(parsed: dict[str, Any], **_: Any) -> None:
        scanned.append(int(parsed.get("ScannedCount", 0)))

    dynamodb = client("dynamodb")
    dynamodb.meta.events.register("after-call.dynamodb.Query", record)
    try:
        yield scanned
    finally:
        dynamodb.meta.events.unregister("after-call.dynamodb.Query", record)


# A year of them, every third hour, is a scale figure (`make stress`); `make test` keeps three times what
# before-stop may read.
@pytest.mark.parametrize(
    "history_size", [pytest.param(2920, marks=pytest.mark.scale), 3 * operations.BEFORE_STOP_READ_LIMIT]
)
def test_given_months_of_operations_then_before_stop_reads_one_bounded_page_and_resumes_this_drain_s_own(
    ctx: Context, drained_worker: Worker, history_size: int
) -> None:
    now = utcnow()
    history = [
        Operation(
            id=new_operation_id(now - timedelta(hours=3 * n + 1)),
            worker_id=drained_worker.id,
            name="collect-system-info",
            document="fk-test-CollectSystemInfo",
            origin=OperationOrigin.SCHEDULE,
            requested_by="operations",
            status=OperationStatus.SUCCESS,
            version=3,
        )
        for n in range(history_size)  # one every third hour
    ]
    table = ctx.settings.table_name
    batch_write(client("dynamodb"), table, [ctx.store._operation_item(op) for op in history])
    drain = start_drain(ctx, drained_worker)
    # An earlier attempt of this drain's finish step already ran the operation.
    done = Operation(
        id=new_operation_id(utcnow()),
        worker_id=drained_worker.id,
        name="deregister-license",
        document="fk-test-DeregisterLicense",
        origin=OperationOrigin.BEFORE_STOP,
        drain_generation=drain.generation,
        requested_by="drain",
        status=OperationStatus.SUCCESS,
        version=3,
    )
    batch_write(client("dynamodb"), table, [ctx.store._operation_item(done)])
    # That attempt had marked the drain finishing (services/drains/steps.py), as before-stop requires.
    draining = ctx.store.get_worker(drained_worker.id)
    assert draining.drain is not None
    finishing = draining.drain.model_copy(update={"finishing_at": utcnow()})
    ctx.store.update_worker(draining, {"drain": finishing}, actor="drain", action="WorkerDrainFinishing")

    with items_read_by_queries() as scanned:
        results = operations.run_before_stop(ctx, drained_worker.id, drain.generation, actor="drain")

    assert results == {"deregister-license": "SUCCESS"}
    assert sum(scanned) <= operations.BEFORE_STOP_READ_LIMIT  # not its whole history
    assert len(ctx.store.list_operations(drained_worker.id, limit=100).items) == 100  # nothing new requested
    assert ctx.store.list_operations(drained_worker.id, limit=1).items == [done]


def test_given_finish_throttled_past_the_workflow_s_retries_then_the_unrun_operation_is_audited(
    ctx: Context, drained_worker: Worker
) -> None:
    # The workflow retries Finish a few times, then its final catch records the drain as ERROR; the
    # reconciler then stops the empty worker. The operation never ran: that must be on the record.
    drain = start_drain(ctx, drained_worker)
    throttle = faults.dynamodb_throttling(1.0, operations=frozenset({"GetItem"}), when=reads_the_template)
    for _ in range(2):  # each attempt of the step meets the same throttling
        with faults.FaultPlan(faults=[throttle]).installed(), pytest.raises(Unavailable):
            drains.finish(default_context(), drain)
    drains.record_error(ctx, drain, {"Error": "Unavailable", "Cause": "throttled"})
    drains.record_error(ctx, drain, {"Error": "Unavailable", "Cause": "throttled"})  # a retried catch

    reconcile_fleet(ctx)

    assert ctx.store.get_worker(drained_worker.id).status in {WorkerStatus.STOPPING, WorkerStatus.STOPPED}
    assert not [op for op in ctx.store.list_operations(drained_worker.id).items if op.finished]
    failed = [
        e
        for e in ctx.store.audit_trail("worker", drained_worker.id)
        if e.action == "BeforeStopOperationFailed"
    ]
    assert [(e.details or {}).get("operation") for e in failed] == ["deregister-license"]
