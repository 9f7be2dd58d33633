"""A drain moves the instances that have not started yet: the move transaction and the rescheduler.

Store-level and service-level on DynamoDB Local, with AWS's own failures (transaction conflicts, a lost
answer, a writer that wins the race) injected into the real client by fleetkeeper_local.faults. The
workflow-level behaviour (the drain completes without waiting) is in test_drain_workflow.py.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.errors import Conflict, DrainCancelled, DrainNoLongerActive, StaleWrite
from fleetkeeper.domain.lifecycle import Cause, InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, Instance, Worker, utcnow
from fleetkeeper.services import drains, placement
from fleetkeeper.services.context import Context, build_context
from fleetkeeper.services.drains.contract import DrainInput
from fleetkeeper.services.drains.reschedule import reschedule
from fleetkeeper.settings import get_settings
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.conftest import WorkerFactory

pytestmark = pytest.mark.integration

CONFLICT = "dynamodb:TransactionCanceledException/TransactionConflict"


def hooked_store(table_name: str) -> FleetStore:
    """A store on a client created now, so an installed fault plan applies to it."""
    return FleetStore(client("dynamodb"), table_name)


def hooked_context() -> Context:
    return build_context(get_settings())


def place(store: FleetStore, worker: Worker) -> Instance:
    return placement.place_instance(store, actor="test", worker_id=worker.id)


def draining(store: FleetStore, worker_id: str, generation: int = 1) -> Worker:
    now = utcnow()
    record = DrainRecord(
        generation=generation,
        started_at=now,
        deadline=now + timedelta(hours=1),
        timeout_seconds=3600,
        requested_by="test",
    )
    return store.transition_worker(
        store.get_worker(worker_id),
        WorkerStatus.DRAINING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"drain": record},
    )


def counts(store: FleetStore, *workers: Worker) -> list[int]:
    return [store.get_worker(w.id).active_instances for w in workers]


def active_ids(store: FleetStore, worker: Worker) -> list[str]:
    return [i.id for i in store.active_instances_of(worker.id)]


def moved_count(store: FleetStore, worker: Worker) -> int:
    record = store.get_worker(worker.id).drain
    assert record is not None
    return record.moved_instances


# ---- the move transaction -------------------------------------------------------------------------------


def test_given_a_scheduled_instance_on_a_draining_worker_when_moved_then_counters_ids_and_audit_agree(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source, target = running_worker(pool="labs"), running_worker(pool="labs")
    instance = place(store, source)
    draining(store, source.id)

    moved = store.move_instance(instance, target, actor="test", drain_generation=1)

    assert store.get_instance(instance.id) == moved
    assert (moved.worker_id, moved.state, moved.pool) == (target.id, InstanceState.SCHEDULED, "labs")
    assert counts(store, source, target) == [0, 1]
    assert (active_ids(store, source), active_ids(store, target)) == ([], [instance.id])
    assert moved_count(store, source) == 1
    trail = store.audit_trail("instance", instance.id)
    assert [e.action for e in trail][-1] == "InstanceMoved"
    assert trail[-1].details == {"from_worker_id": source.id, "worker_id": target.id, "generation": 1}


def test_given_transaction_conflicts_when_an_instance_moves_then_it_moves_once_after_backoff(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    source, target = running_worker(), running_worker()
    instance = place(store, source)
    draining(store, source.id)
    plan = faults.FaultPlan(seed=11, faults=[faults.dynamodb_conflicts(1.0, limit=2)])

    with plan.installed():
        hooked_store(table_name).move_instance(instance, target, actor="test", drain_generation=1)

    assert plan.summary() == {CONFLICT: 2}
    assert store.get_instance(instance.id).worker_id == target.id
    assert counts(store, source, target) == [0, 1]
    assert moved_count(store, source) == 1


def test_given_the_move_landed_but_its_answer_was_lost_when_retried_then_it_counts_once(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    source, target = running_worker(), running_worker()
    instance = place(store, source)
    draining(store, source.id)
    lost = faults.Fault(
        "dynamodb",
        "TransactionCanceledException/TransactionConflict",
        frozenset({"TransactWriteItems"}),
        limit=1,
        after=True,
    )
    plan = faults.FaultPlan(seed=12, faults=[lost])

    with plan.installed():
        moved = hooked_store(table_name).move_instance(instance, target, actor="test", drain_generation=1)

    assert plan.summary() == {CONFLICT: 1}
    assert store.get_instance(instance.id) == moved
    assert counts(store, source, target) == [0, 1]
    assert moved_count(store, source) == 1


def test_given_a_full_target_when_moving_then_conflict_and_the_instance_stays(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source, target = running_worker(), running_worker(capacity=1)
    place(store, target)
    instance = place(store, source)
    draining(store, source.id)

    with pytest.raises(Conflict) as refused:
        store.move_instance(instance, store.get_worker(target.id), actor="test", drain_generation=1)

    assert type(refused.value) is Conflict
    assert "is full (1/1)" in refused.value.message
    assert store.get_instance(instance.id) == instance
    assert counts(store, source, target) == [1, 1]
    assert moved_count(store, source) == 0


def test_given_an_instance_that_started_when_moving_the_read_copy_then_stale_write(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source, target = running_worker(), running_worker()
    instance = place(store, source)
    store.update_instance(
        instance, {"state": InstanceState.INSTANTIATING}, actor="test", action="InstanceInstantiating"
    )
    draining(store, source.id)

    with pytest.raises(StaleWrite):
        store.move_instance(instance, target, actor="test", drain_generation=1)

    assert store.get_instance(instance.id).worker_id == source.id
    assert counts(store, source, target) == [1, 0]


def test_given_a_drain_cancelled_first_when_moving_then_no_move(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source, target = running_worker(), running_worker()
    instance = place(store, source)
    worker = draining(store, source.id)
    assert worker.drain is not None
    store.transition_worker(
        worker,
        WorkerStatus.RUNNING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"drain": worker.drain.model_copy(update={"outcome": DrainOutcome.CANCELLED})},
    )

    with pytest.raises(DrainNoLongerActive):
        store.move_instance(instance, target, actor="test", drain_generation=1)

    assert store.get_instance(instance.id).worker_id == source.id
    assert counts(store, source, target) == [1, 0]


def test_given_a_closed_pool_then_the_move_is_refused_and_the_rescheduler_tries_none(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    source, target = running_worker(pool="labs"), running_worker(pool="labs")
    instance = place(store, source)
    worker = draining(store, source.id)
    store.save_pool(store.get_pool("labs"), {"status": PoolStatus.DRAINING}, actor="test", action="Drain")

    with pytest.raises(Conflict, match="pool labs is draining"):
        store.move_instance(instance, target, actor="test", drain_generation=1)
    plan = faults.FaultPlan(seed=15, faults=[faults.dynamodb_conflicts(1.0)])
    with plan.installed():
        assert reschedule(hooked_context(), worker, 1) == 0

    assert plan.summary() == {}  # not one transaction tried
    assert store.get_instance(instance.id) == instance
    assert counts(store, source, target) == [1, 0]


# ---- the rescheduler: target choice, lost races ---------------------------------------------------------


def test_given_a_target_filled_by_another_writer_first_then_the_instance_goes_to_the_next_target(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source = running_worker(pool="labs")
    # Packing tries the fullest worker with room first: `nearly_full`, whose last slot a concurrent
    # placement takes just before the move's transaction reaches the table.
    nearly_full, roomy = running_worker(pool="labs", capacity=2), running_worker(pool="labs", capacity=4)
    place(store, nearly_full)
    instance = place(store, source)
    worker = draining(store, source.id)
    raced: list[Instance] = []

    def placement_wins(operation: str, params: dict[str, Any]) -> bool:
        if not raced:
            raced.append(place(store, nearly_full))  # the fixture's store: not hooked, not faulted
        return False

    race = faults.Fault("dynamodb", "unused", frozenset({"TransactWriteItems"}), limit=1, when=placement_wins)
    plan = faults.FaultPlan(seed=13, faults=[race])

    with plan.installed():
        moved = reschedule(hooked_context(), worker, 1)

    assert moved == 1
    assert len(raced) == 1
    assert store.get_instance(instance.id).worker_id == roomy.id
    assert counts(store, source, nearly_full, roomy) == [0, 2, 1]
    assert moved_count(store, source) == 1


def test_given_no_room_in_the_pool_then_nothing_moves_and_the_instance_stays(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source, full = running_worker(pool="labs"), running_worker(pool="labs", capacity=1)
    elsewhere = running_worker(pool="other")  # room, but another pool
    place(store, full)
    instance = place(store, source)
    worker = draining(store, source.id)

    assert reschedule(hooked_context(), worker, 1) == 0

    assert store.get_instance(instance.id).worker_id == source.id
    assert counts(store, source, full, elsewhere) == [1, 1, 0]


def test_given_conflicts_that_outlast_the_backoff_then_the_instance_stays_whole(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source, target = running_worker(), running_worker()
    instance = place(store, source)
    worker = draining(store, source.id)
    plan = faults.FaultPlan(seed=14, faults=[faults.dynamodb_conflicts(1.0)])

    with plan.installed():
        moved = reschedule(hooked_context(), worker, 1)

    assert moved == 0
    assert plan.summary()[CONFLICT] >= 2
    assert store.get_instance(instance.id) == instance
    assert counts(store, source, target) == [1, 0]
    assert moved_count(store, source) == 0


def test_given_the_drain_was_cancelled_then_the_rescheduler_stops_with_drain_cancelled(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source, target = running_worker(), running_worker()
    place(store, source)
    worker = draining(store, source.id)

    with pytest.raises(DrainCancelled):
        reschedule(hooked_context(), worker, 2)  # generation 2 is not the drain on the worker

    assert counts(store, source, target) == [1, 0]


def test_given_begin_dies_after_its_first_move_when_retried_then_the_rest_moves_and_each_counts_once(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    source, target = running_worker(), running_worker()
    first, second = place(store, source), place(store, source)
    worker = draining(store, source.id)
    assert worker.drain is not None
    drain = DrainInput.of_worker(hooked_context(), source.id, worker.drain)
    # The drain is recorded already, so begin's first transaction is its first move: it dies right after
    # that move landed, as a Lambda killed mid-step would.
    plan = faults.FaultPlan(
        seed=16, faults=[faults.crash_after_writes(1, when=lambda op, _: op == "TransactWriteItems")]
    )

    with plan.installed(), pytest.raises(faults.InvocationCrashed):
        drains.begin(hooked_context(), drain)
    assert counts(store, source, target) == [1, 1]  # one move, whole
    retried = drains.begin(hooked_context(), drain)  # Step Functions retries the step

    assert retried["empty"] is True
    assert {store.get_instance(i.id).worker_id for i in (first, second)} == {target.id}
    assert counts(store, source, target) == [0, 2]
    assert moved_count(store, source) == 2
