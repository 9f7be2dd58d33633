"""AWS's error answers in the real clients: DynamoDB conflicts and throttling, EC2 throttling, 5xx and no
capacity. Each is classified once and retried with backoff; the fleet converges, counts stay exact,
nothing is lost, and no request answers 500 for AWS's sake.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.tags import WORKER_ID_TAG
from fleetkeeper.services import workers
from fleetkeeper.services.context import default_context
from fleetkeeper_local import faults
from tests.integration.conftest import ControlPlane, WorkerFactory
from tests.integration.faults.support import (
    assert_drained_once,
    drain,
    ec2_state,
    runs,
)
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import ensure_template

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems"})


def active_instance_ids(plane: ControlPlane, worker_id: str) -> set[str]:
    return {i.id for i in plane.ctx.store.active_instances_of(worker_id)}


def report_state(plane: ControlPlane, instance_id: str, state: str) -> tuple[int, Any]:
    return plane.api("POST", f"/api/v1/instances/{instance_id}/state", {"state": state})


# ---- DynamoDB -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        lambda: faults.dynamodb_conflicts(0.5, limit=6),
        lambda: faults.dynamodb_throttling(0.3, limit=6, operations=WRITES),
        lambda: faults.dynamodb_throughput(0.3, limit=6, operations=WRITES),
    ],
    ids=["TransactionConflict", "ThrottlingException", "ProvisionedThroughputExceeded"],
)
def test_given_dynamodb_refusing_writes_then_every_placement_and_end_is_retried_and_the_counts_stay_exact(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, fault: Any
) -> None:
    worker = ec2_worker(template="packed", capacity=8)
    injected = fault()
    plan = faults.FaultPlan(seed=51, faults=[injected])
    answers: list[int] = []
    placed: list[str] = []
    with plan.installed():
        for _ in range(6):
            status, body = control_plane.api("POST", "/api/v1/instances", {"template": "packed"})
            answers.append(status)
            if status == 201:
                placed.append(body["id"])
        for instance_id in placed[:3]:
            status, _ = report_state(control_plane, instance_id, "COMPLETED")
            answers.append(status)

    assert injected.injected >= 1
    assert [a for a in answers if a >= 500] == [], answers  # classified and retried, never our 5xx
    assert len(placed) == 6
    store = control_plane.ctx.store
    assert all(store.get_instance(i).state is InstanceState.COMPLETED for i in placed[:3])
    assert active_instance_ids(control_plane, worker.id) == set(placed[3:])
    assert store.get_worker(worker.id).active_instances == 3


def test_given_conflicts_while_forcing_then_every_instance_is_forced_and_none_survives_the_stop(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    worker = ec2_worker()
    stuck = [
        control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})[1]["id"] for _ in range(3)
    ]
    # Only the instance ends conflict: the force step's own writes meet AWS's TransactionConflict.
    conflicts = faults.dynamodb_conflicts(1.0, limit=2, when=lambda _op, params: "INSTANCE#" in str(params))
    plan = faults.FaultPlan(seed=52, faults=[conflicts])
    with plan.installed():
        started = drain(control_plane, worker.id, timeout_seconds=2)
        assert_drained_once(control_plane, ec2, worker, started["execution_arn"], outcome="TIMED_OUT")

    store = control_plane.ctx.store
    assert conflicts.injected == 2
    assert [store.get_instance(i).state for i in stuck] == [InstanceState.TERMINATED] * 3
    record = store.get_worker(worker.id).drain
    assert record is not None
    assert record.forced_instances == 3
    assert store.get_worker(worker.id).active_instances == 0


# ---- EC2 ------------------------------------------------------------------------------------------


def cycle(minutes_later: float = 0) -> Any:
    return reconcile_fleet(default_context(), now=utcnow() + timedelta(minutes=minutes_later))


@pytest.mark.usefixtures("fresh_process")
@pytest.mark.parametrize(
    "fault",
    [
        lambda: faults.ec2_throttling(1.0, limit=1, operations=frozenset({"DescribeInstances"})),
        lambda: faults.ec2_server_error(1.0, limit=1, operations=frozenset({"DescribeInstances"})),
    ],
    ids=["RequestLimitExceeded", "InternalError"],
)
def test_given_ec2_refusing_the_cycles_reads_then_the_cycle_counts_it_and_the_next_one_converges(
    ec2_worker: WorkerFactory, ec2: Any, store: Any, fault: Any
) -> None:
    fleet = [ec2_worker() for _ in range(3)]
    ec2.stop_instances(InstanceIds=[w.ec2_instance_id for w in fleet])
    injected = fault()
    plan = faults.FaultPlan(seed=53, faults=[injected])
    with plan.installed():
        first = cycle()
        unchanged = [store.get_worker(w.id).status for w in fleet]
        second = cycle(minutes_later=10)

    assert injected.injected == 1
    assert first.counters["reconcile_errors"] == 1
    assert unchanged == [WorkerStatus.RUNNING] * 3  # nothing decided without EC2's word
    assert second.counters["reconcile_errors"] == 0
    assert [store.get_worker(w.id).status for w in fleet] == [WorkerStatus.STOPPED] * 3


@pytest.mark.usefixtures("fresh_process", "lab_image")
def test_given_no_capacity_for_a_launch_then_it_backs_off_and_the_next_cycle_launches_one_machine(
    ec2: Any, store: Any
) -> None:
    ensure_template(store, "lab")
    worker = workers.create_worker(store, template="lab", region="us-east-1", pool=None, actor="t")
    no_capacity = faults.ec2_no_capacity(1.0, limit=1)
    plan = faults.FaultPlan(seed=54, faults=[no_capacity])
    with plan.installed():
        first = cycle()
        waiting = store.get_worker(worker.id)
        second = cycle(minutes_later=10)

    assert no_capacity.injected == 1
    assert first.counters["retries_scheduled"] == 1
    assert waiting.status is WorkerStatus.PENDING
    assert waiting.reconcile_attempts == 1
    assert "InsufficientInstanceCapacity" in (waiting.last_reconcile_error or "")
    assert second.counters["provisioned_count"] == 1
    launched = store.get_worker(worker.id)
    assert launched.status is WorkerStatus.PROVISIONING
    assert launched.reconcile_attempts == 0
    machines = ec2.describe_instances(Filters=[{"Name": f"tag:{WORKER_ID_TAG}", "Values": [worker.id]}])
    assert [i["InstanceId"] for r in machines["Reservations"] for i in r["Instances"]] == [
        launched.ec2_instance_id
    ]


def test_given_ec2_failing_the_drains_stop_once_then_the_finish_step_retries_and_the_machine_stops(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    worker = ec2_worker()
    refused = faults.ec2_server_error(1.0, limit=1, operations=frozenset({"StopInstances"}))
    plan = faults.FaultPlan(seed=55, faults=[refused])
    with plan.installed():
        started = drain(control_plane, worker.id)
        assert_drained_once(control_plane, ec2, worker, started["execution_arn"])

    assert refused.injected == 1
    assert runs(control_plane, "finish", worker.id) <= 2
    assert ec2_state(ec2, worker.ec2_instance_id or "") in ("stopping", "stopped")
