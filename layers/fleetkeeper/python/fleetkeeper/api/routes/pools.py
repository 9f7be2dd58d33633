"""Pools: named groups of workers that placement can target and drains can empty."""

from __future__ import annotations

from http import HTTPStatus

from aws_lambda_powertools.event_handler import Response

from fleetkeeper.api.errors import JSON, responses
from fleetkeeper.api.params import ResourceName
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.schemas import PoolList, PoolRequest, PoolView
from fleetkeeper.domain.lifecycle import PoolStatus
from fleetkeeper.domain.models import Pool
from fleetkeeper.services import capacity, catalog, disruption
from fleetkeeper.services.context import default_context
from fleetkeeper.services.disruption import BudgetExceeded

router = ResourceRouter(
    "pools",
    "Named groups of workers that placement targets and drains empty, with their disruption budgets.",
)


def pool_view(pool: Pool, budget_exceeded: BudgetExceeded | None = None) -> PoolView:
    """One pool as every route that reads or writes one answers it: with its active instances counted."""
    active = default_context().store.pool_active_instances(pool.name)
    return PoolView.of(pool, active_instances=active, budget_exceeded=budget_exceeded)


@router.get(
    "/api/v1/pools",
    summary="List every pool",
    description="Every pool, in one answer; `active_instances` is counted only when one pool is read.",
    responses=responses({200: ("every pool", PoolList)}),
)
def list_pools() -> PoolList:
    return PoolList(items=[PoolView.of(p) for p in default_context().store.list_pools()])


@router.get(
    "/api/v1/pools/<name>",
    summary="Read a pool, with its active instances counted",
    description="The pool as stored, its drain if any, and the instances active on its workers now. 404 "
    "if there is no such pool.",
    responses=responses({200: ("the pool", PoolView)}, 404),
)
def get_pool(name: ResourceName) -> PoolView:
    return pool_view(default_context().store.get_pool(name))


@router.get(
    "/api/v1/pools/<name>/disruption",
    summary="Read what a pool's disruption budgets allow now",
    description="Each budget of the pool with whether its window applies now, what it allows and how "
    "many workers are being disrupted, and what waits for it (docs/disruption.md). 404 if there is no "
    "such pool.",
    responses=responses({200: ("the pool's disruption budgets now", disruption.PoolDisruptionView)}, 404),
)
def get_pool_disruption(name: ResourceName) -> disruption.PoolDisruptionView:
    return disruption.pool_view(default_context(), name)


@router.get(
    "/api/v1/pools/<name>/capacity",
    summary="Read what a pool's capacity policy sees and does now",
    description="The pool's RUNNING, launching, stopping and warm workers, its free slots, the target now "
    "and the rule that sets it, what the last reconcile cycle's scale-out did, and whether scale-out "
    "is blocked and why (docs/capacity.md). 404 if there is no such pool.",
    responses=responses({200: ("the pool's capacity now", capacity.PoolCapacityView)}, 404),
)
def get_pool_capacity(name: ResourceName) -> capacity.PoolCapacityView:
    return capacity.pool_view(default_context(), name)


@router.put(
    "/api/v1/pools/<name>",
    summary="Create a pool or update its description, status, budgets, repair or capacity settings",
    description="201 when the pool is new, 200 when it was updated; a field left out keeps its value, "
    "`disruption` replaces the budgets whole, `repair` its repair settings (docs/repair.md) and "
    "`capacity` its capacity policy (docs/capacity.md). 409 if "
    "the pool is draining and the body changes its status (cancel the drain first), or if it turns "
    "bookings off while some wait for capacity (`details.field` is `capacity.bookings`: end them "
    "first); 422 names a field "
    "of the wrong form, such as a budget's `max`, "
    "`schedule`, `duration` or `timezone`, or a capacity policy's unknown template or headroom that "
    "`max_workers` cannot hold.",
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
        repair=body.repair,
        capacity=body.capacity,
    )
    status = HTTPStatus.CREATED if created else HTTPStatus.OK
    return Response(status_code=status, content_type=JSON, body=pool_view(pool))
