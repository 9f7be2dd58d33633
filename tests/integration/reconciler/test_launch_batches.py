"""Capacity comes up with batched EC2 calls (docs/capacity.md, "One launch call per batch"): the cycle's
launches of one template share one RunInstances, its starts one StartInstances; a batch whose answer was
lost is adopted by its tag, never launched twice; a short answer leaves the workers it has no machine for
PENDING on the capacity backoff; a machine of a batch whose place no worker holds is terminated by
discovery. Every EC2 request is counted by a botocore hook on the real clients."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest

from fleetkeeper.domain.capacity import BlockedReason, CapacityPolicy
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.reconcile import LAUNCH_CLAIM_TTL, capacity_backoff_seconds
from fleetkeeper.domain.tags import BATCH_TAG, MANAGED_BY_TAG, MANAGED_BY_VALUE
from fleetkeeper.services import catalog, workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import ec2_time, faults
from tests.integration.aws_calls import CallCount, aws_calls
from tests.integration.functions import discover_and_collect, reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory
from tests.integration.reconciler.support import ensure_template, instances_tagged, stopped_warm

pytestmark = pytest.mark.integration

S = WorkerStatus
GONE = ("shutting-down", "terminated")
LIVE = (S.PROVISIONING, S.RUNNING)


def policy_pool(store: FleetStore, workers_wanted: int) -> None:
    ensure_template(store, "lab", capacity=4)
    wanted = CapacityPolicy(template="lab", min_workers=workers_wanted, max_workers=workers_wanted)
    catalog.put_pool(store, "labs", actor="test", capacity=wanted)


def pending(store: FleetStore, count: int) -> list[Worker]:
    ensure_template(store, "lab", capacity=4)
    return [
        workers.create_worker(store, template="lab", region="us-east-1", actor="test") for _ in range(count)
    ]


def members(store: FleetStore) -> list[Worker]:
    return store.get_workers([w.id for w in store.workers_in_pool("labs")])


def managed_machines(ec2: Any) -> dict[str, dict[str, Any]]:
    """Every live machine carrying the managed tag, by id."""
    found = ec2.describe_instances(Filters=[{"Name": f"tag:{MANAGED_BY_TAG}", "Values": [MANAGED_BY_VALUE]}])
    return {
        i["InstanceId"]: i
        for r in found["Reservations"]
        for i in r["Instances"]
        if i["State"]["Name"] not in GONE
    }


def each_on_its_own_machine(ec2: Any, fleet: list[Worker]) -> bool:
    """Every worker holds one machine, tagged with its id, and no other live machine carries its id."""
    machines = {w.ec2_instance_id for w in fleet}
    return (
        None not in machines
        and len(machines) == len(fleet)
        and all(instances_tagged(ec2, w.id) == [w.ec2_instance_id] for w in fleet)
    )


def batch_reads(calls: CallCount) -> int:
    """DescribeInstances asked by a launch batch's tag (the query as EC2 receives it)."""
    return sum(
        1
        for params in calls.sent("ec2", "DescribeInstances")
        if any(k.startswith("Filter.") and v == f"tag:{BATCH_TAG}" for k, v in params.items())
    )


def started_ids(params: dict[str, Any]) -> list[str]:
    return sorted(str(v) for k, v in params.items() if k.startswith("InstanceId."))


@pytest.fixture
def calls() -> Iterator[CallCount]:
    with aws_calls() as counted:
        yield counted


def test_given_a_scale_out_of_six_workers_then_one_run_instances_brings_all_six_up_running(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str, calls: CallCount
) -> None:
    policy_pool(store, 6)
    now = utcnow()

    for n in range(3):  # creates the six, launches them, sees them run
        reconcile_fleet(make_ctx(), now=now + timedelta(seconds=n))

    fleet = members(store)
    assert [w.status for w in fleet] == [S.RUNNING] * 6
    assert calls.of("ec2", "RunInstances") == 1
    (launch,) = calls.sent("ec2", "RunInstances")
    assert (launch["MinCount"], launch["MaxCount"]) == (1, 6)
    # The launch carried what the six share; each worker's id was written on its machine once paired.
    assert each_on_its_own_machine(ec2, fleet)
    assert len(managed_machines(ec2)) == 6
    assert calls.of("ec2", "CreateTags") == 6


def test_given_four_warm_workers_woken_then_one_start_instances_starts_them_all(
    store: FleetStore,
    make_ctx: ContextFactory,
    live_worker: LiveWorkerFactory,
    ec2: Any,
) -> None:
    warm = stopped_warm(store, ec2, [live_worker(pool="labs") for _ in range(4)])
    policy_pool(store, 4)
    now = utcnow()

    with aws_calls() as counted:
        woken = reconcile_fleet(make_ctx(), now=now)
        started = reconcile_fleet(make_ctx(), now=now + timedelta(seconds=1))
        reconcile_fleet(make_ctx(), now=now + timedelta(seconds=2))

    assert woken.counters["capacity_workers_woken"] == 4
    assert started.counters["outcome_requeue"] == 4
    assert counted.of("ec2", "StartInstances") == 1
    (start,) = counted.sent("ec2", "StartInstances")
    assert started_ids(start) == sorted(w.ec2_instance_id or "" for w in warm)
    assert counted.of("ec2", "RunInstances") == 0
    assert [w.status for w in store.get_workers([w.id for w in warm])] == [S.RUNNING] * 4


def test_given_a_crash_after_run_instances_answered_then_the_next_cycle_pairs_each_worker_launching_none(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str, calls: CallCount
) -> None:
    fleet = pending(store, 3)
    dies = faults.Fault("ec2", "Crashed", frozenset({"RunInstances"}), after=True, crash=True, limit=1)
    now = utcnow()

    with faults.FaultPlan(seed=71, faults=[dies]).installed(), pytest.raises(faults.InvocationCrashed):
        reconcile_fleet(make_ctx(), now=now)
    claimed = store.get_workers([w.id for w in fleet])
    too_soon = reconcile_fleet(make_ctx(), now=now + timedelta(minutes=1))
    reconcile_fleet(make_ctx(), now=now + LAUNCH_CLAIM_TTL + timedelta(minutes=1))

    # The crash left the claims and three machines no worker had recorded.
    assert dies.injected == 1
    assert [w.status for w in claimed] == [S.PENDING] * 3
    assert sorted(w.launch_index or 0 for w in claimed) == [0, 1, 2]
    assert len({w.launch_token for w in claimed}) == 1
    assert too_soon.counters["provisioned_count"] == 0  # a claim younger than its TTL is waited for
    paired = store.get_workers([w.id for w in fleet])
    assert [w.status for w in paired] == [S.PROVISIONING] * 3
    assert [(w.launch_token, w.launch_index, w.launch_claimed_at) for w in paired] == [(None, None, None)] * 3
    assert each_on_its_own_machine(ec2, paired)
    assert len(managed_machines(ec2)) == 3
    assert calls.of("ec2", "RunInstances") == 1
    assert batch_reads(calls) == 1  # the three found their machines with one read of the batch's tag


def test_given_a_batch_answer_lost_after_it_landed_then_the_workers_adopt_its_machines(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str, calls: CallCount
) -> None:
    fleet = pending(store, 2)
    lost = faults.Fault("ec2", "InternalError", frozenset({"RunInstances"}), status=500, after=True, limit=1)
    now = utcnow()

    with faults.FaultPlan(seed=72, faults=[lost]).installed():
        unanswered = reconcile_fleet(make_ctx(), now=now)
    reconcile_fleet(make_ctx(), now=now + timedelta(minutes=2))

    assert unanswered.counters["retries_scheduled"] == 2
    launched = store.get_workers([w.id for w in fleet])
    assert [w.status for w in launched] == [S.PROVISIONING] * 2
    assert each_on_its_own_machine(ec2, launched)
    assert len(managed_machines(ec2)) == 2
    assert calls.of("ec2", "RunInstances") == 1


def test_given_capacity_for_two_of_five_then_three_wait_pending_on_the_capacity_backoff_and_launch_later(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str, calls: CallCount
) -> None:
    fleet = pending(store, 5)
    ec2_time.set_capacity(ec2, "m5.large", available=2)
    now = utcnow()

    short = reconcile_fleet(make_ctx(), now=now)
    after = store.get_workers([w.id for w in fleet])
    waiting = [w for w in after if w.status == S.PENDING]
    ec2_time.set_capacity(ec2, "m5.large", available=True)
    reconcile_fleet(make_ctx(), now=now + timedelta(seconds=capacity_backoff_seconds(0) + 1))

    assert sorted(w.status for w in after) == sorted([S.PROVISIONING] * 2 + [S.PENDING] * 3)
    assert short.counters["capacity_errors"] == 3
    for worker in waiting:
        assert (worker.reconcile_attempts, worker.launch_token) == (1, None)
        assert worker.next_reconcile_at == now + timedelta(seconds=capacity_backoff_seconds(0))
        assert "RunInstances launched 2 of the 5 machines asked for" in (worker.last_reconcile_error or "")
    # The three launch together once the backoff ran out: one more call, no machine twice.
    launched = store.get_workers([w.id for w in fleet])
    assert all(w.status in LIVE for w in launched)
    assert each_on_its_own_machine(ec2, launched)
    assert len(managed_machines(ec2)) == 5
    assert [r["MaxCount"] for r in calls.sent("ec2", "RunInstances")] == [5, 3]


def test_given_no_capacity_for_a_batch_then_its_workers_back_off_and_its_pool_is_blocked(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str, calls: CallCount
) -> None:
    policy_pool(store, 3)
    now = utcnow()
    reconcile_fleet(make_ctx(), now=now)  # creates the three
    ec2_time.set_capacity(ec2, "m5.large", available=False)

    refused = reconcile_fleet(make_ctx(), now=now + timedelta(seconds=1))

    assert refused.counters["launches_refused_for_capacity"] == 3
    assert [(w.status, w.reconcile_attempts) for w in members(store)] == [(S.PENDING, 1)] * 3
    assert managed_machines(ec2) == {}
    assert calls.of("ec2", "RunInstances") == 1
    blocked = make_ctx().capacity.state("labs").blocked
    assert blocked is not None
    assert (blocked.reason, blocked.aws_error) == (
        BlockedReason.INSUFFICIENT_CAPACITY,
        "InsufficientInstanceCapacity",
    )


def lose_claim(table_name: str, worker_id: str) -> Callable[..., None]:
    """A botocore hook that, the first time the worker's launch claim is sent, changes the worker first,
    as an operator's write racing the reconciler would: the claim's condition then fails."""
    other = FleetStore(faults.unhooked_client("dynamodb"), table_name)
    raced: list[datetime] = []

    def race(params: dict[str, Any], **_: Any) -> None:
        body = str(params.get("body", ""))
        if not raced and "LaunchClaimed" in body and worker_id in body:
            raced.append(utcnow())
            other.update_worker(other.get_worker(worker_id), {}, actor="operator", action="Touched")

    return race


def test_given_a_claim_lost_then_its_machine_of_the_batch_is_terminated_by_discovery_not_imported(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str, table_name: str
) -> None:
    fleet = pending(store, 3)
    unlucky = fleet[1]
    now = utcnow()

    with faults.installed_hooks(
        [("before-call.dynamodb.TransactWriteItems", lose_claim(table_name, unlucky.id))]
    ):
        first = reconcile_fleet(make_ctx(), now=now)
    orphan = next(
        iter(
            set(managed_machines(ec2)) - {w.ec2_instance_id for w in store.get_workers([w.id for w in fleet])}
        )
    )
    reconcile_fleet(make_ctx(), now=now + timedelta(seconds=1))  # the unlucky one launches alone
    found = discover_and_collect(make_ctx())

    assert first.counters["conflicts"] == 1
    assert managed_machines(ec2).get(orphan) is None
    assert (found.counters["leaked_machines_terminated"], found.counters["imported"]) == (1, 0)
    launched = store.get_workers([w.id for w in fleet])
    assert all(w.status in LIVE for w in launched)
    assert each_on_its_own_machine(ec2, launched)
    assert len(managed_machines(ec2)) == 3


def test_given_a_paired_machine_left_untagged_then_discovery_writes_its_workers_id(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str
) -> None:
    fleet = pending(store, 2)
    denied = faults.Fault("ec2", "UnauthorizedOperation", frozenset({"CreateTags"}))

    with faults.FaultPlan(seed=73, faults=[denied]).installed():
        launched = reconcile_fleet(make_ctx())
    untagged = [instances_tagged(ec2, w.id) for w in fleet]
    discover_and_collect(make_ctx())

    assert launched.counters["launch_tags_deferred"] == 2
    assert untagged == [[], []]
    assert each_on_its_own_machine(ec2, store.get_workers([w.id for w in fleet]))
