"""Pools: named groups of workers that placement can target and drains can empty."""

from __future__ import annotations

from http import HTTPStatus

from aws_lambda_powertools.event_handler import Response

from fleetkeeper.api.errors import JSON, responses
from fleetkeeper.api.params import ResourceName
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import new_router
from fleetkeeper.api.schemas import PoolList, PoolRequest, PoolView
from fleetkeeper.domain.lifecycle import PoolStatus
from fleetkeeper.domain.models import Pool
from fleetkeeper.services import catalog, disruption
from fleetkeeper.services.context import default_context
from fleetkeeper.services.disruption import BudgetExceeded

router = new_router()


def pool_view(pool: Pool, budget_exceeded: BudgetExceeded | None = None) -> PoolView:
    """One pool as every route that reads or writes one answers it: with its active instances counted."""
    active = default_context().store.pool_active_instances(pool.name)
    return PoolView.of(pool, active_instances=active, budget_exceeded=budget_exceeded)


@router.get(
    "/api/v1/pools",
    responses=responses({200: ("every pool", PoolList)}),
)
def list_pools() -> PoolList:
    return PoolList(items=[PoolView.of(p) for p in default_context().store.list_pools()])


@router.get(
    "/api/v1/pools/<name>",
    responses=responses({200: ("the pool", PoolView)}, 404),
)
def get_pool(name: ResourceName) -> PoolView:
    return pool_view(default_context().store.get_pool(name))


@router.get(
    "/api/v1/pools/<name>/disruption",
    responses=responses({200: ("the pool's disruption budgets now", disruption.PoolDisruptionView)}, 404),
)
def get_pool_disruption(name: ResourceName) -> disruption.PoolDisruptionView:
    return disruption.pool_view(default_context(), name)


@router.put(
    "/api/v1/pools/<name>",
    responses=responses({200: ("the pool, updated", PoolView), 201: ("the pool, created", PoolView)}, 409),
)
def put_pool(name: ResourceName, body: PoolRequest) -> Response[PoolView]:
    pool, created = catalog.put_pool(
        default_context().store,
        name,
        actor=caller(router.current_event),
        description=body.description,
        status=PoolStatus(body.status) if body.status else None,
        disruption=body.disruption,
    )
    status = HTTPStatus.CREATED if created else HTTPStatus.OK
    return Response(status_code=status, content_type=JSON, body=pool_view(pool))
