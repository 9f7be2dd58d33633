"""A drain whose deadline passes is either cancelled or forced, never both: the real state machine's Force
step marks the drain finishing in one conditional write before it ends anything (drains.steps.take_over),
and a cancel is a conditional write on the same worker item. A botocore hook puts the cancel right
before the mark's write, or right after it landed."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import ACTIVE_INSTANCE_STATES, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome
from fleetkeeper_local import faults
from tests.integration.conftest import ControlPlane, WorkerFactory
from tests.integration.faults.support import audit_actions, drain, place

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ALICE = "arn:aws:iam::123456789012:user/alice"
# Seconds from the drain's start to its deadline.
DEADLINE_SECONDS = 3


def is_forces_mark(params: dict[str, Any], worker_id: str) -> bool:
    """The transaction that marks the worker's drain finishing because its deadline passed."""
    for entry in params.get("TransactItems", []):
        item = entry.get("Put", {}).get("Item", {})
        if (
            item.get("action", {}).get("S") == "WorkerDrainFinishing"
            and item.get("entity_id", {}).get("S") == worker_id
            and "deadline passed" in item.get("reason", {}).get("S", "")
        ):
            return True
    return False


def cancel(plane: ControlPlane, worker_id: str) -> tuple[int, Any]:
    return plane.api("POST", f"/api/v1/workers/{worker_id}/cancel-drain", caller=ALICE)


def busy_worker(plane: ControlPlane, worker: WorkerFactory) -> tuple[str, str]:
    """A worker with one instance that never ends by itself: the worker's id and the instance's."""
    worker_id = worker().id
    return worker_id, place(plane, worker_id=worker_id)["id"]


def drained_past_its_deadline(plane: ControlPlane, worker_id: str) -> str:
    """Drain the worker with a deadline seconds away and wait for its execution to end; its ARN. On a
    loaded machine the deadline may pass before the wait is armed: the re-check then goes straight to
    Force, which is what these tests are about either way."""
    started = drain(plane, worker_id, timeout_seconds=DEADLINE_SECONDS, reschedule=False)
    execution_arn = str(started["execution_arn"])
    assert plane.wait_for_execution(execution_arn, timeout=120)["status"] == "SUCCEEDED"
    return execution_arn


def test_given_a_cancel_that_commits_just_before_the_forces_mark_then_nothing_is_forced(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, instance_id = busy_worker(control_plane, ec2_worker)
    fired: list[str] = []
    answers: list[tuple[int, Any]] = []

    def cancel_first(params: dict[str, Any], **_: Any) -> None:
        if not fired and is_forces_mark(params, worker_id):
            fired.append(worker_id)
            answers.append(cancel(control_plane, worker_id))

    with faults.installed_hooks([("before-parameter-build.dynamodb.TransactWriteItems", cancel_first)]):
        execution_arn = drained_past_its_deadline(control_plane, worker_id)

    [(status, body)] = answers
    assert (status, body["status"]) == (200, "RUNNING"), body
    assert control_plane.states_entered(execution_arn)[-1] == "Cancelled"
    store = control_plane.ctx.store
    worker = store.get_worker(worker_id)
    assert worker.status is WorkerStatus.RUNNING
    assert worker.owner is None
    record = worker.drain
    assert record is not None
    assert (record.outcome, record.timed_out_at, record.forced_instances, record.finishing_at) == (
        DrainOutcome.CANCELLED,
        None,
        0,
        None,
    )
    assert store.get_instance(instance_id).state in ACTIVE_INSTANCE_STATES
    actions = audit_actions(control_plane, "worker", worker_id)
    assert "WorkerDrainCancelled" in actions
    assert "WorkerDrainFinishing" not in actions
    assert "WorkerDrainTimedOut" not in actions


def test_given_a_cancel_that_comes_after_the_forces_mark_then_it_is_409_and_the_drain_times_out(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, instance_id = busy_worker(control_plane, ec2_worker)
    fired: list[str] = []
    answers: list[tuple[int, Any]] = []

    def note_the_mark(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        if is_forces_mark(params, worker_id):
            context["forces_mark"] = True

    def cancel_after(http_response: Any, context: dict[str, Any], **_: Any) -> None:
        if not fired and context.get("forces_mark") and http_response.status_code == 200:
            fired.append(worker_id)
            answers.append(cancel(control_plane, worker_id))

    hooks: list[faults.HookSpec] = [
        ("before-parameter-build.dynamodb.TransactWriteItems", note_the_mark),
        ("after-call.dynamodb.TransactWriteItems", cancel_after),
    ]
    with faults.installed_hooks(hooks):
        execution_arn = drained_past_its_deadline(control_plane, worker_id)

    [(status, body)] = answers
    assert (status, body["error"]) == (409, "DRAIN_FINISHING"), body
    assert "Force" in control_plane.states_entered(execution_arn)
    store = control_plane.ctx.store
    worker = store.get_worker(worker_id)
    assert worker.status is WorkerStatus.STOPPING
    record = worker.drain
    assert record is not None
    assert (record.outcome, record.forced_instances, record.cancelled_by) == (DrainOutcome.TIMED_OUT, 1, None)
    assert record.timed_out_at is not None
    instance = store.get_instance(instance_id)
    assert (instance.state, instance.reason) == (InstanceState.TERMINATED, "drain_timeout")
    actions = audit_actions(control_plane, "worker", worker_id)
    assert "WorkerDrainCancelled" not in actions
    assert actions.count("WorkerDrainFinishing") == 1
