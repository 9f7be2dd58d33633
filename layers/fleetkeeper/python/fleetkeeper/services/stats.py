"""Fleet-wide figures for GET /api/v1/stats."""

from __future__ import annotations

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.services.context import Context


def fleet_stats(ctx: Context) -> dict[str, object]:
    """Workers per status, active instances and pools per status, read from the status index."""
    workers_by_status: dict[str, int] = {}
    active_instances = 0
    for status in WorkerStatus:
        count = 0
        for worker in ctx.store.iter_workers_by_status([status]):
            count += 1
            active_instances += worker.active_instances
        if count:
            workers_by_status[str(status)] = count
    pools_by_status: dict[str, int] = {}
    for pool in ctx.store.list_pools():
        pools_by_status[str(pool.status)] = pools_by_status.get(str(pool.status), 0) + 1
    return {
        "workers_by_status": workers_by_status,
        "active_instances": active_instances,
        "pools_by_status": pools_by_status,
        # reconcile, discovery, ec2-events and scale-down counters (store/stats.py)
        "counters": ctx.stats.counters_by_scope(),
    }
