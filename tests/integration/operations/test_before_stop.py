"""A template's before_stop operations run on the drained worker before StopInstances; their failure or
timeout is audited and never keeps the worker from stopping."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate
from fleetkeeper.domain.operations import OperationOrigin, OperationStatus
from fleetkeeper.services import catalog, drains
from fleetkeeper.services.context import Context
from fleetkeeper_local import faults
from tests.integration.operations.conftest import start_drain

pytestmark = pytest.mark.integration


@pytest.fixture
def settings_overrides() -> dict[str, str]:
    return {"BEFORE_STOP_TIMEOUT_SECONDS": "1"}


@pytest.fixture
def drained_worker(ctx: Context, running_worker: Callable[..., Worker]) -> Worker:
    """A RUNNING worker whose template runs deregister-license before its workers stop."""
    catalog.put_template(
        ctx.store,
        WorkerTemplate(
            name="lab",
            instance_type="m5.large",
            ami_name_filter="lab-*",
            capacity=2,
            before_stop=["deregister-license"],
        ),
        actor="test",
    )
    return running_worker(template="lab")


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
    [op] = ctx.store.operations_of(drained_worker.id)
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

    [op] = ctx.store.operations_of(drained_worker.id)
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

    [op] = ctx.store.operations_of(drained_worker.id)
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
