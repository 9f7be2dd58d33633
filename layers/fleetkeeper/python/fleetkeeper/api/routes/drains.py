"""Drains of one worker or a whole pool: start (or plan with dry_run), read, cancel."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from fleetkeeper.api.errors import JSON, responses
from fleetkeeper.api.params import ResourceName, WorkerId
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import new_router
from fleetkeeper.api.schemas import (
    CancelDrainRequest,
    DrainRequest,
    PoolDrainRequest,
    PoolView,
    WorkerView,
)
from fleetkeeper.services import drains
from fleetkeeper.services.context import default_context
from fleetkeeper.services.drains import DrainStatus

router = new_router()


@router.post(
    "/api/v1/workers/<worker_id>/drain",
    responses=responses(
        {200: ("dry_run: the drain that would start", DrainStatus), 202: ("the drain started", DrainStatus)},
        404,
        409,
        503,
    ),
)
def drain_worker(
    worker_id: WorkerId, body: Annotated[DrainRequest | None, Body()] = None
) -> Response[DrainStatus]:
    request = body or DrainRequest()
    actor = caller(router.current_event)
    if request.dry_run:
        plan = drains.plan_worker_drain(
            default_context(),
            worker_id,
            timeout_seconds=request.timeout_seconds,
            then=request.then,
            reason=request.reason,
            reschedule=request.reschedule,
            actor=actor,
        )
        return Response(status_code=HTTPStatus.OK, content_type=JSON, body=plan)
    status = drains.start_worker_drain(
        default_context(),
        worker_id,
        actor=actor,
        reason=request.reason,
        timeout_seconds=request.timeout_seconds,
        then=request.then,
        reschedule=request.reschedule,
    )
    return Response(status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=status)


@router.get(
    "/api/v1/workers/<worker_id>/drain",
    responses=responses({200: ("the worker's drain", DrainStatus)}, 404),
)
def get_drain(worker_id: WorkerId) -> DrainStatus:
    return drains.worker_drain_status(default_context(), worker_id)


@router.post(
    "/api/v1/workers/<worker_id>/cancel-drain",
    responses=responses({200: ("the worker, drain cancelled", WorkerView)}, 404, 409),
)
def cancel_drain(
    worker_id: WorkerId, body: Annotated[CancelDrainRequest | None, Body()] = None
) -> WorkerView:
    reason = body.reason if body else None
    worker = drains.cancel_worker_drain(
        default_context(), worker_id, actor=caller(router.current_event), reason=reason
    )
    return WorkerView.of(worker)


@router.post(
    "/api/v1/pools/<name>/drain",
    responses=responses({202: ("the pool, draining", PoolView)}, 404, 409, 503),
)
def drain_pool(
    name: ResourceName, body: Annotated[PoolDrainRequest | None, Body()] = None
) -> Response[PoolView]:
    request = body or PoolDrainRequest()
    pool = drains.start_pool_drain(
        default_context(),
        name,
        actor=caller(router.current_event),
        timeout_seconds=request.timeout_seconds,
        then=request.then,
    )
    return Response(status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=PoolView.of(pool))


@router.post(
    "/api/v1/pools/<name>/cancel-drain",
    responses=responses({200: ("the pool, drain cancelled", PoolView)}, 404, 409),
)
def cancel_pool_drain(
    name: ResourceName, body: Annotated[CancelDrainRequest | None, Body()] = None
) -> PoolView:
    reason = body.reason if body else None
    pool = drains.cancel_pool_drain(
        default_context(), name, actor=caller(router.current_event), reason=reason
    )
    return PoolView.of(pool)
