"""Worker drains on the local stack, executing the real ASL file on moto's Step Functions."""

from __future__ import annotations

import pytest

from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from tests.integration.conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def place(plane, worker_id, **body):
    status, instance = plane.api("POST", "/api/v1/instances", {"worker_id": worker_id, **body})
    assert status == 201, instance
    return instance


def test_given_running_instances_when_the_last_one_completes_then_the_worker_stops(
    control_plane, ec2_worker, ec2
):
    worker = ec2_worker()
    first, second = place(control_plane, worker.id), place(control_plane, worker.id)

    status, drain = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {"reason": "maintenance"})
    assert status == 202, drain
    assert drain["status"] == "RUNNING"
    assert drain["worker_status"] == "DRAINING"
    assert drain["active_instances"] == 2
    store = control_plane.ctx.store
    eventually(
        lambda: (store.get_worker(worker.id).drain or {}) and store.get_worker(worker.id).drain.task_token
    )

    control_plane.api("POST", f"/api/v1/instances/{first['id']}/state", {"state": "COMPLETED"})
    assert store.get_worker(worker.id).status is WorkerStatus.DRAINING
    control_plane.api("POST", f"/api/v1/instances/{second['id']}/state", {"state": "COMPLETED"})

    execution = control_plane.wait_for_execution(drain["execution_arn"])
    assert execution["status"] == "SUCCEEDED"
    final = store.get_worker(worker.id)
    assert final.status is WorkerStatus.STOPPING
    _, status_body = control_plane.api("GET", f"/api/v1/workers/{worker.id}/drain")
    assert status_body["status"] == "SUCCESS"
    assert status_body["finished_at"] is not None
    state = ec2.describe_instances(InstanceIds=[worker.ec2_instance_id])["Reservations"][0]["Instances"][0][
        "State"
    ]
    assert state["Name"] in ("stopping", "stopped")
    assert control_plane.states_entered(drain["execution_arn"]) == [
        "Route",
        "Begin",
        "CheckProgress",
        "AwaitEmpty",
        "Finish",
        "Drained",
    ]


def test_given_an_empty_worker_when_drained_then_it_stops_at_once(control_plane, ec2_worker):
    worker = ec2_worker()
    status, drain = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {"then": "terminate"})
    assert status == 202
    assert control_plane.wait_for_execution(drain["execution_arn"], timeout=15)["status"] == "SUCCEEDED"
    assert control_plane.ctx.store.get_worker(worker.id).status is WorkerStatus.TERMINATING


def test_given_a_stuck_instance_when_the_deadline_passes_then_it_is_forced(control_plane, ec2_worker):
    worker = ec2_worker()
    stuck = place(control_plane, worker.id)
    status, drain = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {"timeout_seconds": 2})
    assert status == 202
    assert drain["timeout_seconds"] == 2
    execution = control_plane.wait_for_execution(drain["execution_arn"], timeout=20)
    assert execution["status"] == "SUCCEEDED"
    store = control_plane.ctx.store
    instance = store.get_instance(stuck["id"])
    assert instance.state is InstanceState.TERMINATED
    assert instance.reason == "drain_timeout"
    _, body = control_plane.api("GET", f"/api/v1/workers/{worker.id}/drain")
    assert body["status"] == "TIMED_OUT"
    assert body["forced_instances"] == 1
    assert store.get_worker(worker.id).status is WorkerStatus.STOPPING
    assert "Force" in control_plane.states_entered(drain["execution_arn"])
