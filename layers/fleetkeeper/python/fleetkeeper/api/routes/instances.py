"""Instances (sessions on a worker): place one, list, read, and move it through its states."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from fleetkeeper.api.errors import JSON, responses
from fleetkeeper.api.params import InstanceId, PageToken
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import new_router
from fleetkeeper.api.schemas import (
    MAX_ID_LENGTH,
    InstancePage,
    InstanceStateRequest,
    InstanceView,
    PlaceInstanceRequest,
)
from fleetkeeper.domain.lifecycle import InstanceState
from fleetkeeper.services import instances, placement
from fleetkeeper.services.context import default_context

router = new_router()


@router.post(
    "/api/v1/instances",
    responses=responses({201: ("the instance, placed", InstanceView)}, 404, 409),
)
def place_instance(body: PlaceInstanceRequest) -> Response[InstanceView]:
    instance = placement.place_instance(
        default_context().store,
        actor=caller(router.current_event),
        template=body.template,
        pool=body.pool,
        worker_id=body.worker_id,
        strategy=body.strategy,
        timeslot_start=body.timeslot_start,
        timeslot_end=body.timeslot_end,
    )
    return Response(status_code=HTTPStatus.CREATED, content_type=JSON, body=InstanceView.of(instance))


@router.get(
    "/api/v1/instances",
    responses=responses({200: ("one page of instances", InstancePage)}),
)
def list_instances(
    *,
    worker_id: Annotated[str | None, Query(min_length=1, max_length=MAX_ID_LENGTH)] = None,
    state: Annotated[InstanceState | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    next_token: PageToken = None,
) -> InstancePage:
    page = default_context().store.list_instances(
        worker_id=worker_id, state=state, limit=limit, next_token=next_token
    )
    return InstancePage(items=[InstanceView.of(i) for i in page.items], next_token=page.next_token)


@router.get(
    "/api/v1/instances/<instance_id>",
    responses=responses({200: ("the instance", InstanceView)}, 404),
)
def get_instance(instance_id: InstanceId) -> InstanceView:
    return InstanceView.of(default_context().store.get_instance(instance_id))


@router.post(
    "/api/v1/instances/<instance_id>/state",
    responses=responses({200: ("the instance", InstanceView)}, 404, 409),
)
def set_instance_state(instance_id: InstanceId, body: InstanceStateRequest) -> InstanceView:
    instance = instances.change_instance_state(
        default_context(), instance_id, body.state, actor=caller(router.current_event), reason=body.reason
    )
    return InstanceView.of(instance)
