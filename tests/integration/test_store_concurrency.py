"""Concurrent writers on DynamoDB Local: no over-fill, no placement after a drain, one winner per race."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import Instance, Worker
from fleetkeeper.store.repository import FleetStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

THREADS = 8
# Each thread's attempts, half before the drain and half after: the races are at the drain, so more
# attempts on either side add time, not cases.
ATTEMPTS = 60
CAPACITY = 10
# Between two samples of the worker: an over-fill lasts until an end frees the slot, so a sampler that
# spins only takes the GIL from the placing threads.
SAMPLE_INTERVAL_SECONDS = 0.005


def start_drain(store: FleetStore, worker_id: str) -> None:
    """What a drain's begin step does: re-read and retry until the conditional write wins."""
    while True:
        current = store.get_worker(worker_id)
        try:
            store.transition_worker(current, WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="drainer")
            return
        except Conflict:
            continue


def test_given_8_threads_placing_while_a_drain_starts_then_no_overfill_and_no_placement_after_drain(
    store, running_worker
):
    worker = running_worker(capacity=CAPACITY)
    drained_at: list[float] = []
    outcomes: list[tuple[float, bool]] = []
    outcomes_lock = threading.Lock()
    overfills: list[int] = []
    stop_sampling = threading.Event()

    def place_and_churn(thread: int) -> None:
        mine: list[Instance] = []
        for attempt in range(ATTEMPTS):
            if thread == 0 and attempt == ATTEMPTS // 2:
                start_drain(store, worker.id)
                drained_at.append(time.monotonic())
            started = time.monotonic()
            try:
                mine.append(
                    store.place_instance(
                        Instance(id=f"i-{thread}-{attempt}", worker_id=""), worker, actor=f"thread-{thread}"
                    )
                )
                placed = True
            except Conflict:
                placed = False
            with outcomes_lock:
                outcomes.append((started, placed))
            # Free a slot now and then so placements keep competing for room until the drain.
            if len(mine) >= 2:
                store.end_instance(mine.pop(0), InstanceState.COMPLETED, actor=f"thread-{thread}")

    def sample() -> None:
        while not stop_sampling.wait(SAMPLE_INTERVAL_SECONDS):
            current = store.get_worker(worker.id)
            if current.active_instances > current.capacity:
                overfills.append(current.active_instances)

    sampler = threading.Thread(target=sample)
    sampler.start()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(place_and_churn, range(THREADS)))
    stop_sampling.set()
    sampler.join()

    assert len(outcomes) == THREADS * ATTEMPTS
    assert drained_at, "the drain never started"
    placed_before = [t for t, ok in outcomes if ok and t < drained_at[0]]
    placed_after = [t for t, ok in outcomes if ok and t > drained_at[0]]
    assert placed_before, "no placement ever succeeded: the test proved nothing"
    assert placed_after == []
    assert overfills == []

    final = store.get_worker(worker.id)
    assert final.status is WorkerStatus.DRAINING
    active_items = store.active_instances_of(worker.id)
    assert final.active_instances == len(active_items) <= CAPACITY


def test_given_two_writers_with_the_same_read_then_exactly_one_wins(store, running_worker):
    worker = running_worker()
    barrier = threading.Barrier(2)
    results: dict[WorkerStatus, Worker | Conflict] = {}

    def write(target: WorkerStatus) -> None:
        barrier.wait()
        try:
            results[target] = store.transition_worker(worker, target, cause=Cause.CONTROL, actor=str(target))
        except Conflict as conflict:
            results[target] = conflict

    threads = [
        threading.Thread(target=write, args=(t,)) for t in (WorkerStatus.DRAINING, WorkerStatus.STOPPING)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    conflicts = [r for r in results.values() if isinstance(r, Conflict)]
    winners = [r for r in results.values() if isinstance(r, Worker)]
    assert len(winners) == 1
    assert len(conflicts) == 1
    stored = store.get_worker(worker.id)
    assert conflicts[0].current_status == stored.status
    assert stored.status == winners[0].status
    assert stored.version == worker.version + 1
