"""The reconcile cycle's drain sweep: Step Functions called only when due, inside the time budget.

Step Functions answers through the fault layer (a DescribeExecution that says RUNNING, a heartbeat that
is accepted) so that the drains can be many and their clocks chosen; the calls are counted through a
botocore hook.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainRecord, Instance, Worker, utcnow
from fleetkeeper.services.context import Context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.aws_calls import CallCount, aws_calls
from tests.integration.functions import reconcile_fleet, sweep_waiting_drains
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory

pytestmark = pytest.mark.integration

ARN_PREFIX = "arn:aws:states:us-east-1:123456789012:execution:fleetkeeper-drain:"
HEARTBEAT = 300  # DRAIN_HEARTBEAT_SECONDS: a heartbeat is due 150 s after the last one
WATCHDOG = 300  # DRAIN_WATCHDOG_INTERVAL_SECONDS


def open_drain(store: FleetStore, worker: Worker, *, started: datetime, waiting: bool = True) -> Worker:
    """The worker DRAINING, its drain RUNNING and waiting on a token, with one instance still active."""
    busy = store.place_instance(Instance(id=f"inst-{worker.id}", worker_id=""), worker, actor="test")
    current = store.get_worker(busy.worker_id)
    record = DrainRecord(
        generation=1,
        started_at=started,
        deadline=started + timedelta(hours=4),
        timeout_seconds=4 * 3600,
        requested_by="op",
        execution_arn=f"{ARN_PREFIX}drain-{worker.id}-g1",
        task_token=f"token-{worker.id}" if waiting else None,
    )
    return store.transition_worker(
        current, WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="op", changes={"drain": record}
    )


@contextmanager
def step_functions_answering() -> Iterator[CallCount]:
    """Counted AWS calls, with every execution RUNNING and every heartbeat accepted."""
    running = faults.Fault(
        "stepfunctions",
        "Running",
        frozenset({"DescribeExecution"}),
        lost=True,
        lost_response={"status": "RUNNING", "executionArn": ARN_PREFIX + "any"},
    )
    accepted = faults.Fault("stepfunctions", "Accepted", frozenset({"SendTaskHeartbeat"}), lost=True)
    with aws_calls() as calls, faults.FaultPlan(faults=[running, accepted]).installed():
        yield calls


class Budget:
    """`time_left` for a sweep that has time for `tasks` drains, then none (thread-safe)."""

    def __init__(self, tasks: int) -> None:
        self._left = tasks
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self._left -= 1
            return 60.0 if self._left >= 0 else 0.0


@pytest.fixture
def sweep_ctx(make_ctx: ContextFactory) -> Callable[[], Context]:
    return lambda: make_ctx(
        DRAIN_HEARTBEAT_SECONDS=str(HEARTBEAT), DRAIN_WATCHDOG_INTERVAL_SECONDS=str(WATCHDOG)
    )


def test_given_open_drains_then_describe_waits_for_the_interval_and_a_heartbeat_until_it_is_due(
    store: FleetStore, running_worker: Callable[..., Worker], sweep_ctx: Callable[[], Context]
) -> None:
    t0 = utcnow()
    workers = [open_drain(store, running_worker(), started=t0 - timedelta(minutes=2)) for _ in range(3)]

    def sweep(at: datetime) -> tuple[dict[str, int], int, int]:
        with step_functions_answering() as calls:
            swept = sweep_waiting_drains(sweep_ctx(), now=at)
        return swept, calls.of("sfn", "DescribeExecution"), calls.of("sfn", "SendTaskHeartbeat")

    first = sweep(t0)
    a_cycle_later = sweep(t0 + timedelta(seconds=60))
    heartbeats_due = sweep(t0 + timedelta(seconds=180))
    describes_due = sweep(t0 + timedelta(seconds=300))
    heartbeats_again = sweep(t0 + timedelta(seconds=360))

    assert first[1:] == (3, 3)
    assert (first[0]["running"], first[0]["heartbeats"]) == (3, 3)
    assert a_cycle_later[1:] == (0, 0)
    assert a_cycle_later[0]["not_due"] == 3
    assert heartbeats_due[1:] == (0, 3)
    assert describes_due[1:] == (3, 0)
    assert heartbeats_again[1:] == (0, 3)
    # A new waiting task (a new token after a re-check) gets its heartbeat at once.
    renewed = store.get_worker(workers[0].id)
    assert renewed.drain is not None
    store.update_worker(
        renewed,
        {"drain": renewed.drain.model_copy(update={"task_token": "token-renewed"})},
        actor="drain-workflow",
        action="DrainTokenStored",
    )
    assert sweep(t0 + timedelta(seconds=370))[1:] == (0, 1)


def test_given_a_budget_for_two_drains_then_the_rest_is_deferred_and_the_next_sweep_checks_it(
    store: FleetStore, running_worker: Callable[..., Worker], sweep_ctx: Callable[[], Context]
) -> None:
    t0 = utcnow()
    workers = [open_drain(store, running_worker(), started=t0 - timedelta(minutes=2)) for _ in range(6)]

    with step_functions_answering() as calls:
        short = sweep_waiting_drains(sweep_ctx(), now=t0, time_left=Budget(2))
    assert (short["deferred"], short["running"]) == (4, 2)
    assert calls.of("sfn", "DescribeExecution") == 2
    described_first = {w.id for w in workers if store.drain_marks([("worker", w.id)])}
    assert len(described_first) == 2

    with step_functions_answering() as calls:
        rest = sweep_waiting_drains(sweep_ctx(), now=t0 + timedelta(seconds=60))
    assert (rest["deferred"], rest["running"]) == (0, 4)
    assert calls.of("sfn", "DescribeExecution") == 4
    assert all(store.drain_marks([("worker", w.id)]) for w in workers)


def test_given_drains_checked_at_different_times_when_the_budget_is_short_then_the_oldest_go_first(
    store: FleetStore, running_worker: Callable[..., Worker], sweep_ctx: Callable[[], Context]
) -> None:
    t0 = utcnow()
    early = [
        open_drain(store, running_worker(), started=t0 - timedelta(minutes=2), waiting=False)
        for _ in range(3)
    ]
    with step_functions_answering():
        sweep_waiting_drains(sweep_ctx(), now=t0)
    late = [
        open_drain(store, running_worker(), started=t0 - timedelta(minutes=2), waiting=False)
        for _ in range(3)
    ]
    with step_functions_answering():
        sweep_waiting_drains(sweep_ctx(), now=t0 + timedelta(seconds=100))

    with step_functions_answering():
        swept = sweep_waiting_drains(sweep_ctx(), now=t0 + timedelta(seconds=450), time_left=Budget(3))

    assert (swept["running"], swept["deferred"]) == (3, 3)
    described = {
        key: mark.described_at
        for (_, key), mark in store.drain_marks([("worker", w.id) for w in early + late]).items()
    }
    assert {w.id for w in early if described[w.id] == t0 + timedelta(seconds=450)} == {w.id for w in early}
    assert all(described[w.id] == t0 + timedelta(seconds=100) for w in late)


def test_given_a_cycle_with_no_time_left_for_the_sweep_then_it_defers_counts_and_the_next_cycle_checks(
    store: FleetStore, live_worker: LiveWorkerFactory, sweep_ctx: Callable[[], Context]
) -> None:
    t0 = utcnow()
    workers = [open_drain(store, live_worker(), started=t0 - timedelta(minutes=2)) for _ in range(4)]

    with step_functions_answering() as calls:
        ctx = sweep_ctx()
        starved = reconcile_fleet(ctx, time_left=lambda: 4.0)
    assert starved.counters["drain_sweep_deferred"] == 4
    assert calls.of("sfn", "DescribeExecution", "SendTaskHeartbeat") == 0
    assert ctx.stats.read("reconcile").counters["drain_sweep_deferred"] == 4

    with step_functions_answering() as calls:
        ctx = sweep_ctx()
        served = reconcile_fleet(ctx)
    assert served.counters["drain_sweep_deferred"] == 0
    assert served.counters["drain_heartbeats"] == 4
    assert calls.of("sfn", "DescribeExecution") == 4
    assert {key for _, key in store.drain_marks([("worker", w.id) for w in workers])} == {
        w.id for w in workers
    }
