"""Signals that end a wait: the last instance ended (the reconcile cycle's sweep, sweep.py, recovers the
signals that were lost), or the deadline moved and the wait must be armed again."""

from __future__ import annotations

from typing import Any

from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import (
    DrainOutcome,
    Instance,
)
from fleetkeeper.services.context import Context


def signal_if_drained(ctx: Context, instance: Instance) -> None:
    """After an instance ended: send the waiting drain tokens of its worker and pool if now empty."""
    worker = ctx.store.find_worker(instance.worker_id)
    if worker is not None and worker.status == WorkerStatus.DRAINING and worker.drain is not None:
        record = worker.drain
        if record.outcome == DrainOutcome.RUNNING and record.task_token and worker.active_instances == 0:
            ctx.workflows.succeed(record.task_token, {"worker_id": worker.id, "empty": True})
    if instance.pool:
        pool = ctx.store.find_pool(instance.pool)
        if (
            pool is not None
            and pool.status == PoolStatus.DRAINING
            and pool.drain_task_token
            and ctx.store.pool_active_instances(pool.name) == 0
        ):
            ctx.workflows.succeed(pool.drain_task_token, {"pool": pool.name, "empty": True})


def rearm_answer(worker_id: str) -> dict[str, Any]:
    """The answer that ends a worker drain's wait whose deadline moved (or was forced).

    It is a success, not a failure: an execution of any definition routes a success to Finish, which
    finds the worker busy (DrainNotEmpty) and goes back to the re-check, which arms the next wait for
    the new deadline or forces. A failure with an error of its own would end in RecordError on an
    execution started before its state machine learnt to catch it. If the worker is empty by then,
    Finish simply finishes it.
    """
    return {"worker_id": worker_id, "rearm": True}
