"""Orphan GC's circuit breaker: what it holds back per region, and an operator's confirmation."""

from __future__ import annotations

from fleetkeeper.api.errors import responses
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import new_router
from fleetkeeper.api.schemas import ConfirmOrphansRequest, OrphanBreakerList, OrphanBreakerView
from fleetkeeper.services import orphan_gc
from fleetkeeper.services.context import default_context

router = new_router()


@router.get(
    "/api/v1/reconcile/orphans",
    responses=responses({200: ("each region's orphan GC breaker", OrphanBreakerList)}),
)
def list_orphan_breakers() -> OrphanBreakerList:
    return OrphanBreakerList(items=[OrphanBreakerView.of(b) for b in orphan_gc.breakers(default_context())])


@router.post(
    "/api/v1/reconcile/orphans/confirm",
    responses=responses(
        {200: ("the breaker, with the confirmation the next discovery pass spends", OrphanBreakerView)},
        409,
    ),
)
def confirm_orphans(body: ConfirmOrphansRequest) -> OrphanBreakerView:
    breaker = orphan_gc.confirm(
        default_context(), body.region, actor=caller(router.current_event), expected=body.worker_ids
    )
    return OrphanBreakerView.of(breaker)
