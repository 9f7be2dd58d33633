"""A reconcile invocation that dies mid-cycle: the next cycles finish its work, nothing twice, nothing lost.

The crash is a dead Lambda (timeout, out of memory): after its second worker write no further call of
that invocation reaches AWS, not even the lease release in its `finally`. The lease therefore keeps a
second cycle out until it expires; then one cycle converges the fleet.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.tags import WORKER_ID_TAG
from fleetkeeper.services import workers
from fleetkeeper.services.context import default_context
from fleetkeeper.services.reconcile import LAUNCH_CLAIM_TTL
from fleetkeeper_local import faults
from tests.integration.conftest import WorkerFactory
from tests.integration.functions import reconcile_fleet

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.usefixtures("fresh_process", "lab_image"),
]

# Just above the reconciler's safety margin, so the cycle works; its lease lasts this plus the margin.
INVOCATION_SECONDS = 10.5
LEASE_WAIT_SECONDS = 30
# A few attempts at the worker's move and at recording its backoff, each with a bounded retry.
MAX_WRITE_ATTEMPTS_PER_CYCLE = 12


def machines_of(ec2: Any, worker_id: str) -> list[str]:
    reservations = ec2.describe_instances(Filters=[{"Name": f"tag:{WORKER_ID_TAG}", "Values": [worker_id]}])
    return [
        i["InstanceId"]
        for r in reservations["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] not in ("terminated", "shutting-down")
    ]


def cycle(now_offset: timedelta = timedelta(0)) -> Any:
    return reconcile_fleet(default_context(), time_left=lambda: INVOCATION_SECONDS, now=utcnow() + now_offset)


def test_given_a_reconcile_that_dies_after_its_second_worker_write_then_the_next_cycle_finishes_the_job(
    ec2_worker: WorkerFactory, ec2: Any, store: Any
) -> None:
    stopped_outside = [ec2_worker() for _ in range(3)]
    ec2.stop_instances(InstanceIds=[w.ec2_instance_id for w in stopped_outside])
    pending = [
        workers.create_worker(store, template="lab", region="us-east-1", pool=None, actor="t")
        for _ in range(2)
    ]
    dies = faults.crash_after_writes(2)
    plan = faults.FaultPlan(seed=41, faults=[dies])
    with plan.installed():
        with pytest.raises(faults.InvocationCrashed):
            cycle()
        plan.revive()

        # The dead invocation still holds the lease: no second cycle runs beside its leftovers.
        assert cycle().lease_acquired is False

        deadline = time.monotonic() + LEASE_WAIT_SECONDS
        report = cycle(LAUNCH_CLAIM_TTL + timedelta(minutes=1))
        while not report.lease_acquired and time.monotonic() < deadline:
            time.sleep(1)
            report = cycle(LAUNCH_CLAIM_TTL + timedelta(minutes=1))
    assert report.lease_acquired, "the dead invocation's lease never expired"
    assert plan.summary() == {"dynamodb:Crashed": 1}

    assert [store.get_worker(w.id).status for w in stopped_outside] == [WorkerStatus.STOPPED] * 3
    for worker in pending:
        current = store.get_worker(worker.id)
        assert current.status is WorkerStatus.PROVISIONING, current
        assert current.launch_claimed_at is None
        # A launch the dead invocation may have made is adopted, never doubled.
        assert machines_of(ec2, worker.id) == [current.ec2_instance_id]


def test_given_one_workers_writes_failing_throughout_then_the_cycle_converges_the_others_and_counts_it(
    ec2_worker: WorkerFactory, ec2: Any, store: Any
) -> None:
    fleet = [ec2_worker() for _ in range(4)]
    ec2.stop_instances(InstanceIds=[w.ec2_instance_id for w in fleet])
    unlucky = fleet[0].id
    # Every write to this one worker fails with a 5xx for the whole cycle: retries cannot clear it.
    refused = faults.Fault(
        "dynamodb",
        "InternalServerError",
        frozenset({"TransactWriteItems", "UpdateItem", "PutItem"}),
        status=500,
        when=lambda op, params: faults.is_worker_write(op, params) and unlucky in str(params),
    )
    plan = faults.FaultPlan(seed=42, faults=[refused])
    with plan.installed():
        first = cycle()
    assert first.completed  # the cycle itself finished, drain sweep included
    assert first.counters["reconcile_errors"] >= 1
    assert 1 <= refused.injected <= MAX_WRITE_ATTEMPTS_PER_CYCLE  # retried, but bounded
    assert [store.get_worker(w.id).status for w in fleet[1:]] == [WorkerStatus.STOPPED] * 3
    assert store.get_worker(unlucky).status is WorkerStatus.RUNNING

    # Once DynamoDB answers again, the next due cycle converges it.
    cycle(timedelta(minutes=10))
    assert store.get_worker(unlucky).status is WorkerStatus.STOPPED
