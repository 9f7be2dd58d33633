"""The drain Lambda dies before or after its write, at every step: each drain still ends once and right.

Each test drains two targets side by side: one whose step crashes before its handler runs (nothing
written), one whose step crashes after the handler ran (its writes landed, Step Functions never heard).
Step Functions retries the step; the retry must find the work done, do nothing twice, and move on.
"""

from __future__ import annotations

from datetime import timedelta
from functools import partial
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import utcnow
from tests.integration.conftest import ControlPlane, WorkerFactory, eventually
from tests.integration.faults.support import (
    RUNS_AFTER_ONE_CRASH,
    assert_drained_once,
    audit_actions,
    complete,
    crash,
    drain,
    drain_pool,
    place,
    runs,
    token_stored,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POSITIONS = {"before": False, "after": True}


def retried_and_waiting(plane: ControlPlane, worker_id: str) -> bool:
    """The crashed await-empty was retried and the retry stored its own token (the first one is dead)."""
    return runs(plane, "await_empty", worker_id) == RUNS_AFTER_ONE_CRASH and token_stored(plane, worker_id)


def pool_waiting(plane: ControlPlane, pool: str) -> bool:
    return bool(plane.ctx.store.get_pool(pool).drain_task_token)


def pool_retried_and_waiting(plane: ControlPlane, pool: str) -> bool:
    return runs(plane, "pool_await_empty", pool) == RUNS_AFTER_ONE_CRASH and pool_waiting(plane, pool)


def stopping(plane: ControlPlane, worker_id: str) -> bool:
    return plane.ctx.store.get_worker(worker_id).status is WorkerStatus.STOPPING


def test_given_begin_crashes_before_or_after_its_write_then_both_drains_finish_once(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    workers = {position: ec2_worker() for position in POSITIONS}
    for position, worker in workers.items():
        crash(control_plane, "begin", worker.id, after=POSITIONS[position])

    started = {position: drain(control_plane, w.id) for position, w in workers.items()}

    for position, worker in workers.items():
        assert_drained_once(control_plane, ec2, worker, started[position]["execution_arn"])
        assert runs(control_plane, "begin", worker.id) == RUNS_AFTER_ONE_CRASH
    assert control_plane.dispatcher.crash_count(step="begin") == 2


def test_given_await_empty_crashes_before_or_after_storing_its_token_then_the_last_end_still_finishes(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    workers = {position: ec2_worker() for position in POSITIONS}
    instances = {position: place(control_plane, worker_id=w.id) for position, w in workers.items()}
    for position, worker in workers.items():
        crash(control_plane, "await_empty", worker.id, after=POSITIONS[position])

    started = {position: drain(control_plane, w.id, reschedule=False) for position, w in workers.items()}
    for worker in workers.values():
        eventually(partial(retried_and_waiting, control_plane, worker.id))
    for instance in instances.values():
        complete(control_plane, instance["id"])

    for position, worker in workers.items():
        assert_drained_once(control_plane, ec2, worker, started[position]["execution_arn"])
        assert (
            control_plane.ctx.store.get_instance(instances[position]["id"]).state is InstanceState.COMPLETED
        )
        assert "Force" not in control_plane.states_entered(started[position]["execution_arn"])


def test_given_recheck_crashes_before_or_after_it_ran_then_the_lost_signal_is_still_recovered(
    control_plane_factory: Any, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    plane: ControlPlane = control_plane_factory(heartbeat_seconds=2)
    workers = {position: ec2_worker() for position in POSITIONS}
    instances = {position: place(plane, worker_id=w.id) for position, w in workers.items()}
    for position, worker in workers.items():
        crash(plane, "recheck", worker.id, after=POSITIONS[position])
    # A 10-minute timeout keeps the re-check heartbeat at the configured 2 s (a longer drain stretches it).
    started = {
        position: drain(plane, w.id, reschedule=False, timeout_seconds=600) for position, w in workers.items()
    }
    store = plane.ctx.store
    for position, worker in workers.items():
        # Waiting, and past the await step's own count: from now on only a re-check can see it empty.
        eventually(partial(plane.dispatcher.has_returned, "await_empty", worker.id))
        # Ended behind the service's back: no token is sent, only the heartbeat re-check can notice.
        store.end_instance(store.get_instance(instances[position]["id"]), InstanceState.COMPLETED, actor="t")

    for position, worker in workers.items():
        assert_drained_once(plane, ec2, worker, started[position]["execution_arn"])
        assert runs(plane, "recheck", worker.id) >= RUNS_AFTER_ONE_CRASH
        assert "Force" not in plane.states_entered(started[position]["execution_arn"])
    assert plane.dispatcher.crash_count(step="recheck") == 2


def test_given_force_crashes_before_or_after_terminating_then_each_instance_is_forced_once(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    workers = {position: ec2_worker() for position in POSITIONS}
    stuck = {position: place(control_plane, worker_id=w.id) for position, w in workers.items()}
    for position, worker in workers.items():
        crash(control_plane, "force", worker.id, after=POSITIONS[position])

    started = {
        position: drain(control_plane, w.id, timeout_seconds=2, reschedule=False)
        for position, w in workers.items()
    }

    store = control_plane.ctx.store
    for position, worker in workers.items():
        assert_drained_once(
            control_plane, ec2, worker, started[position]["execution_arn"], outcome="TIMED_OUT"
        )
        instance = store.get_instance(stuck[position]["id"])
        assert (instance.state, instance.reason) == (InstanceState.TERMINATED, "drain_timeout")
        record = store.get_worker(worker.id).drain
        assert record is not None
        assert record.forced_instances == 1  # the retry found nothing left to force and counted nothing
        assert runs(control_plane, "force", worker.id) == RUNS_AFTER_ONE_CRASH
        assert store.get_worker(worker.id).active_instances == 0
        forced = audit_actions(control_plane, "instance", instance.id)
        assert len([a for a in forced if "Terminated" in a]) == 1


def test_given_finish_crashes_before_or_after_stopping_then_the_worker_is_stopped_once(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    workers = {position: ec2_worker() for position in POSITIONS}
    for position, worker in workers.items():
        crash(control_plane, "finish", worker.id, after=POSITIONS[position])

    started = {position: drain(control_plane, w.id) for position, w in workers.items()}

    for position, worker in workers.items():
        assert_drained_once(control_plane, ec2, worker, started[position]["execution_arn"])
        assert runs(control_plane, "finish", worker.id) == RUNS_AFTER_ONE_CRASH
        assert audit_actions(control_plane, "worker", worker.id).count("WorkerStopping") <= 1


def test_given_record_error_crashes_before_or_after_its_write_then_the_drain_still_ends_in_error(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    """An execution whose worker stopped before it began fails in begin; RecordError must record it."""
    store = control_plane.ctx.store
    workers = {position: ec2_worker() for position in POSITIONS}
    arns = {}
    for position, worker in workers.items():
        store.transition_worker(
            store.get_worker(worker.id), WorkerStatus.STOPPING, cause=Cause.EC2, actor="t"
        )
        crash(control_plane, "record_error", worker.id, after=POSITIONS[position])
        now = utcnow()
        arns[position] = control_plane.ctx.workflows.start(
            f"drain-{worker.id}-g1",
            {
                "kind": "worker",
                "worker_id": worker.id,
                "generation": 1,
                "timeout_seconds": 60,
                "started_at": now.isoformat(),
                "deadline": (now + timedelta(seconds=60)).isoformat(),
                "requested_by": "t",
                "then": "stop",
                "heartbeat_seconds": 30,
            },
        )

    for position, worker in workers.items():
        assert control_plane.wait_for_execution(arns[position], timeout=30)["status"] == "FAILED"
        final = store.get_worker(worker.id)
        assert final.status is WorkerStatus.STOPPING  # a failed drain never moves the worker
        assert final.drain is not None
        assert (final.drain.generation, final.drain.outcome.value) == (1, "ERROR")
        assert "DrainNotStartable" in (final.drain.error or "")
        assert runs(control_plane, "record_error", worker.id) == RUNS_AFTER_ONE_CRASH
        assert audit_actions(control_plane, "worker", worker.id).count("WorkerDrainFailed") == 1


# ---- pool drains -----------------------------------------------------------------------------------


def pools_with_workers(ec2_worker: WorkerFactory, prefix: str) -> dict[str, str]:
    """One pool (with one worker) per crash position; returns position -> pool name."""
    pools = {position: f"{prefix}-{position}" for position in POSITIONS}
    for pool in pools.values():
        ec2_worker(pool=pool)
    return pools


def assert_pool_drained(plane: ControlPlane, pool: str, execution_arn: str, outcome: str = "SUCCESS") -> None:
    assert plane.wait_for_execution(execution_arn, timeout=30)["status"] == "SUCCEEDED"
    final = plane.ctx.store.get_pool(pool)
    assert (final.status, final.drain_outcome and final.drain_outcome.value) == (PoolStatus.INACTIVE, outcome)
    assert final.drain_task_token is None
    completed = [
        a for a in audit_actions(plane, "pool", pool) if a in ("PoolDrainCompleted", "PoolDrainTimedOut")
    ]
    assert len(completed) == 1


def test_given_pool_begin_crashes_then_each_empty_pool_goes_inactive_once(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    pools = pools_with_workers(ec2_worker, "pb")
    for position, pool in pools.items():
        crash(control_plane, "pool_begin", pool, after=POSITIONS[position])

    started = {position: drain_pool(control_plane, pool) for position, pool in pools.items()}

    for position, pool in pools.items():
        assert_pool_drained(control_plane, pool, started[position]["drain_execution_arn"])
        assert runs(control_plane, "pool_begin", pool) == RUNS_AFTER_ONE_CRASH


def test_given_pool_await_empty_crashes_then_the_last_end_still_closes_each_pool(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    pools = pools_with_workers(ec2_worker, "pa")
    instances = {position: place(control_plane, pool=pool) for position, pool in pools.items()}
    for position, pool in pools.items():
        crash(control_plane, "pool_await_empty", pool, after=POSITIONS[position])
    started = {position: drain_pool(control_plane, pool) for position, pool in pools.items()}
    for pool in pools.values():
        eventually(partial(pool_retried_and_waiting, control_plane, pool))

    for instance in instances.values():
        complete(control_plane, instance["id"])

    for position, pool in pools.items():
        assert_pool_drained(control_plane, pool, started[position]["drain_execution_arn"])


def test_given_pool_recheck_crashes_then_the_lost_signal_still_closes_each_pool(
    control_plane_factory: Any, ec2_worker: WorkerFactory
) -> None:
    plane: ControlPlane = control_plane_factory(heartbeat_seconds=2)
    pools = pools_with_workers(ec2_worker, "pr")
    instances = {position: place(plane, pool=pool) for position, pool in pools.items()}
    for position, pool in pools.items():
        crash(plane, "pool_recheck", pool, after=POSITIONS[position])
    started = {position: drain_pool(plane, pool) for position, pool in pools.items()}
    store = plane.ctx.store
    for position, pool in pools.items():
        eventually(partial(plane.dispatcher.has_returned, "pool_await_empty", pool))
        store.end_instance(store.get_instance(instances[position]["id"]), InstanceState.COMPLETED, actor="t")

    for position, pool in pools.items():
        assert_pool_drained(plane, pool, started[position]["drain_execution_arn"])
        assert runs(plane, "pool_recheck", pool) >= RUNS_AFTER_ONE_CRASH


def test_given_pool_finish_crashes_around_starting_worker_drains_then_every_worker_is_drained_once(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    """pool_finish starts the workers' drains; a crash after it did must neither skip nor repeat one."""
    pools = pools_with_workers(ec2_worker, "pf")
    for position, pool in pools.items():
        ec2_worker(pool=pool)  # two workers per pool
        crash(control_plane, "pool_finish", pool, after=POSITIONS[position])

    started = {position: drain_pool(control_plane, pool, then="stop") for position, pool in pools.items()}

    store = control_plane.ctx.store
    for position, pool in pools.items():
        assert_pool_drained(control_plane, pool, started[position]["drain_execution_arn"])
        assert runs(control_plane, "pool_finish", pool) == RUNS_AFTER_ONE_CRASH
        for worker in store.workers_in_pool(pool):
            eventually(partial(stopping, control_plane, worker.id))
            record = store.get_worker(worker.id).drain
            assert record is not None
            assert (record.generation, record.outcome.value) == (1, "SUCCESS")
            assert record.execution_arn is not None
            assert control_plane.wait_for_execution(record.execution_arn)["status"] == "SUCCEEDED"
