"""Signals that end a wait (the last instance ended), and the reconcile cycle's sweep of waiting drains."""

from __future__ import annotations

from collections import Counter

from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import (
    DrainOutcome,
    Instance,
)
from fleetkeeper.domain.sharding import WHOLE_FLEET, Shard
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains.watchdog import run_watchdog


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


# The keys sweep_waiting_drains always returns: its own, then the watchdog's verdicts.
SWEEP_COUNTS = ("completed", "heartbeats", "errors", "running", "young", "restarted", "closed", "settled")


def sweep_waiting_drains(ctx: Context, shard: Shard = WHOLE_FLEET) -> dict[str, int]:
    """Keep waiting drains alive, recover lost signals, and run the watchdog; the reconcile cycle runs
    this every cycle.

    A drain whose worker is empty but whose token was never answered completes here. Otherwise a
    heartbeat keeps the callback task waiting without costing a state transition, so a drain's
    transition count does not grow with its length. Then the watchdog (services/drains/watchdog.py)
    restarts or closes every open drain whose execution is gone. One drain that fails here is logged
    and counted in `errors`; the others are still swept. A shard sweeps its own workers' drains; the
    lead shard sweeps the pool drains too.
    """
    counts: Counter[str] = Counter(dict.fromkeys(SWEEP_COUNTS, 0))
    for worker in ctx.store.iter_workers_by_status([WorkerStatus.DRAINING]):
        record = worker.drain
        if record is None or record.outcome != DrainOutcome.RUNNING or not record.task_token:
            continue
        if not shard.owns(worker.id):
            continue
        try:
            _sweep_worker(ctx, worker.id, counts)
        except Exception:
            logger.exception("sweep of a waiting drain failed", extra={"worker_id": worker.id})
            counts["errors"] += 1
    for pool in ctx.store.list_pools() if shard.leads else ():
        if pool.status != PoolStatus.DRAINING or not pool.drain_task_token:
            continue
        try:
            if ctx.store.pool_active_instances(pool.name) == 0:
                counts["completed"] += ctx.workflows.succeed(
                    pool.drain_task_token, {"pool": pool.name, "empty": True}
                )
            else:
                counts["heartbeats"] += ctx.workflows.heartbeat(pool.drain_task_token)
        except Exception:
            logger.exception("sweep of a waiting pool drain failed", extra={"pool": pool.name})
            counts["errors"] += 1
    counts.update(run_watchdog(ctx, shard=shard))
    return dict(counts)


def _sweep_worker(ctx: Context, worker_id: str, counts: Counter[str]) -> None:
    current = ctx.store.get_worker(worker_id)  # the index may lag; act on the item
    token = current.drain.task_token if current.drain else None
    if not token or current.status != WorkerStatus.DRAINING:
        return
    if current.active_instances == 0:
        counts["completed"] += ctx.workflows.succeed(
            token, {"worker_id": current.id, "empty": True, "recovered": True}
        )
    else:
        counts["heartbeats"] += ctx.workflows.heartbeat(token)
