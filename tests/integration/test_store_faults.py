"""The store under AWS semantics the emulator hides: cancelled transactions, throttling, a lagging index.

Faults are injected into the real boto3 clients (fleetkeeper_local.faults); only clients created while a
plan is installed see them, so each test builds its store or context inside `plan.installed()`.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.errors import (
    CapacityUnavailable,
    Conflict,
    DrainNoLongerActive,
    IllegalTransition,
    StaleWrite,
    Unavailable,
)
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, Instance, Worker, utcnow
from fleetkeeper.services import instances, placement, worker_exit
from fleetkeeper.services.context import Context, build_context
from fleetkeeper.settings import get_settings
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.conftest import WorkerFactory, eventually

pytestmark = pytest.mark.integration

CONFLICT = "dynamodb:TransactionCanceledException/TransactionConflict"


def hooked_store(table_name: str) -> FleetStore:
    """A store on a client created now, so an installed fault plan applies to it."""
    return FleetStore(client("dynamodb"), table_name)


def hooked_context() -> Context:
    return build_context(get_settings())


def draining(store: FleetStore, worker: Worker, generation: int = 1) -> Worker:
    now = utcnow()
    record = DrainRecord(
        generation=generation,
        started_at=now,
        deadline=now + timedelta(hours=1),
        timeout_seconds=3600,
        requested_by="test",
    )
    return store.transition_worker(
        worker, WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="test", changes={"drain": record}
    )


# ---- defect 4: a cancellation that is not a failed condition is retried, not a lost race ------------


def test_given_transient_transaction_conflicts_when_an_instance_ends_then_it_ends_and_frees_its_slot(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    plan = faults.FaultPlan(seed=4, faults=[faults.dynamodb_conflicts(1.0, limit=2)])
    with plan.installed():
        ended = hooked_store(table_name).end_instance(placed, InstanceState.COMPLETED, actor="t")
    assert ended.state is InstanceState.COMPLETED
    assert store.get_instance(placed.id).state is InstanceState.COMPLETED
    assert store.get_worker(worker.id).active_instances == 0
    assert plan.summary() == {CONFLICT: 2}


def test_given_throttled_transactions_when_an_instance_ends_then_it_ends_after_backoff(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    throttled = faults.dynamodb_throttling(1.0, limit=2, operations=frozenset({"TransactWriteItems"}))
    with faults.FaultPlan(faults=[throttled]).installed():
        hooked_store(table_name).end_instance(placed, InstanceState.COMPLETED, actor="t")
    assert store.get_worker(worker.id).active_instances == 0
    assert throttled.injected == 2


def test_given_persistent_conflicts_when_an_instance_ends_then_a_retryable_error_and_nothing_changed(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    conflicts = faults.dynamodb_conflicts(1.0)
    with faults.FaultPlan(faults=[conflicts]).installed(), pytest.raises(Unavailable) as raised:
        hooked_store(table_name).end_instance(placed, InstanceState.COMPLETED, actor="t")
    assert not isinstance(raised.value, Conflict)  # never mistaken for a lost race
    assert raised.value.code == "SERVICE_UNAVAILABLE"
    assert "TransactionConflict" in raised.value.message
    assert 1 < conflicts.injected <= 10  # bounded
    assert store.get_instance(placed.id).is_active
    assert store.get_worker(worker.id).active_instances == 1


def test_given_transient_conflicts_when_placing_by_template_then_the_instance_is_placed_not_refused(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=2)
    plan = faults.FaultPlan(seed=7, faults=[faults.dynamodb_conflicts(1.0, limit=2)])
    with plan.installed():
        placed = placement.place_instance(hooked_store(table_name), actor="t", template="lab")
    assert placed.worker_id == worker.id
    assert store.get_worker(worker.id).active_instances == 1
    assert plan.summary() == {CONFLICT: 2}


def test_given_persistent_conflicts_when_placing_then_a_retryable_error_rather_than_no_capacity(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=2)
    plan = faults.FaultPlan(faults=[faults.dynamodb_conflicts(1.0)])
    with plan.installed(), pytest.raises(Unavailable) as raised:
        placement.place_instance(hooked_store(table_name), actor="t", template="lab")
    assert not isinstance(raised.value, CapacityUnavailable)
    assert store.get_worker(worker.id).active_instances == 0


def test_given_a_full_worker_when_placing_under_conflicts_then_the_refusal_still_names_the_worker_state(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=1)
    placement.place_instance(store, actor="t", worker_id=worker.id)
    stale = store.get_worker(worker.id).model_copy(update={"active_instances": 0})
    plan = faults.FaultPlan(faults=[faults.dynamodb_conflicts(1.0, limit=1)])
    with plan.installed(), pytest.raises(Conflict) as raised:
        hooked_store(table_name).place_instance(Instance(id="i-late", worker_id=""), stale, actor="t")
    assert "full (1/1)" in raised.value.message


# ---- defects 5 and 12: an end done for a drain is conditional on that drain still running -----------


def test_given_a_drain_that_still_runs_when_ending_for_its_generation_then_the_instance_ends(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    draining(store, store.get_worker(worker.id), generation=1)
    ended = store.end_instance(
        placed, InstanceState.TERMINATED, actor="t", reason="drain_timeout", drain_generation=1
    )
    assert ended.state is InstanceState.TERMINATED
    assert store.get_worker(worker.id).active_instances == 0


def test_given_a_cancel_that_committed_first_when_a_forced_end_runs_then_drain_no_longer_active(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    drained = draining(store, store.get_worker(worker.id), generation=1)
    assert drained.drain is not None
    cancelled = drained.drain.model_copy(update={"outcome": DrainOutcome.CANCELLED})
    store.transition_worker(
        drained, WorkerStatus.RUNNING, cause=Cause.CONTROL, actor="t", changes={"drain": cancelled}
    )
    with pytest.raises(DrainNoLongerActive) as raised:
        store.end_instance(
            placed, InstanceState.TERMINATED, actor="t", reason="drain_timeout", drain_generation=1
        )
    assert raised.value.current_status == WorkerStatus.RUNNING
    assert raised.value.details()["generation"] == 1
    assert store.get_instance(placed.id).is_active
    assert store.get_worker(worker.id).active_instances == 1


def test_given_a_newer_drain_generation_when_a_forced_end_of_the_old_one_runs_then_it_is_refused(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    draining(store, store.get_worker(worker.id), generation=2)
    with pytest.raises(DrainNoLongerActive) as raised:
        store.end_instance(placed, InstanceState.TERMINATED, actor="t", drain_generation=1)
    assert "current drain is 2" in raised.value.message
    assert store.get_instance(placed.id).is_active


def test_given_a_finished_drain_when_a_forced_end_runs_then_it_is_refused(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    drained = draining(store, store.get_worker(worker.id), generation=1)
    assert drained.drain is not None
    closed = drained.drain.model_copy(update={"outcome": DrainOutcome.SUCCESS})
    store.update_worker(drained, {"drain": closed}, actor="t", action="DrainClosed")
    with pytest.raises(DrainNoLongerActive):
        store.end_instance(placed, InstanceState.TERMINATED, actor="t", drain_generation=1)
    assert store.get_instance(placed.id).is_active


# ---- defects 10 and 11: a report cannot keep an instance alive on a gone worker, and a race is retried


def test_given_a_stopped_worker_when_its_instance_reports_running_then_409_naming_the_worker_status(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    store.transition_worker(store.get_worker(worker.id), WorkerStatus.STOPPED, cause=Cause.EC2, actor="ec2")
    ctx = hooked_context()
    with pytest.raises(Conflict) as raised:
        instances.change_instance_state(ctx, placed.id, InstanceState.RUNNING, actor="workload")
    assert raised.value.entity == "worker"
    assert raised.value.current_status == WorkerStatus.STOPPED
    assert "STOPPED" in raised.value.message
    assert store.get_instance(placed.id).state is InstanceState.SCHEDULED
    assert store.get_instance(placed.id).version == placed.version


def test_given_a_draining_worker_when_its_instance_reports_running_then_the_report_is_applied(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    draining(store, store.get_worker(worker.id))
    reported = instances.change_instance_state(hooked_context(), placed.id, InstanceState.RUNNING, actor="w")
    assert reported.state is InstanceState.RUNNING


def _bump_instance_once(store: FleetStore, instance_id: str) -> Any:
    """A `when=` hook that lands a state report on the instance just before the end is sent."""
    bumped = False

    def when(_operation: str, params: dict[str, Any]) -> bool:
        nonlocal bumped
        if not bumped and f"INSTANCE#{instance_id}" in json.dumps(params):
            bumped = True
            current = store.get_instance(instance_id)
            store.update_instance(
                current, {"state": InstanceState.RUNNING}, actor="workload", action="InstanceRunning"
            )
        return False  # never inject: the interleaved write is the fault

    return when


def test_given_a_state_report_racing_a_retirement_when_lost_instances_end_then_the_instance_still_ends(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    retired = store.transition_worker(
        store.get_worker(worker.id), WorkerStatus.TERMINATED, cause=Cause.EC2, actor="ec2"
    )
    race = faults.Fault(
        "dynamodb",
        "TransactionCanceledException/TransactionConflict",
        frozenset({"TransactWriteItems"}),
        when=_bump_instance_once(store, placed.id),
    )
    with faults.FaultPlan(faults=[race]).installed():
        ended = worker_exit.end_lost_instances(hooked_context(), retired, actor="ec2")
    assert ended == 1
    final = store.get_instance(placed.id)
    assert final.state is InstanceState.TERMINATED
    assert final.version == placed.version + 2  # the report, then the end
    assert store.get_worker(worker.id).active_instances == 0
    assert store.active_instances_of(worker.id) == []


def test_given_a_state_report_racing_an_end_report_then_the_end_is_retried_on_a_fresh_read(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    race = faults.Fault(
        "dynamodb",
        "TransactionCanceledException/TransactionConflict",
        frozenset({"TransactWriteItems"}),
        when=_bump_instance_once(store, placed.id),
    )
    with faults.FaultPlan(faults=[race]).installed():
        ended = instances.change_instance_state(
            hooked_context(), placed.id, InstanceState.COMPLETED, actor="w"
        )
    assert ended.state is InstanceState.COMPLETED
    assert store.get_worker(worker.id).active_instances == 0


def test_given_an_instance_that_really_ended_when_lost_instances_end_then_it_is_not_counted(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    first = placement.place_instance(store, actor="t", worker_id=worker.id)
    placement.place_instance(store, actor="t", worker_id=worker.id)
    retired = store.transition_worker(
        store.get_worker(worker.id), WorkerStatus.TERMINATED, cause=Cause.EC2, actor="ec2"
    )
    stale_copy = store.get_instance(first.id)
    store.end_instance(stale_copy, InstanceState.COMPLETED, actor="workload")
    assert (
        instances.end_active_instance(hooked_context(), stale_copy, InstanceState.TERMINATED, actor="t")
        is None
    )
    assert worker_exit.end_lost_instances(hooked_context(), retired, actor="ec2") == 1
    assert store.get_instance(first.id).state is InstanceState.COMPLETED
    assert store.get_worker(worker.id).active_instances == 0


# ---- defect 7: exact decisions do not depend on a lagging index -------------------------------------


def test_given_a_lagging_index_when_an_instance_was_just_placed_then_active_instances_of_finds_it(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=3)
    plan = faults.FaultPlan(index_lag_seconds=5)
    with plan.installed():
        lagging = hooked_store(table_name)
        first = placement.place_instance(lagging, actor="t", worker_id=worker.id)
        # A worker write in between must keep the worker's list of active instances.
        lagging.update_worker(lagging.get_worker(worker.id), {"capacity": 4}, actor="t", action="Resized")
        second = placement.place_instance(lagging, actor="t", worker_id=worker.id)
        assert lagging.list_instances(worker_id=worker.id).items == []  # the index has not caught up
        assert [i.id for i in lagging.active_instances_of(worker.id)] == sorted([first.id, second.id])
        lagging.end_instance(first, InstanceState.COMPLETED, actor="t")
        assert [i.id for i in lagging.active_instances_of(worker.id)] == [second.id]
    assert plan.hidden_by_lag >= 1


def test_given_workers_stored_by_earlier_releases_then_active_instances_of_still_finds_every_instance(
    store: FleetStore, running_worker: WorkerFactory, dynamodb: Any
) -> None:
    worker = running_worker(capacity=4)
    in_set, unnamed = (placement.place_instance(store, actor="t", worker_id=worker.id) for _ in range(2))
    worker_key = {"PK": {"S": f"WORKER#{worker.id}"}, "SK": {"S": "WORKER"}}
    # One release named active instances in a set on the worker item; one before it nowhere.
    for instance in (in_set, unnamed):
        dynamodb.delete_item(
            TableName=store.table_name,
            Key={"PK": {"S": f"WORKER#{worker.id}"}, "SK": {"S": f"SLOT#{instance.id}"}},
        )
    dynamodb.update_item(
        TableName=store.table_name,
        Key=worker_key,
        UpdateExpression="ADD active_instance_ids :id",
        ExpressionAttributeValues={":id": {"SS": [in_set.id]}},
    )
    recent = placement.place_instance(store, actor="t", worker_id=worker.id)

    assert [i.id for i in store.active_instances_of(worker.id)] == sorted([in_set.id, unnamed.id, recent.id])
    store.end_instance(in_set, InstanceState.COMPLETED, actor="t")
    store.end_instance(unnamed, InstanceState.COMPLETED, actor="t")
    assert [i.id for i in store.active_instances_of(worker.id)] == [recent.id]
    assert store.get_worker(worker.id).active_instances == 1
    # The earlier release's set empties as its instances end (DynamoDB drops an empty set).
    assert "active_instance_ids" not in dynamodb.get_item(TableName=store.table_name, Key=worker_key)["Item"]


def test_given_a_stale_copy_when_ending_then_stale_write_names_the_state_now(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    store.end_instance(placed, InstanceState.COMPLETED, actor="t")
    with pytest.raises(StaleWrite) as raised:
        store.end_instance(placed, InstanceState.TERMINATED, actor="t")
    assert raised.value.current_status == InstanceState.COMPLETED


# ---- a write that landed but whose answer was lost is not reported as a conflict --------------------


def lost_answer() -> faults.Fault:
    return faults.Fault(
        "dynamodb", "InternalServerError", frozenset({"TransactWriteItems"}), status=500, after=True, limit=1
    )


def test_given_a_lost_answer_when_placing_then_the_retry_recognises_its_own_write(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=2)
    fault = lost_answer()
    with faults.FaultPlan(faults=[fault]).installed():
        placed = placement.place_instance(hooked_store(table_name), actor="t", template="lab")
    assert fault.injected == 1
    assert store.get_instance(placed.id).worker_id == worker.id
    assert store.get_worker(worker.id).active_instances == 1  # one slot taken, not two


def test_given_a_lost_answer_when_ending_then_the_retry_recognises_its_own_write(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=2)
    placed = placement.place_instance(store, actor="t", worker_id=worker.id)
    placement.place_instance(store, actor="t", worker_id=worker.id)
    fault = lost_answer()
    with faults.FaultPlan(faults=[fault]).installed():
        ended = hooked_store(table_name).end_instance(placed, InstanceState.COMPLETED, actor="t")
    assert fault.injected == 1
    assert ended.state is InstanceState.COMPLETED
    assert store.get_worker(worker.id).active_instances == 1  # freed once


def test_given_a_lost_answer_when_a_worker_moves_then_the_retry_recognises_its_own_write(
    store: FleetStore, running_worker: WorkerFactory, table_name: str
) -> None:
    worker = running_worker(capacity=2)
    fault = lost_answer()
    with faults.FaultPlan(faults=[fault]).installed():
        moved = hooked_store(table_name).transition_worker(
            worker, WorkerStatus.STOPPING, cause=Cause.CONTROL, actor="t"
        )
    assert fault.injected == 1
    assert store.get_worker(worker.id) == moved


def test_given_reports_in_a_loop_when_the_worker_is_retired_then_no_instance_stays_active(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(capacity=3)
    placed = [placement.place_instance(store, actor="t", worker_id=worker.id) for _ in range(3)]
    ctx = hooked_context()
    stop = threading.Event()
    outcomes: Counter[str] = Counter()

    def report() -> None:
        states = [InstanceState.RUNNING, InstanceState.INSTANTIATING]
        n = 0
        while not stop.is_set():
            n += 1
            try:
                instances.change_instance_state(ctx, placed[n % 3].id, states[n % 2], actor="workload")
                outcomes["applied"] += 1
            except (Conflict, IllegalTransition):
                outcomes["refused"] += 1

    reporter = threading.Thread(target=report)
    reporter.start()
    try:
        eventually(lambda: outcomes["applied"] >= 3, timeout=30)
        worker_exit.retire_worker(
            ctx, store.get_worker(worker.id), cause=Cause.EC2, actor="ec2", reason="machine terminated"
        )
        eventually(lambda: outcomes["refused"] >= 3, timeout=30)
    finally:
        stop.set()
        reporter.join(timeout=10)
    assert outcomes["applied"] > 0
    assert outcomes["refused"] > 0  # reports after the retirement lost
    assert all(not store.get_instance(i.id).is_active for i in placed)
    assert store.get_worker(worker.id).active_instances == 0
    assert store.active_instances_of(worker.id) == []
