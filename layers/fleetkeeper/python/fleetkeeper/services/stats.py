"""Fleet-wide figures for GET /api/v1/stats."""

from __future__ import annotations

from typing import Final

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.sharding import Shard
from fleetkeeper.services.context import Context

# The reconcile cycle's stats scope; a sharded cycle's own figures go to its shard's (`reconcile#2of4`).
RECONCILE_SCOPE: Final = "reconcile"

# Active instances are summed over the workers that can hold any; the TERMINATED history grows for
# ever and its workers' instances were ended when they were retired.
_HOLDING_STATUSES = [s for s in WorkerStatus if s != WorkerStatus.TERMINATED]
# Scopes no component records any more; an item an earlier version left behind is not reported as if
# it were current. EC2 event outcomes are EMF metrics (Ec2Events.events_<outcome>): a write per event
# made one hot item.
RETIRED_SCOPES = frozenset({"ec2-events"})


def reconcile_scope(shard: Shard) -> str:
    """The stats scope of the shard's own last-cycle figures (the shared scope when unsharded)."""
    return RECONCILE_SCOPE + shard.suffix


def fleet_stats(ctx: Context) -> dict[str, object]:
    """Workers per status (the exact counters, store/counters.py), active instances (summed from the
    status index, which holds each worker's count) and pools per status."""
    counts = ctx.store.fleet_counts().by_status
    workers_by_status = {str(status): counts[status] for status in WorkerStatus if counts[status]}
    active_instances = sum(w.active_instances for w in ctx.store.worker_summaries(_HOLDING_STATUSES))
    pools_by_status: dict[str, int] = {}
    for pool in ctx.store.list_pools():
        pools_by_status[str(pool.status)] = pools_by_status.get(str(pool.status), 0) + 1
    return {
        "workers_by_status": workers_by_status,
        "active_instances": active_instances,
        "pools_by_status": pools_by_status,
        # reconcile, discovery, scale-down and layout counters (store/stats.py)
        "counters": {
            scope: figures
            for scope, figures in ctx.stats.counters_by_scope().items()
            if scope not in RETIRED_SCOPES
        },
    }
