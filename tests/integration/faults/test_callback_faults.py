"""Step Functions answers that go wrong: a callback that never arrives, a token AWS says is gone or timed
out, throttling. The drain still ends, the instance end is never refused for it, and retries are bounded.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper_local import faults
from tests.integration.conftest import ControlPlane, WorkerFactory, eventually
from tests.integration.faults.support import (
    assert_drained_once,
    complete,
    drain,
    place,
    reconcile,
    token_stored,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# However an AWS call fails, a drain request makes at most this many attempts at it.
MAX_ATTEMPTS_PER_CALL = 10


def waiting_drain(
    plane: ControlPlane, ec2_worker: WorkerFactory
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A worker with one instance, its drain waiting on the callback token."""
    worker = ec2_worker()
    instance = place(plane, worker_id=worker.id)
    started = drain(plane, worker.id)
    eventually(lambda: token_stored(plane, worker.id))
    # Past the await step's own emptiness check: from here only a signal (or the sweep) ends the wait.
    eventually(lambda: plane.dispatcher.has_returned("await_empty", worker.id))
    return worker, instance, started


def still_waiting(plane: ControlPlane, execution_arn: str) -> bool:
    time.sleep(1.0)  # long enough for a delivered callback to end the execution
    return str(plane.execution(execution_arn)["status"]) == "RUNNING"


def test_given_a_lost_callback_then_the_next_reconcile_sweep_completes_the_drain(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    worker, instance, started = waiting_drain(control_plane, ec2_worker)
    plan = faults.FaultPlan(seed=11, faults=[faults.sfn_lost_callbacks(1.0, limit=1)])
    with plan.installed():
        ended = complete(control_plane, instance["id"])  # its SendTaskSuccess never reaches AWS
        assert still_waiting(control_plane, started["execution_arn"])

        report = reconcile()

    assert ended["state"] == "COMPLETED"
    assert plan.summary() == {"stepfunctions:LostCallback": 1}
    assert report["counters"]["drain_signals_recovered"] == 1
    assert_drained_once(control_plane, ec2, worker, started["execution_arn"])


@pytest.mark.parametrize(
    "answer_fault", [faults.sfn_task_does_not_exist, faults.sfn_task_timed_out], ids=["gone", "timed_out"]
)
def test_given_the_token_answer_is_refused_then_the_instance_end_stands_and_the_sweep_completes_the_drain(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any, answer_fault: Any
) -> None:
    worker, instance, started = waiting_drain(control_plane, ec2_worker)
    refused = answer_fault(1.0, limit=1, operations=frozenset({"SendTaskSuccess"}))
    plan = faults.FaultPlan(seed=12, faults=[refused])
    with plan.installed():
        status, body = control_plane.api(
            "POST", f"/api/v1/instances/{instance['id']}/state", {"state": "COMPLETED"}
        )
        assert (status, body["state"]) == (
            200,
            "COMPLETED",
        )  # the end was recorded; the answer is ours to redo
        report = reconcile()

    assert refused.injected == 1
    assert control_plane.ctx.store.get_instance(instance["id"]).state is InstanceState.COMPLETED
    assert report["counters"]["drain_signals_recovered"] == 1
    assert_drained_once(control_plane, ec2, worker, started["execution_arn"])


def test_given_a_throttled_callback_then_it_is_retried_at_once_and_the_drain_needs_no_sweep(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    worker, instance, started = waiting_drain(control_plane, ec2_worker)
    throttled = faults.sfn_throttling(1.0, limit=2, operations=frozenset({"SendTaskSuccess"}))
    plan = faults.FaultPlan(seed=13, faults=[throttled])
    with plan.installed():
        status, body = control_plane.api(
            "POST", f"/api/v1/instances/{instance['id']}/state", {"state": "COMPLETED"}
        )
        assert (status, body["state"]) == (200, "COMPLETED")
        # No reconcile: the signal itself got through after two throttled attempts.
        execution = control_plane.wait_for_execution(started["execution_arn"], timeout=20)

    assert execution["status"] == "SUCCEEDED"
    assert throttled.injected == 2
    assert_drained_once(control_plane, ec2, worker, started["execution_arn"])


def test_given_a_throttled_start_execution_then_the_drain_request_retries_and_is_accepted(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    worker = ec2_worker()
    throttled = faults.sfn_throttling(1.0, limit=1, operations=frozenset({"StartExecution"}))
    plan = faults.FaultPlan(seed=14, faults=[throttled])
    with plan.installed():
        status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {})
        assert status == 202, body

    assert throttled.injected == 1
    assert_drained_once(control_plane, ec2, worker, body["execution_arn"])


def test_given_step_functions_throttles_without_end_then_the_drain_request_is_a_bounded_retryable_503(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    worker = ec2_worker()
    throttled = faults.sfn_throttling(1.0, operations=frozenset({"StartExecution"}))
    plan = faults.FaultPlan(seed=15, faults=[throttled])
    with plan.installed():
        status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {})

    assert status == 503, body
    assert 1 <= throttled.injected <= MAX_ATTEMPTS_PER_CALL
    back = control_plane.ctx.store.get_worker(worker.id)
    assert back.status is WorkerStatus.RUNNING  # not left draining with no workflow behind it
    assert back.drain is not None
    assert back.drain.outcome.value == "ERROR"
    # Once Step Functions answers again, the same worker drains normally.
    started = drain(control_plane, worker.id)
    assert_drained_once(control_plane, ec2, worker, started["execution_arn"])
