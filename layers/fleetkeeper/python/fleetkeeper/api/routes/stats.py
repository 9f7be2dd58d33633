"""Fleet statistics: workers by status, active instances, pools by status, counters."""

from __future__ import annotations

from fleetkeeper.api.errors import responses
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.schemas import Stats
from fleetkeeper.services import stats
from fleetkeeper.services.context import default_context

router = ResourceRouter("stats", "The fleet's figures: workers and pools by status, instances, counters.")


@router.get(
    "/api/v1/stats",
    summary="Read the fleet's figures",
    description="Workers by status, active instances, pools by status, and the running counters of "
    "reconcile, discovery and scale-down. No error but the common ones.",
    responses=responses(
        {200: ("the fleet's figures; EC2 event outcomes are metrics, not counters here", Stats)}
    ),
)
def get_stats() -> Stats:
    return Stats.model_validate(stats.fleet_stats(default_context()))
