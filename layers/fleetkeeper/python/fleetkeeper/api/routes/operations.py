"""Worker operations: request one (run on the machine by the reconciler through SSM), list them."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from fleetkeeper.api.errors import JSON, RETRY_AFTER_SECONDS, responses
from fleetkeeper.api.params import PageToken, WorkerId
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import new_router
from fleetkeeper.api.schemas import OperationPage, OperationRequest, OperationView
from fleetkeeper.services import operations
from fleetkeeper.services.context import default_context

router = new_router()

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


@router.post("/api/v1/workers/<worker_id>/operations", responses=_REQUEST_RESPONSES)
def request_operation(worker_id: WorkerId, body: OperationRequest) -> Response[OperationView]:
    op = operations.request(
        default_context(), worker_id, body.name, body.parameters, actor=caller(router.current_event)
    )
    return Response(status_code=HTTPStatus.ACCEPTED, content_type=JSON, body=OperationView.of(op))


@router.get(
    "/api/v1/workers/<worker_id>/operations",
    responses=responses({200: ("one page of the worker's operations, newest first", OperationPage)}),
)
def list_operations(
    worker_id: WorkerId,
    limit: Annotated[int, Query(ge=1, le=100)] = 50,
    next_token: PageToken = None,
) -> OperationPage:
    found = operations.page(default_context(), worker_id, limit=limit, next_token=next_token)
    return OperationPage(items=[OperationView.of(o) for o in found.items], next_token=found.next_token)
