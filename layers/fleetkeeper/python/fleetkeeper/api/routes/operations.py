"""Worker operations: request one (run on the machine by the reconciler through SSM), list them."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from fleetkeeper.api.errors import JSON, RETRY_AFTER_SECONDS, responses
from fleetkeeper.api.params import PageToken, WorkerId
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.schemas import OperationPage, OperationRequest, OperationView
from fleetkeeper.services import operations
from fleetkeeper.services.context import default_context

router = ResourceRouter(
    "operations",
    "Commands run on a worker's machine through SSM Run Command (the stage's catalogue), and their results.",
)

_REQUEST_RESPONSES = responses(
    {202: ("the operation, PENDING: the reconciler sends it to the machine", OperationView)},
    409,
    503,
)
# No workflow starts here: the one 503 this route answers is the table staying throttled.
_REQUEST_RESPONSES[503] = {
    **_REQUEST_RESPONSES[503],
    "description": f"SERVICE_UNAVAILABLE: nothing was stored; retry after {RETRY_AFTER_SECONDS} s",
}


@router.post(
    "/api/v1/workers/<worker_id>/operations",
    summary="Request an operation on a worker's machine",
    description="Stores the operation PENDING; the reconciler sends it through SSM and records its output. "
    "404 if there is no such worker; 409 OPERATION_IN_FLIGHT while another one runs on it, or CONFLICT "
    "if the worker cannot run one; 422 names an unknown operation or a parameter the catalogue refuses; "
    "503 when the table stayed throttled (nothing was stored).",
    responses=_REQUEST_RESPONSES,
)
def request_operation(worker_id: WorkerId, body: OperationRequest) -> Response[OperationView]:
    op = operations.request(
        default_context(), worker_id, body.name, body.parameters, actor=caller(router.current_event)
    )
    return Response(status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=OperationView.of(op))


@router.get(
    "/api/v1/workers/<worker_id>/operations",
    summary="List a worker's operations, newest first",
    description="One page of the worker's operations with their status and output; follow `next_token` "
    "until there is none. 404 if there is no such worker.",
    responses=responses({200: ("one page of the worker's operations, newest first", OperationPage)}),
)
def list_operations(
    worker_id: WorkerId,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    next_token: PageToken = None,
) -> OperationPage:
    found = operations.page(default_context(), worker_id, limit=limit, next_token=next_token)
    return OperationPage(items=[OperationView.of(o) for o in found.items], next_token=found.next_token)
