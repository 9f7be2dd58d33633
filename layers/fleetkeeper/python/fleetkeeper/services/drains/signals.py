"""Signals that end a wait (the last instance ended), and the reconcile cycle's sweep of waiting drains."""

from __future__ import annotations

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


def sweep_waiting_drains(ctx: Context) -> dict[str, int]:
    """Keep waiting drains alive and recover lost signals; the reconciler runs this every cycle.

    A drain whose worker is empty but whose token was never answered completes here. Otherwise a
    heartbeat keeps the callback task waiting without costing a state transition, so a drain's
    transition count does not grow with its length.
    """
    completed = heartbeats = 0
    for worker in ctx.store.iter_workers_by_status([WorkerStatus.DRAINING]):
        record = worker.drain
        if record is None or record.outcome != DrainOutcome.RUNNING or not record.task_token:
            continue
        current = ctx.store.get_worker(worker.id)  # the index may lag; act on the item
        token = current.drain.task_token if current.drain else None
        if not token or current.status != WorkerStatus.DRAINING:
            continue
        if current.active_instances == 0:
            completed += ctx.workflows.succeed(
                token, {"worker_id": current.id, "empty": True, "recovered": True}
            )
        else:
            heartbeats += ctx.workflows.heartbeat(token)
    for pool in ctx.store.list_pools():
        if pool.status != PoolStatus.DRAINING or not pool.drain_task_token:
            continue
        if ctx.store.pool_active_instances(pool.name) == 0:
            completed += ctx.workflows.succeed(pool.drain_task_token, {"pool": pool.name, "empty": True})
        else:
            heartbeats += ctx.workflows.heartbeat(pool.drain_task_token)
    return {"completed": completed, "heartbeats": heartbeats}
