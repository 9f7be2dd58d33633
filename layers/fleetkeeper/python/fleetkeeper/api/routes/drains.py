"""Drains of one worker or a whole pool: start (or plan with dry_run), read, move the deadline, force,
cancel."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body

from fleetkeeper.api.errors import JSON, responses
from fleetkeeper.api.params import ResourceName, WorkerId
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.routes.pools import pool_view
from fleetkeeper.api.schemas import (
    CancelDrainRequest,
    DrainDeadlineRequest,
    DrainRequest,
    ForceDrainRequest,
    PoolDrainRequest,
    PoolView,
    WorkerView,
)
from fleetkeeper.services import disruption, drains
from fleetkeeper.services.context import default_context
from fleetkeeper.services.drains import DrainStatus

router = ResourceRouter(
    "drains",
    "Taking a worker or a whole pool out of service gracefully: start (or plan) a drain, read it, move its "
    "deadline, force it, cancel it (docs/drains.md).",
)


@router.post(
    "/api/v1/workers/<worker_id>/drain",
    summary="Drain a worker: no new instances, then stop or terminate it once empty or at its deadline",
    description="202 with the drain started (RUNNING -> DRAINING); with `dry_run`, 200 with the drain "
    "that would start and nothing written. A drain beyond a pool budget is never refused: "
    "`budget_exceeded` names the budget. 404 if there is no such worker; 409 DRAIN_IN_PROGRESS if a "
    "drain runs, or ILLEGAL_TRANSITION if the worker is not RUNNING; 503 if the drain workflow could "
    "not start (nothing changed; retry).",
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
        if plan.may_start:
            plan.budget_exceeded = disruption.worker_drain_exceeds(default_context(), worker_id)
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
    status.budget_exceeded = disruption.worker_drain_exceeds(default_context(), worker_id)
    return Response(status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=status)


@router.get(
    "/api/v1/workers/<worker_id>/drain",
    summary="Read a worker's latest drain",
    description="Where the worker's latest drain stands (NOT_RUN if it never drained): its deadline, what "
    "still runs, what it moved, and how it ended. 404 if there is no such worker.",
    responses=responses({200: ("the worker's drain", DrainStatus)}, 404),
)
def get_drain(worker_id: WorkerId) -> DrainStatus:
    return drains.worker_drain_status(default_context(), worker_id)


# Why a deadline move or a force may be refused; the contract and docs/drains.md say the same.
_NOT_OPEN = (
    "CONFLICT: the worker is not DRAINING, its drain ended (ERROR), or `generation` names another drain; "
    "DRAIN_FINISHING: the drain's Finish step has begun (the worker is empty, its before-stop operations "
    "and stop have started)"
)
MOVE_CONFLICT = (
    f"{_NOT_OPEN}; DEADLINE_PASSED: the deadline has passed or the drain was forced, its force may have "
    "begun; TOO_MANY_DEADLINE_MOVES: the deadline already moved as often as a drain allows; "
    "REQUEST_IN_PROGRESS: a request with the same Idempotency-Key is still running"
)
FORCE_CONFLICT = f"{_NOT_OPEN}; REQUEST_IN_PROGRESS: a request with the same Idempotency-Key is still running"


@router.patch(
    "/api/v1/workers/<worker_id>/drain",
    summary="Move a running drain's deadline, earlier or later",
    description="The drain's whole timeout becomes `timeout_seconds`, counted from its start; a deadline "
    "already past forces it now. 404 if there is no such worker; 409 when the drain is not open, "
    "finishing, past its deadline or moved too often (the 409 answer says which).",
    responses=responses(
        {200: ("the drain, with its new deadline", DrainStatus)}, 404, 409, conflict=MOVE_CONFLICT
    ),
)
def move_drain_deadline(worker_id: WorkerId, body: Annotated[DrainDeadlineRequest, Body()]) -> DrainStatus:
    return drains.move_worker_drain_deadline(
        default_context(),
        worker_id,
        timeout_seconds=body.timeout_seconds,
        actor=caller(router.current_event),
        reason=body.reason,
        generation=body.generation,
    )


@router.post(
    "/api/v1/workers/<worker_id>/drain/force",
    summary="Force a running drain now: what still runs ends with reason forced",
    description="The drain's deadline becomes now: its force step ends the worker's instances and the "
    "drain finishes. 404 if there is no such worker; 409 when the worker is not DRAINING, its drain "
    "ended or is finishing, or `generation` names another drain.",
    responses=responses({202: ("the drain, being forced", DrainStatus)}, 404, 409, conflict=FORCE_CONFLICT),
)
def force_drain(
    worker_id: WorkerId, body: Annotated[ForceDrainRequest | None, Body()] = None
) -> Response[DrainStatus]:
    request = body or ForceDrainRequest()
    status = drains.force_worker_drain(
        default_context(),
        worker_id,
        actor=caller(router.current_event),
        reason=request.reason,
        generation=request.generation,
    )
    return Response(status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=status)


# Why a cancel may be refused; the contract and docs/drains.md (Cancel) say the same.
CANCEL_CONFLICT = (
    "CONFLICT: the worker is not DRAINING (its drain ended, or another cancel won); DRAIN_FINISHING: the "
    "drain's Finish step has begun its before-stop operations (e.g. releasing the license) and the stop, "
    "which a cancel cannot undo, so the worker stops: start it again once it has; REQUEST_IN_PROGRESS: "
    "a request with the same Idempotency-Key is still running"
)


@router.post(
    "/api/v1/workers/<worker_id>/cancel-drain",
    summary="Cancel a worker's drain: it is RUNNING again and takes instances",
    description="DRAINING -> RUNNING, and the drain ends CANCELLED. 404 if there is no such worker; 409 "
    "when it is not DRAINING, or its drain has begun to finish (before-stop operations, the stop).",
    responses=responses(
        {200: ("the worker, drain cancelled", WorkerView)}, 404, 409, conflict=CANCEL_CONFLICT
    ),
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
    summary="Drain a pool: it takes no instances until its own are done, then drains its workers if asked",
    description="The pool is DRAINING until its active instances end or the timeout passes; `then` stop "
    "or terminate drains each of its workers afterwards. 404 if there is no such pool; 409 if it is "
    "draining already; 503 if the drain workflow could not start (nothing changed; retry).",
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
    exceeds = disruption.pool_drain_exceeds(default_context(), pool)
    return Response(
        status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=pool_view(pool, budget_exceeded=exceeds)
    )


@router.post(
    "/api/v1/pools/<name>/cancel-drain",
    summary="Cancel a pool's drain: it is active again",
    description="The pool takes instances again and its drain ends CANCELLED. 404 if there is no such "
    "pool; 409 if it is not draining.",
    responses=responses({200: ("the pool, drain cancelled", PoolView)}, 404, 409),
)
def cancel_pool_drain(
    name: ResourceName, body: Annotated[CancelDrainRequest | None, Body()] = None
) -> PoolView:
    reason = body.reason if body else None
    pool = drains.cancel_pool_drain(
        default_context(), name, actor=caller(router.current_event), reason=reason
    )
    return pool_view(pool)
