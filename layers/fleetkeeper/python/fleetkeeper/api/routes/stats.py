"""Fleet statistics: workers by status, active instances, pools by status, counters."""

from __future__ import annotations

from fleetkeeper.api.errors import responses
from fleetkeeper.api.routes import new_router
from fleetkeeper.api.schemas import Stats
from fleetkeeper.services import stats
from fleetkeeper.services.context import default_context

router = new_router()


@router.get(
    "/api/v1/stats",
    responses=responses(
        {200: ("the fleet's figures; EC2 event outcomes are metrics, not counters here", Stats)}
    ),
)
def get_stats() -> Stats:
    return Stats.model_validate(stats.fleet_stats(default_context()))
