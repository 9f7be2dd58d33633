"""The worker counters stay exact: under concurrent transitions and health changes on DynamoDB Local,
under transactions cancelled by a concurrent one, under answers lost after the write landed, and for a
worker an earlier release stored without counting it (or without counting it among the unhealthy)."""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.repair import HealthSource, HealthStatus, Signal, observe
from fleetkeeper.services import workers
from fleetkeeper.store import keys
from fleetkeeper.store.counters import COUNTED_AS, counter_updates
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults

pytestmark = pytest.mark.integration

THREADS = 8
MOVES_PER_THREAD = 15
# RUNNING <-> DRAINING: a drain and its cancel, the two moves the reconciler and the API make most.
NEXT = {WorkerStatus.RUNNING: WorkerStatus.DRAINING, WorkerStatus.DRAINING: WorkerStatus.RUNNING}


def truth(store: FleetStore, fleet: list[Worker]) -> FleetCounts:
    """What the counters must say: every worker read consistently from its own item."""
    return FleetCounts.of(store.get_workers([w.id for w in fleet]))


def fleet_of(running_worker: Any, size: int) -> list[Worker]:
    # Two pools and two templates: four scopes, so moves of several counter items run at once.
    return [running_worker(template=f"lab{n % 2}", pool=f"pool{n % 3 % 2}") for n in range(size)]


def move(store: FleetStore, worker_id: str) -> bool:
    """One status change from a fresh read; False when another writer won the race."""
    current = store.get_worker(worker_id)
    try:
        store.transition_worker(current, NEXT[current.status], cause=Cause.CONTROL, actor="mover")
    except Conflict:
        return False
    return True


def test_given_8_threads_moving_workers_between_statuses_then_every_count_is_exact(store, running_worker):
    fleet = fleet_of(running_worker, 12)
    rolls = random.Random(7)
    picks = [[rolls.choice(fleet).id for _ in range(MOVES_PER_THREAD)] for _ in range(THREADS)]
    landed: Counter[bool] = Counter()
    lock = threading.Lock()

    def mover(ids: list[str]) -> None:
        for worker_id in ids:
            won = move(store, worker_id)
            with lock:
                landed[won] += 1

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        list(pool.map(mover, picks))

    assert landed[True] > THREADS * MOVES_PER_THREAD // 2
    assert store.fleet_counts() == truth(store, fleet)


def test_given_cancelled_transactions_and_lost_answers_then_no_count_is_lost_or_counted_twice(
    store, running_worker
):
    fleet = fleet_of(running_worker, 6)
    plan = faults.FaultPlan(
        seed=3,
        faults=[
            faults.dynamodb_conflicts(0.3),
            # The transaction committed, the answer never came: the retry must not count it again.
            faults.Fault(
                "dynamodb",
                "InternalServerError",
                frozenset({"TransactWriteItems"}),
                0.3,
                status=500,
                after=True,
            ),
        ],
    )

    with plan.installed():
        plan_store = FleetStore(client("dynamodb"), store.table_name)
        created = [
            workers.create_worker(plan_store, template="lab0", region="us-east-1", actor="t")
            for _ in range(4)
        ]
        for worker in fleet * 5:
            move(plan_store, worker.id)

    assert plan.injected["dynamodb:TransactionCanceledException/TransactionConflict"] > 0
    assert plan.injected["dynamodb:InternalServerError"] > 0
    assert store.fleet_counts() == truth(store, [*fleet, *created])


def test_given_a_worker_an_earlier_release_stored_uncounted_then_its_first_change_counts_it_once(
    store, running_worker
):
    counted = running_worker()
    legacy = running_worker()
    # As the earlier release left it: no counted_as, and no count in any cell.
    store._client.update_item(
        TableName=store.table_name,
        Key={"PK": {"S": keys.worker_key(legacy.id)["PK"]}, "SK": {"S": "WORKER"}},
        UpdateExpression="REMOVE #ca",
        ExpressionAttributeNames={"#ca": COUNTED_AS},
    )
    uncount = {keys.counted_cell(legacy): -1}
    store._client.transact_write_items(TransactItems=counter_updates(store.table_name, legacy.id, uncount))
    assert store.fleet_counts().by_status[WorkerStatus.RUNNING] == 1

    store.transition_worker(
        store.get_worker(legacy.id), WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="t"
    )

    assert store.fleet_counts() == truth(store, [counted, legacy])


def test_given_health_changes_racing_status_changes_then_the_unhealthy_counts_are_exact(
    store, running_worker
):
    fleet = fleet_of(running_worker, 8)
    rolls = random.Random(11)
    picks = [[rolls.choice(fleet).id for _ in range(MOVES_PER_THREAD // 2)] for _ in range(THREADS)]

    def sicken_or_heal(worker_id: str) -> None:
        current = store.get_worker(worker_id)
        sick = current.health is None or not current.health.unhealthy
        status = HealthStatus.UNHEALTHY if sick else HealthStatus.HEALTHY
        health = observe(current.health, Signal(status, HealthSource.REPORTED, "flapping"), utcnow())
        # Another writer may win the race: the next pick reads again.
        with contextlib.suppress(Conflict):
            store.update_worker(current, {"health": health}, actor="agent", action="WorkerHealthChanged")

    def writer(index: int, ids: list[str]) -> None:
        for worker_id in ids:
            if index % 2:
                sicken_or_heal(worker_id)
            else:
                move(store, worker_id)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        list(pool.map(writer, range(THREADS), picks))

    counts = store.fleet_counts()
    assert sum(counts.unhealthy.values()) == sum(
        1 for w in store.get_workers([w.id for w in fleet]) if w.health is not None and w.health.unhealthy
    )
    assert counts == truth(store, fleet)


def test_given_a_worker_counted_healthy_while_unhealthy_then_its_next_write_counts_it_among_them(
    store, running_worker
):
    worker = running_worker(pool="labs")
    sick = observe(None, Signal(HealthStatus.UNHEALTHY, HealthSource.REPORTED, "disk full"), utcnow())
    worker = store.update_worker(worker, {"health": sick}, actor="agent", action="WorkerHealthChanged")
    counted_plain(store, worker)
    assert store.fleet_counts().in_pool("labs") == ({WorkerStatus.RUNNING: 1}, {})

    store.transition_worker(
        store.get_worker(worker.id), WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="t"
    )

    assert store.fleet_counts().in_pool("labs") == ({WorkerStatus.DRAINING: 1}, {WorkerStatus.DRAINING: 1})


def counted_plain(store: FleetStore, worker: Worker) -> None:
    """Count an unhealthy worker as an earlier release left it: in its status's cell, not among the
    unhealthy ones."""
    healthy_cell = keys.counted_cell(worker).replace(keys.UNHEALTHY_MARK, "")
    store._client.update_item(
        TableName=store.table_name,
        Key={"PK": {"S": keys.worker_key(worker.id)["PK"]}, "SK": {"S": "WORKER"}},
        UpdateExpression="SET #ca = :cell",
        ExpressionAttributeNames={"#ca": COUNTED_AS},
        ExpressionAttributeValues={":cell": {"S": healthy_cell}},
    )
    moves: list[Any] = counter_updates(
        store.table_name, worker.id, {keys.counted_cell(worker): -1, healthy_cell: 1}
    )
    store._client.transact_write_items(TransactItems=moves)


def test_given_sick_workers_counted_healthy_then_counting_the_pools_health_moves_them_once_and_marks_it(
    store: FleetStore, running_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = [running_worker(pool="labs") for _ in range(4)]
    report = Signal(HealthStatus.UNHEALTHY, HealthSource.REPORTED, "disk full")
    sick = [
        store.update_worker(w, {"health": observe(None, report, utcnow())}, actor="agent", action="sick")
        for w in fleet[:3]
    ]
    for worker in sick:
        counted_plain(store, worker)
    assert store.fleet_counts().in_pool("labs")[1] == {}
    # A writer heals the third worker between the walk's read and its move: its own write counts it.
    read = store._batch_get_items

    def read_then_heal(*args: Any, **kwargs: Any) -> list[dict[str, Any]]:
        items = read(*args, **kwargs)
        current = store.get_worker(sick[2].id)
        healed = observe(current.health, Signal(HealthStatus.HEALTHY, HealthSource.REPORTED), utcnow())
        store.update_worker(current, {"health": healed}, actor="agent", action="healed")
        return items

    monkeypatch.setattr(store, "_batch_get_items", read_then_heal)
    assert store.count_health("labs") is None  # refused once: no mark, the next cycle walks again
    monkeypatch.undo()
    assert store.fleet_counts() == truth(store, fleet)
    assert store.fleet_counts().in_pool("labs")[1] == {WorkerStatus.RUNNING: 2}

    assert store.count_health("labs") == 0  # every member where it belongs now: the pool is marked
    monkeypatch.setattr(store, "workers_in_pool", lambda pool: pytest.fail(f"{pool} walked again"))
    assert store.count_health("labs") == 0
