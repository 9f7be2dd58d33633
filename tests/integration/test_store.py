"""The store on DynamoDB Local: conditional writes, placement transactions, queries, audit."""

from __future__ import annotations

import pytest

from fleetkeeper.domain.errors import (
    CapacityUnavailable,
    Conflict,
    IllegalTransition,
    InvalidInput,
    NotFound,
)
from fleetkeeper.domain.lifecycle import Cause, InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Instance
from fleetkeeper.services import placement, workers
from fleetkeeper.store.repository import FleetStore

pytestmark = pytest.mark.integration


def test_given_a_stale_read_when_writing_then_a_conflict_names_the_current_status(store, running_worker):
    worker = running_worker()
    store.transition_worker(worker, WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="admin")
    with pytest.raises(Conflict) as raised:
        store.transition_worker(worker, WorkerStatus.STOPPING, cause=Cause.CONTROL, actor="other")
    assert raised.value.current_status == "DRAINING"
    assert "DRAINING" in raised.value.message
    assert store.get_worker(worker.id).status is WorkerStatus.DRAINING


def test_given_an_illegal_transition_then_nothing_is_written(store, running_worker):
    worker = running_worker()
    with pytest.raises(IllegalTransition):
        store.transition_worker(worker, WorkerStatus.PENDING, cause=Cause.CONTROL, actor="admin")
    after = store.get_worker(worker.id)
    assert after.version == worker.version
    assert [e.to_status for e in store.audit_trail("worker", worker.id)] == [
        "PENDING",
        "PROVISIONING",
        "RUNNING",
    ]


def test_given_a_bad_change_then_it_is_refused_before_the_table(store, running_worker):
    worker = running_worker()
    with pytest.raises(InvalidInput) as raised:
        store.update_worker(worker, {"capacity": -3}, actor="admin", action="Resize")
    assert raised.value.field == "capacity"
    assert store.get_worker(worker.id).capacity == worker.capacity


def test_given_each_transition_then_an_audit_item_records_who_why_and_when(store, running_worker):
    worker = running_worker()
    store.transition_worker(
        worker,
        WorkerStatus.DRAINING,
        cause=Cause.CONTROL,
        actor="arn:aws:iam::1:user/ops",
        reason="maintenance",
    )
    trail = store.audit_trail("worker", worker.id)
    last = trail[-1]
    assert (last.from_status, last.to_status, last.actor, last.reason) == (
        "RUNNING",
        "DRAINING",
        "arn:aws:iam::1:user/ops",
        "maintenance",
    )
    assert [e.at for e in trail] == sorted(e.at for e in trail)


def test_given_unknown_template_or_pool_then_creating_a_worker_names_the_field(store, running_worker):
    running_worker(template="lab")
    with pytest.raises(InvalidInput) as raised:
        workers.create_worker(store, template="nope", region="us-east-1", actor="t")
    assert raised.value.field == "template"
    with pytest.raises(InvalidInput) as raised:
        workers.create_worker(store, template="lab", region="us-east-1", pool="nope", actor="t")
    assert raised.value.field == "pool"


def test_given_a_duplicate_worker_id_then_the_second_create_conflicts(store, running_worker):
    running_worker(template="lab")
    workers.create_worker(store, template="lab", region="us-east-1", actor="t", worker_id="w-fixed")
    with pytest.raises(Conflict, match="already exists"):
        workers.create_worker(store, template="lab", region="us-east-1", actor="t", worker_id="w-fixed")


def test_given_a_full_worker_when_placing_then_no_capacity(store, running_worker):
    worker = running_worker(capacity=2)
    for _ in range(2):
        placed = placement.place_instance(store, actor="t", worker_id=worker.id)
        assert placed.worker_id == worker.id
    with pytest.raises(Conflict, match="full"):
        placement.place_instance(store, actor="t", worker_id=worker.id)
    with pytest.raises(CapacityUnavailable, match="every RUNNING worker is full"):
        placement.place_instance(store, actor="t", template="lab")
    assert store.get_worker(worker.id).active_instances == 2


def test_given_a_draining_worker_when_the_transaction_runs_then_it_refuses(store, running_worker):
    worker = running_worker()
    store.transition_worker(worker, WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="admin")
    # Use the stale RUNNING read on purpose: the transaction itself must refuse.
    with pytest.raises(Conflict) as raised:
        store.place_instance(Instance(id="i-stale", worker_id=""), worker, actor="t")
    assert raised.value.current_status == "DRAINING"
    assert store.find_instance("i-stale") is None
    assert store.get_worker(worker.id).active_instances == 0


def test_given_a_draining_pool_when_placing_then_the_transaction_refuses(store, running_worker):
    worker = running_worker(pool="labs")
    pool = store.get_pool("labs")
    store.save_pool(pool, {"status": PoolStatus.DRAINING}, actor="admin", action="PoolDrainStarted")
    with pytest.raises(Conflict) as raised:
        store.place_instance(Instance(id="i-pool", worker_id=""), worker, actor="t")
    assert raised.value.current_status == "draining"
    with pytest.raises(CapacityUnavailable, match="draining"):
        placement.place_instance(store, actor="t", pool="labs")
    assert store.find_instance("i-pool") is None


def test_given_pack_strategy_then_the_fullest_worker_with_room_is_filled_first(store, running_worker):
    busy = running_worker(capacity=4)
    idle = running_worker(capacity=4)
    placement.place_instance(store, actor="t", worker_id=busy.id)
    placed = [placement.place_instance(store, actor="t", template="lab").worker_id for _ in range(3)]
    assert placed == [busy.id] * 3
    assert placement.place_instance(store, actor="t", template="lab").worker_id == idle.id


def test_given_an_ended_instance_then_its_slot_is_freed_once(store, running_worker):
    worker = running_worker(capacity=1)
    instance = placement.place_instance(store, actor="t", worker_id=worker.id)
    store.end_instance(store.get_instance(instance.id), InstanceState.COMPLETED, actor="t")
    assert store.get_worker(worker.id).active_instances == 0
    with pytest.raises(IllegalTransition):
        store.end_instance(store.get_instance(instance.id), InstanceState.TERMINATED, actor="t")
    # A stale copy that still looks active is refused by the condition, not double-counted.
    with pytest.raises(Conflict):
        store.end_instance(instance, InstanceState.TERMINATED, actor="t")
    assert store.get_worker(worker.id).active_instances == 0


def test_given_a_counter_already_at_zero_then_ending_still_ends_the_instance(store, running_worker, dynamodb):
    worker = running_worker(capacity=1)
    instance = placement.place_instance(store, actor="t", worker_id=worker.id)
    dynamodb.update_item(
        TableName=store.table_name,
        Key={"PK": {"S": f"WORKER#{worker.id}"}, "SK": {"S": "WORKER"}},
        UpdateExpression="SET active_instances = :z",
        ExpressionAttributeValues={":z": {"N": "0"}},
    )
    ended = store.end_instance(instance, InstanceState.COMPLETED, actor="t")
    assert ended.state is InstanceState.COMPLETED
    assert store.get_worker(worker.id).active_instances == 0


def test_given_workers_then_queries_filter_by_status_region_pool_and_template(store, running_worker):
    a = running_worker(template="lab", pool="labs", region="us-east-1")
    b = running_worker(template="lab", pool="labs", region="eu-west-1")
    c = running_worker(template="gpu", pool="ml", region="us-east-1")
    store.transition_worker(c, WorkerStatus.STOPPING, cause=Cause.CONTROL, actor="t")

    def ids(**filters):
        return {w.id for w in store.list_workers(limit=100, **filters).items}

    assert ids(status=WorkerStatus.RUNNING) == {a.id, b.id}
    assert ids(status=WorkerStatus.RUNNING, region="eu-west-1") == {b.id}
    assert ids(status=WorkerStatus.RUNNING, region="us-east-1", template="lab") == {a.id}
    assert ids(status=WorkerStatus.STOPPING, pool="ml") == {c.id}
    assert ids(pool="labs") == {a.id, b.id}
    assert ids(template="gpu") == {c.id}
    assert ids() == {a.id, b.id, c.id}
    assert {w.id for w in store.iter_workers_by_status([WorkerStatus.RUNNING, WorkerStatus.STOPPING])} == {
        a.id,
        b.id,
        c.id,
    }


def test_given_more_workers_than_a_page_then_next_token_walks_them_all(store, running_worker):
    made = {running_worker().id for _ in range(5)}
    seen: list[str] = []
    token = None
    while True:
        page = store.list_workers(limit=2, next_token=token)
        seen.extend(w.id for w in page.items)
        token = page.next_token
        if token is None:
            break
    assert sorted(seen) == sorted(made)


def test_given_a_bad_limit_then_the_error_names_limit(store):
    with pytest.raises(InvalidInput) as raised:
        store.list_workers(limit=0)
    assert raised.value.field == "limit"


def test_given_instances_then_they_are_found_by_worker_and_state(store, running_worker):
    worker = running_worker(capacity=3)
    first = placement.place_instance(store, actor="t", worker_id=worker.id)
    second = placement.place_instance(store, actor="t", worker_id=worker.id)
    store.end_instance(first, InstanceState.COMPLETED, actor="t")
    assert {i.id for i in store.list_instances(worker_id=worker.id).items} == {first.id, second.id}
    assert [i.id for i in store.active_instances_of(worker.id)] == [second.id]
    assert {i.id for i in store.list_instances(state=InstanceState.COMPLETED).items} == {first.id}


def test_given_an_ec2_instance_id_then_its_worker_is_found(store, running_worker):
    worker = running_worker()
    assert store.find_worker_by_ec2_instance(worker.ec2_instance_id).id == worker.id
    assert store.find_worker_by_ec2_instance("i-doesnotexist") is None


def test_given_an_unknown_id_then_not_found_names_kind_and_id(store: FleetStore):
    with pytest.raises(NotFound) as raised:
        store.get_worker("w-missing")
    assert raised.value.details() == {"kind": "worker", "id": "w-missing"}


def test_given_one_worker_named_twice_then_a_batch_read_returns_it_once(store, running_worker):
    # A listing merged from several index partitions names a worker twice when it changed status during
    # the walk; DynamoDB refuses a BatchGetItem that names a key twice, which once answered GET
    # /api/v1/workers with a 500.
    worker = running_worker()
    other = running_worker()

    found = store.get_workers([worker.id, other.id, worker.id], consistent=False)

    assert sorted(w.id for w in found) == sorted([worker.id, other.id])
