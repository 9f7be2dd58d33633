"""A cancel racing the drain's Finish step, on DynamoDB Local: before the finishing mark the cancel wins
and nothing irreversible is sent; from the mark on it is a 409 and the drain finishes; a crash right after
the mark leaves a drain that the step's retry, or a restarted execution, still finishes.

The races are made deterministic with botocore hooks on the real clients: the cancel is sent just before
the mark's write, or just before the before-stop operation's SendCommand.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.errors import DrainCancelled
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, Worker
from fleetkeeper.domain.operations import OperationStatus
from fleetkeeper.services import drains
from fleetkeeper.services.context import Context, default_context
from fleetkeeper_local import faults
from tests.integration.operations.conftest import api, start_drain

pytestmark = pytest.mark.integration

FINISHING_MARK = "WorkerDrainFinishing"
T = TypeVar("T")


@contextmanager
def just_before(
    service: str, operation: str, action: Callable[[], T], *, when: str = "", region: str | None = "us-east-1"
) -> Iterator[list[T]]:
    """Run `action` once, just before the first `operation` call (whose body holds `when`) is sent.

    `region` names the client: a worker region's (SSM, EC2), or None for the home region's (Step
    Functions)."""
    results: list[T] = []
    fired = threading.Event()

    def hook(params: dict[str, Any], **_: Any) -> None:
        body = params.get("body")
        text = body.decode() if isinstance(body, bytes) else json.dumps(body, default=str)
        if fired.is_set() or when not in text:
            return
        fired.set()
        results.append(action())

    # The clients the service uses: the table's (the default region), a worker region's SSM.
    events = (client("dynamodb") if service == "dynamodb" else client(service, region)).meta.events
    events.register(f"before-call.{service}.{operation}", hook)
    try:
        yield results
    finally:
        events.unregister(f"before-call.{service}.{operation}", hook)
    assert fired.is_set(), f"no {operation} call was made"


def cancel_through_api(worker_id: str) -> tuple[int, Any]:
    return api("POST", f"/api/v1/workers/{worker_id}/cancel-drain", {"reason": "keep it"})


def test_given_a_cancel_that_commits_before_the_finishing_mark_then_no_before_stop_operation_is_sent(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)

    with (
        just_before(
            "dynamodb",
            "TransactWriteItems",
            lambda: cancel_through_api(drained_worker.id),
            when=FINISHING_MARK,
        ) as cancels,
        pytest.raises(DrainCancelled),
    ):
        drains.finish(ctx, drain)

    assert [status for status, _ in cancels] == [200]
    after = ctx.store.get_worker(drained_worker.id)
    assert after.status is WorkerStatus.RUNNING
    assert after.drain is not None
    assert after.drain.outcome is DrainOutcome.CANCELLED
    assert after.drain.finishing_at is None
    assert ctx.store.list_operations(drained_worker.id).items == []


def assert_stopping_after_its_operation(ctx: Context, worker_id: str) -> Worker:
    """The drain finished: SUCCESS, the worker STOPPING, its one before_stop operation succeeded."""
    after = ctx.store.get_worker(worker_id)
    assert after.status is WorkerStatus.STOPPING
    assert after.drain is not None
    assert after.drain.outcome is DrainOutcome.SUCCESS
    [op] = ctx.store.list_operations(worker_id).items
    assert (op.name, op.status) == ("deregister-license", OperationStatus.SUCCESS)
    return after


def test_given_a_cancel_between_the_finishing_mark_and_the_send_then_it_is_a_409_and_the_drain_finishes(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)

    with just_before("ssm", "SendCommand", lambda: cancel_through_api(drained_worker.id)) as cancels:
        drains.finish(ctx, drain)

    [(status, body)] = cancels
    assert status == 409
    assert body["error"] == "DRAIN_FINISHING"
    assert "cannot undo" in body["message"]
    assert body["details"]["generation"] == drain.generation
    after = assert_stopping_after_its_operation(ctx, drained_worker.id)
    assert after.drain is not None
    assert after.drain.cancelled_by is None


def test_given_a_cancel_after_the_drain_finished_then_it_is_a_409_and_the_worker_keeps_stopping(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)
    drains.finish(ctx, drain)

    status, body = cancel_through_api(drained_worker.id)

    assert status == 409
    assert body["error"] == "CONFLICT"
    assert body["details"]["current_status"] == "STOPPING"
    assert ctx.store.get_worker(drained_worker.id).status is WorkerStatus.STOPPING


def test_given_a_drain_status_while_finishing_then_it_says_since_when(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)

    with just_before(
        "ssm", "SendCommand", lambda: api("GET", f"/api/v1/workers/{drained_worker.id}/drain")
    ) as reads:
        drains.finish(ctx, drain)

    [(status, body)] = reads
    assert status == 200
    assert body["status"] == "RUNNING"
    assert body["finishing_at"] is not None


def crash_after_the_mark() -> faults.FaultPlan:
    """The invocation dies right after the finishing mark landed, before any operation is requested."""
    return faults.FaultPlan(
        faults=[
            faults.Fault(
                "dynamodb",
                "Crashed",
                frozenset({"TransactWriteItems"}),
                after=True,
                crash=True,
                limit=1,
                when=lambda _, params: FINISHING_MARK in json.dumps(params),
            )
        ]
    )


def test_given_finish_crashes_after_the_mark_then_cancel_is_refused_and_the_retry_finishes_the_drain(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)
    # The plan's hooks are on the clients of the context built inside it.
    with crash_after_the_mark().installed(), pytest.raises(faults.InvocationCrashed):
        drains.finish(default_context(), drain)
    crashed = ctx.store.get_worker(drained_worker.id)
    assert crashed.status is WorkerStatus.DRAINING
    assert crashed.drain is not None
    assert crashed.drain.finishing_at is not None
    assert ctx.store.list_operations(drained_worker.id).items == []

    status, body = cancel_through_api(drained_worker.id)
    assert (status, body["error"]) == (409, "DRAIN_FINISHING")

    drains.finish(ctx, drain)  # Step Functions retries the task

    assert_stopping_after_its_operation(ctx, drained_worker.id)


def test_given_finish_crashes_after_the_mark_and_its_execution_is_lost_then_a_restarted_one_finishes_it(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)
    with crash_after_the_mark().installed(), pytest.raises(faults.InvocationCrashed):
        drains.finish(default_context(), drain)
    # The watchdog's restart: the same generation, served by a new execution (restarts + 1).
    crashed = ctx.store.get_worker(drained_worker.id)
    assert crashed.drain is not None
    restarted = ctx.store.update_worker(
        crashed,
        {"drain": crashed.drain.model_copy(update={"restarts": 1, "task_token": None})},
        actor="drain-watchdog",
        action="WorkerDrainRestarted",
    )
    assert restarted.drain is not None
    replacement = drain.model_copy(update={"restart": 1})

    plan = drains.begin(ctx, replacement)
    assert plan["empty"] is True
    drains.finish(ctx, replacement)

    assert_stopping_after_its_operation(ctx, drained_worker.id)


def test_given_a_finishing_drain_then_a_deadline_move_and_a_force_are_409_and_change_nothing(
    ctx: Context, drained_worker: Worker
) -> None:
    drain = start_drain(ctx, drained_worker)
    with crash_after_the_mark().installed(), pytest.raises(faults.InvocationCrashed):
        drains.finish(default_context(), drain)
    path = f"/api/v1/workers/{drained_worker.id}/drain"

    moved = api("PATCH", path, {"timeout_seconds": 7200})
    forced = api("POST", f"{path}/force", {"reason": "now"})

    for status, body in (moved, forced):
        assert (status, body["error"]) == (409, "DRAIN_FINISHING"), body
        assert body["details"]["generation"] == drain.generation
    assert "a deadline move cannot undo" in moved[1]["message"]
    assert "a force cannot undo" in forced[1]["message"]
    record = ctx.store.get_worker(drained_worker.id).drain
    assert record is not None
    assert (record.deadline, record.deadline_moves, record.forced_at) == (drain.deadline, 0, None)
