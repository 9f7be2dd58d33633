"""Pool drains (seed 004): exclusion at once, inactive when empty or when the timeout expires."""

from __future__ import annotations

import pytest

from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.services import drains
from tests.integration.conftest import eventually

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def place_in_pool(plane, pool):
    status, body = plane.api("POST", "/api/v1/instances", {"pool": pool})
    assert status == 201, body
    return body


def test_given_active_instances_when_the_last_ends_then_the_pool_goes_inactive(control_plane, ec2_worker):
    ec2_worker(pool="labs")
    first = place_in_pool(control_plane, "labs")
    status, pool = control_plane.api("POST", "/api/v1/pools/labs/drain", {"timeout_seconds": 120})
    assert status == 202
    assert (pool["status"], pool["drain_timeout_seconds"], pool["drain_outcome"]) == (
        "draining",
        120,
        "RUNNING",
    )

    status, refused = control_plane.api("POST", "/api/v1/instances", {"pool": "labs"})
    assert (status, refused["error"]) == (409, "NO_CAPACITY")
    assert "draining" in refused["message"]
    status, again = control_plane.api("POST", "/api/v1/pools/labs/drain", {})
    assert (status, again["message"]) == (409, "Drain already in progress")

    store = control_plane.ctx.store
    eventually(lambda: store.get_pool("labs").drain_task_token)
    control_plane.api("POST", f"/api/v1/instances/{first['id']}/state", {"state": "COMPLETED"})
    execution = control_plane.wait_for_execution(pool["drain_execution_arn"])
    assert execution["status"] == "SUCCEEDED"
    _, after = control_plane.api("GET", "/api/v1/pools/labs")
    assert (after["status"], after["drain_outcome"], after["active_instances"]) == ("inactive", "SUCCESS", 0)


def test_given_a_stuck_instance_when_the_timeout_expires_then_the_pool_goes_inactive(
    control_plane, ec2_worker
):
    ec2_worker(pool="batch")
    place_in_pool(control_plane, "batch")
    # The API refuses timeouts under a minute; the workflow's deadline is driven through the service.
    pool = drains.start_pool_drain(control_plane.ctx, "batch", actor="test", timeout_seconds=2).model_dump(
        mode="json"
    )
    execution = control_plane.wait_for_execution(pool["drain_execution_arn"], timeout=20)
    assert execution["status"] == "SUCCEEDED"
    after = control_plane.ctx.store.get_pool("batch")
    assert (after.status, after.drain_outcome.value) == (PoolStatus.INACTIVE, "TIMED_OUT")
    assert "PoolTimedOut" in control_plane.states_entered(pool["drain_execution_arn"])


def test_given_no_timeout_then_the_pool_drain_defaults_to_300_seconds(control_plane, ec2_worker):
    ec2_worker(pool="gpu")
    place_in_pool(control_plane, "gpu")
    status, pool = control_plane.api("POST", "/api/v1/pools/gpu/drain", {})
    assert (status, pool["drain_timeout_seconds"]) == (202, 300)


def test_given_a_draining_pool_when_cancelled_then_it_is_active_and_takes_work(control_plane, ec2_worker):
    ec2_worker(pool="labs")
    place_in_pool(control_plane, "labs")
    _, pool = control_plane.api("POST", "/api/v1/pools/labs/drain", {})
    eventually(lambda: control_plane.ctx.store.get_pool("labs").drain_task_token)
    status, after = control_plane.api("POST", "/api/v1/pools/labs/cancel-drain")
    assert (status, after["status"], after["drain_outcome"]) == (200, "active", "CANCELLED")
    assert control_plane.wait_for_execution(pool["drain_execution_arn"])["status"] == "SUCCEEDED"
    place_in_pool(control_plane, "labs")
    status, _ = control_plane.api("POST", "/api/v1/pools/labs/cancel-drain")
    assert status == 409


def test_given_then_stop_when_the_pool_is_empty_then_its_workers_are_drained(control_plane, ec2_worker):
    first = ec2_worker(pool="edge")
    second = ec2_worker(pool="edge")
    _, pool = control_plane.api("POST", "/api/v1/pools/edge/drain", {"then": "stop"})
    assert control_plane.wait_for_execution(pool["drain_execution_arn"])["status"] == "SUCCEEDED"
    store = control_plane.ctx.store

    def both_stopping() -> bool:
        return all(store.get_worker(w.id).status is WorkerStatus.STOPPING for w in (first, second))

    eventually(both_stopping)
