"""Rollouts: start one (or plan it with dry_run), list and read them, pause, resume, cancel, roll back."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Body, Query
from pydantic import BaseModel, ConfigDict

from fleetkeeper.api.errors import JSON, responses
from fleetkeeper.api.params import PageToken, RolloutId
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.domain.rollouts import RolloutRequest
from fleetkeeper.domain.values import Reason
from fleetkeeper.services import rollouts
from fleetkeeper.services.context import default_context
from fleetkeeper.services.rollouts import RolloutPlan, RolloutView

router = ResourceRouter(
    "rollouts",
    "Replacing drifted workers wave by wave within the pools' budgets: start (or plan), read, pause, "
    "resume, cancel, roll back (docs/rollouts.md).",
)

START_CONFLICT = (
    "POOL_NOT_ACTIVE: the pool (or a named worker's) is draining or inactive; CONFLICT: an active rollout "
    "(RUNNING, PAUSED or ROLLING_BACK) of the same template covers the same pool, or one holds a worker "
    "named in worker_ids (details name that rollout, and the worker); REQUEST_IN_PROGRESS: a request with "
    "the same Idempotency-Key is still running"
)
MOVE_CONFLICT = (
    "CONFLICT: the rollout's status does not allow the move (pause: RUNNING only; resume: PAUSED only; "
    "cancel: RUNNING, PAUSED or ROLLING_BACK); current_status names it"
)
ROLLBACK_CONFLICT = "CONFLICT: the rollout is ROLLING_BACK or ROLLED_BACK already (current_status names it)"


class RolloutPage(BaseModel):
    items: list[RolloutView]
    next_token: str | None


class RolloutControlRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"reason": "error rate up"}]})

    reason: Reason | None = None


@router.post(
    "/api/v1/rollouts",
    summary="Replace a template's workers (or those named) wave by wave",
    description="202 with the rollout RUNNING: the reconciler replaces `max_unavailable` workers at a "
    "time, pausing at checkpoints. With `dry_run`, 200 with the waves and nothing written. 409 if its "
    "pool is not active, an active rollout of the same template covers the same pool, or another active "
    "rollout holds a worker named; 422 names an unknown template, pool or worker, or a worker that is "
    "not RUNNING; 503 when AWS stayed unavailable.",
    responses=responses(
        {
            200: (
                "dry_run: the plan, each wave with its count and the first waves with their workers (up to "
                "1,000); nothing was written",
                RolloutPlan,
            ),
            202: ("the rollout, RUNNING: the reconciler advances it", RolloutView),
        },
        409,
        503,
        conflict=START_CONFLICT,
    ),
)
def start_rollout(body: Annotated[RolloutRequest, Body()]) -> Response[RolloutView | RolloutPlan]:
    if body.dry_run:
        plan = rollouts.plan(default_context(), body)
        return Response(status_code=HTTPStatus.OK, content_type=JSON, body=plan)
    started = rollouts.start(default_context(), body, actor=caller(router.current_event))
    return Response(status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=RolloutView.of(started))


@router.get(
    "/api/v1/rollouts",
    summary="List rollouts, newest first",
    description="One page of rollouts with their progress; follow `next_token` until there is none. "
    "422 names a `next_token` this query did not issue.",
    responses=responses({200: ("one page of rollouts, newest first", RolloutPage)}),
)
def list_rollouts(
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    next_token: PageToken = None,
) -> RolloutPage:
    found = rollouts.page(default_context(), limit=limit, next_token=next_token)
    return RolloutPage(items=[RolloutView.of(r) for r in found.items], next_token=found.next_token)


@router.get(
    "/api/v1/rollouts/<rollout_id>",
    summary="Read a rollout",
    description="The rollout's status, waves, progress, what blocks it, and its rollback if any. 404 if "
    "there is no such rollout.",
    responses=responses({200: ("the rollout", RolloutView)}, 404),
)
def get_rollout(rollout_id: RolloutId) -> RolloutView:
    return RolloutView.of(rollouts.get(default_context(), rollout_id))


@router.post(
    "/api/v1/rollouts/<rollout_id>/pause",
    summary="Pause a RUNNING rollout: no new step until it is resumed",
    description="Drains and replacements already started go on; nothing new starts. 404 if there is no "
    "such rollout; 409 unless it is RUNNING.",
    responses=responses({200: ("the rollout, PAUSED", RolloutView)}, 404, 409, conflict=MOVE_CONFLICT),
)
def pause_rollout(
    rollout_id: RolloutId, body: Annotated[RolloutControlRequest | None, Body()] = None
) -> RolloutView:
    reason = body.reason if body else None
    actor = caller(router.current_event)
    return RolloutView.of(rollouts.pause(default_context(), rollout_id, actor=actor, reason=reason))


@router.post(
    "/api/v1/rollouts/<rollout_id>/resume",
    summary="Resume a PAUSED rollout (at a checkpoint: pass it)",
    description="The rollout is RUNNING again from where it paused. 404 if there is no such rollout; 409 "
    "unless it is PAUSED.",
    responses=responses({200: ("the rollout, RUNNING", RolloutView)}, 404, 409, conflict=MOVE_CONFLICT),
)
def resume_rollout(
    rollout_id: RolloutId, body: Annotated[RolloutControlRequest | None, Body()] = None
) -> RolloutView:
    reason = body.reason if body else None
    actor = caller(router.current_event)
    return RolloutView.of(rollouts.resume(default_context(), rollout_id, actor=actor, reason=reason))


@router.post(
    "/api/v1/rollouts/<rollout_id>/cancel",
    summary="Cancel a rollout: no new wave starts; drains and replacements already started go on",
    description="The rollout ends CANCELLED and its hold on its workers lapses; it can still be rolled "
    "back. 404 if there is no such rollout; 409 unless it is RUNNING, PAUSED or ROLLING_BACK.",
    responses=responses({200: ("the rollout, CANCELLED", RolloutView)}, 404, 409, conflict=MOVE_CONFLICT),
)
def cancel_rollout(
    rollout_id: RolloutId, body: Annotated[RolloutControlRequest | None, Body()] = None
) -> RolloutView:
    reason = body.reason if body else None
    actor = caller(router.current_event)
    return RolloutView.of(rollouts.cancel(default_context(), rollout_id, actor=actor, reason=reason))


@router.post(
    "/api/v1/rollouts/<rollout_id>/rollback",
    summary="Roll a rollout back: drain its replacements, relaunching what it drained as it was launched",
    description="Accepted from RUNNING, PAUSED, SUCCEEDED, FAILED and CANCELLED. Each replacement the "
    "rollout created is drained (then terminated); where the rollout drained the old worker, a worker "
    "with the old worker's image and instance type is launched first. The reconciler does it in waves "
    "of max_unavailable, within the pools' disruption budgets; a replacement another active rollout "
    "holds is left to it. 404 if there is no such rollout; 409 if it is rolling back or rolled back "
    "already.",
    responses=responses(
        {202: ("the rollout, ROLLING_BACK", RolloutView)}, 404, 409, conflict=ROLLBACK_CONFLICT
    ),
)
def rollback_rollout(
    rollout_id: RolloutId, body: Annotated[RolloutControlRequest | None, Body()] = None
) -> Response[RolloutView]:
    reason = body.reason if body else None
    actor = caller(router.current_event)
    started = rollouts.rollback(default_context(), rollout_id, actor=actor, reason=reason)
    return Response(status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=RolloutView.of(started))
