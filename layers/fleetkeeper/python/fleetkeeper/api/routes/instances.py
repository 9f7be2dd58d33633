"""Instances (sessions on a worker): place one, list, read, and move it through its states."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from fleetkeeper.api.errors import JSON, responses
from fleetkeeper.api.params import InstanceId, PageToken
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.schemas import (
    MAX_ID_LENGTH,
    InstancePage,
    InstanceStateRequest,
    InstanceView,
    PlaceInstanceRequest,
)
from fleetkeeper.domain.lifecycle import InstanceState
from fleetkeeper.services import bookings, instances
from fleetkeeper.services.context import default_context

router = ResourceRouter(
    "instances",
    "The sessions workers run: place one on a worker with room, read them, and report their states.",
)


@router.post(
    "/api/v1/instances",
    summary="Place an instance on a RUNNING worker with a free slot, or book it",
    description="Takes a slot on a worker of the template or pool (or on the worker named) in one "
    "transaction, SCHEDULED (201). In a pool whose capacity policy has `bookings: true`, a placement "
    "with a `timeslot_start` at least the pool's lead time ahead that finds no room waits for capacity "
    "instead (202, WAITING_FOR_CAPACITY, `worker_id` null, `expected_ready_by`) while `max_workers` "
    "leaves room for it; the reconcile cycle places it once a worker has room, or fails it with reason "
    "`no_capacity_by_timeslot`. 409 NO_CAPACITY when no worker has room and it cannot wait (or the pool "
    "takes no instances), 409 CONFLICT when the worker named cannot take it; 422 names an unknown "
    "template or pool, or a template or pool that is not the named worker's own.",
    responses=responses(
        {
            201: ("the instance, placed", InstanceView),
            202: ("the instance, booked: waiting for capacity", InstanceView),
        },
        404,
        409,
    ),
)
def place_instance(body: PlaceInstanceRequest) -> Response[InstanceView]:
    instance = bookings.place_or_book(
        default_context(),
        actor=caller(router.current_event),
        template=body.template,
        pool=body.pool,
        worker_id=body.worker_id,
        strategy=body.strategy,
        timeslot_start=body.timeslot_start,
        timeslot_end=body.timeslot_end,
    )
    waits = instance.state == InstanceState.WAITING_FOR_CAPACITY
    status = HTTPStatus.ACCEPTED if waits else HTTPStatus.CREATED
    return Response(status_code=status, content_type=JSON, body=InstanceView.of(instance))


@router.get(
    "/api/v1/instances",
    summary="List instances, filtered and page by page",
    description="One page of instances, by worker or by state; follow `next_token` until there is none. "
    "422 names a filter of the wrong form or a `next_token` this query did not issue.",
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
    summary="Read an instance",
    description="The instance as stored. 404 if there is no such instance.",
    responses=responses({200: ("the instance", InstanceView)}, 404),
)
def get_instance(instance_id: InstanceId) -> InstanceView:
    return InstanceView.of(default_context().store.get_instance(instance_id))


@router.post(
    "/api/v1/instances/<instance_id>/state",
    summary="Report an instance's state, as its workload sees it",
    description="Moves the instance to INSTANTIATING, RUNNING or an end (COMPLETED, FAILED, TERMINATED); "
    "an end frees its slot and may finish a drain waiting for it. 404 if there is no such instance; 409 "
    "if its state does not allow the move (it ended already); 422 for SCHEDULED or an unknown state.",
    responses=responses({200: ("the instance", InstanceView)}, 404, 409),
)
def set_instance_state(instance_id: InstanceId, body: InstanceStateRequest) -> InstanceView:
    instance = instances.change_instance_state(
        default_context(), instance_id, body.state, actor=caller(router.current_event), reason=body.reason
    )
    return InstanceView.of(instance)
