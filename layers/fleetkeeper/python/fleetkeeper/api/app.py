"""Routes of the admin API. Each route parses, calls one service, and returns a typed body."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from http import HTTPStatus
from typing import Annotated, Any

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.params import Query
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError

from fleetkeeper.api.schemas import (
    CreateWorkerRequest,
    DesiredStatusRequest,
    DrainRequest,
    ErrorBody,
    ErrorDetail,
    InstancePage,
    InstanceStateRequest,
    InstanceView,
    InternalStatusRequest,
    PlaceInstanceRequest,
    PoolDrainRequest,
    PoolList,
    PoolRequest,
    PoolView,
    Stats,
    TemplateList,
    TemplateRequest,
    TemplateView,
    WorkerPage,
    WorkerView,
)
from fleetkeeper.domain.errors import (
    CapacityUnavailable,
    Conflict,
    FleetkeeperError,
    IllegalTransition,
    InvalidInput,
    NotFound,
    Unavailable,
    WorkflowUnavailable,
)
from fleetkeeper.domain.lifecycle import InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.observability import logger
from fleetkeeper.services import catalog, drains, instances, placement, stats, workers
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.drains import DrainStatus
from fleetkeeper.store.schema import TTL_ATTRIBUTE

app = APIGatewayRestResolver(enable_validation=True)
idempotency_config = IdempotencyConfig(raise_on_no_idempotency_key=False)

_STATUS_FOR_ERROR: dict[type[FleetkeeperError], HTTPStatus] = {
    NotFound: HTTPStatus.NOT_FOUND,
    InvalidInput: HTTPStatus.UNPROCESSABLE_ENTITY,
    IllegalTransition: HTTPStatus.CONFLICT,
    Conflict: HTTPStatus.CONFLICT,
    CapacityUnavailable: HTTPStatus.SERVICE_UNAVAILABLE,
    WorkflowUnavailable: HTTPStatus.SERVICE_UNAVAILABLE,
    Unavailable: HTTPStatus.SERVICE_UNAVAILABLE,
}
MAX_IDEMPOTENCY_KEY = 128
UNKNOWN_CALLER = "unknown-caller"


def ctx() -> Context:
    return default_context()


def caller() -> str:
    """The IAM identity API Gateway authenticated (AWS_IAM authorization)."""
    identity = app.current_event.request_context.identity
    return identity.user_arn or identity.caller or UNKNOWN_CALLER


def _json_response(status: HTTPStatus, body: dict[str, Any]) -> Response[Any]:
    return Response(status_code=status, content_type="application/json", body=json.dumps(body, default=str))


def _error(status: HTTPStatus, error: ErrorBody) -> Response[Any]:
    return _json_response(status, error.model_dump(exclude_none=True))


# ---- errors: one mapping from typed errors to HTTP statuses ------------------------------------------


def handle_domain_error(exc: FleetkeeperError) -> Response[Any]:
    status = next(
        (code for kind, code in _STATUS_FOR_ERROR.items() if isinstance(exc, kind)),
        HTTPStatus.INTERNAL_SERVER_ERROR,
    )
    details: list[ErrorDetail] | dict[str, str | int | None] = exc.details()
    if isinstance(exc, InvalidInput):
        details = [ErrorDetail(field=exc.field, reason=exc.reason)]
    return _error(status, ErrorBody(error=exc.code, message=exc.message, details=details or None))


def _foreign_content_type() -> str | None:
    """The body's content type when it is not JSON (a form body would be read as form fields)."""
    event = app.current_event
    content_type = (event.headers.get("Content-Type") or event.headers.get("content-type") or "").lower()
    if event.body and content_type and not content_type.startswith("application/json"):
        return content_type
    return None


def handle_validation_error(exc: RequestValidationError) -> Response[Any]:
    foreign = _foreign_content_type()
    if foreign:
        return _error(
            HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
            ErrorBody(
                error="UNSUPPORTED_MEDIA_TYPE",
                message=f"send the body as Content-Type: application/json, not {foreign}",
            ),
        )
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return _error(
            HTTPStatus.BAD_REQUEST, ErrorBody(error="MALFORMED_JSON", message="the body is not valid JSON")
        )
    details = [
        ErrorDetail(
            field=".".join(str(part) for part in e.get("loc", ())) or "body",
            reason=str(e.get("msg") or e.get("type") or "invalid"),
        )
        for e in errors
    ]
    fields = ", ".join(d.field for d in details)
    return _error(
        HTTPStatus.UNPROCESSABLE_ENTITY,
        ErrorBody(error="VALIDATION_FAILED", message=f"invalid request: {fields}", details=details),
    )


# ---- idempotency: a repeated Idempotency-Key gets the first response -------------------------------


@cache
def _persistence(table_name: str) -> DynamoDBPersistenceLayer:
    """One persistence layer per table: the table is fixed in Lambda, but not across local test runs."""
    return DynamoDBPersistenceLayer(
        table_name=table_name,
        key_attr="PK",
        sort_key_attr="SK",
        static_pk_value="IDEMPOTENCY",
        expiry_attr=TTL_ATTRIBUTE,
    )


def _replay_or_run(request: dict[str, str], run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Decorated per call so the persistence layer is built from settings only when first needed."""
    settings = ctx().settings
    idempotency_config.expires_after_seconds = settings.idempotency_ttl_seconds
    replayable = idempotent_function(
        data_keyword_argument="request",
        config=idempotency_config,
        persistence_store=_persistence(settings.table_name),
    )(_run_request)
    return dict(replayable(request=request, run=run))


def _run_request(request: dict[str, str], run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    return run()


def idempotency_middleware(
    resolver: APIGatewayRestResolver, next_middleware: NextMiddleware
) -> Response[Any]:
    key = resolver.current_event.headers.get("Idempotency-Key") or resolver.current_event.headers.get(
        "idempotency-key"
    )
    if not key or resolver.current_event.http_method not in ("POST", "PUT"):
        return next_middleware(resolver)
    if len(key) > MAX_IDEMPOTENCY_KEY:
        return _error(
            HTTPStatus.UNPROCESSABLE_ENTITY,
            ErrorBody(
                error="VALIDATION_FAILED",
                message="Idempotency-Key is too long",
                details=[
                    ErrorDetail(
                        field="header.Idempotency-Key", reason=f"at most {MAX_IDEMPOTENCY_KEY} characters"
                    )
                ],
            ),
        )
    request = {
        "key": key,
        "caller": caller(),
        "method": resolver.current_event.http_method,
        "path": resolver.current_event.path,
        "body": resolver.current_event.body or "",
    }

    def run() -> dict[str, Any]:
        response = next_middleware(resolver)
        body = response.body if isinstance(response.body, str) else json.dumps(response.body, default=str)
        return {
            "status_code": response.status_code,
            "body": body,
            "content_type": response.content_type or "",
        }

    stored = _replay_or_run(request, run)
    return Response(
        status_code=stored["status_code"],
        body=stored["body"],
        content_type=stored["content_type"] or "application/json",
    )


app.use(middlewares=[idempotency_middleware])


# ---- workers -----------------------------------------------------------------------------------------


@app.get("/api/v1/workers")
def list_workers(
    status: Annotated[WorkerStatus | None, Query()] = None,
    region: Annotated[str | None, Query(max_length=32)] = None,
    pool: Annotated[str | None, Query(max_length=64)] = None,
    template: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> WorkerPage:
    page = ctx().store.list_workers(
        status=status, region=region, pool=pool, template=template, limit=limit, next_token=next_token
    )
    return WorkerPage(items=[WorkerView.of(w) for w in page.items], next_token=page.next_token)


@app.post("/api/v1/workers")
def create_worker(body: CreateWorkerRequest) -> Response[WorkerView]:
    context = ctx()
    worker = workers.create_worker(
        context.store,
        template=body.template,
        region=body.region or context.settings.default_region,
        pool=body.pool,
        actor=caller(),
    )
    return Response(
        status_code=HTTPStatus.CREATED, content_type="application/json", body=WorkerView.of(worker)
    )


@app.get("/api/v1/workers/<worker_id>")
def get_worker(worker_id: str) -> WorkerView:
    return WorkerView.of(ctx().store.get_worker(worker_id))


@app.put("/api/v1/workers/<worker_id>/desired-status")
def put_desired_status(worker_id: str, body: DesiredStatusRequest) -> WorkerView:
    worker = workers.set_desired_status(
        ctx().store, worker_id, WorkerStatus(body.desired_status), actor=caller()
    )
    return WorkerView.of(worker)


@app.post("/api/v1/workers/<worker_id>/drain")
def drain_worker(worker_id: str, body: DrainRequest) -> Response[DrainStatus]:
    if body.dry_run:
        plan = drains.plan_worker_drain(
            ctx(),
            worker_id,
            timeout_seconds=body.timeout_seconds,
            then=body.then,
            reason=body.reason,
            actor=caller(),
        )
        return Response(status_code=HTTPStatus.OK, content_type="application/json", body=plan)
    status = drains.start_worker_drain(
        ctx(),
        worker_id,
        actor=caller(),
        reason=body.reason,
        timeout_seconds=body.timeout_seconds,
        then=body.then,
    )
    return Response(status_code=HTTPStatus.ACCEPTED, content_type="application/json", body=status)


@app.get("/api/v1/workers/<worker_id>/drain")
def get_drain(worker_id: str) -> DrainStatus:
    return drains.worker_drain_status(ctx(), worker_id)


@app.post("/api/v1/workers/<worker_id>/cancel-drain")
def cancel_drain(worker_id: str) -> WorkerView:
    return WorkerView.of(drains.cancel_worker_drain(ctx(), worker_id, actor=caller()))


@app.post("/api/internal/workers/<worker_id>/status")
def set_observed_status(worker_id: str, body: InternalStatusRequest) -> WorkerView:
    # The audit names the authenticated caller; `terminated_by` is only what the record says ended it.
    worker = workers.record_observed_status(
        ctx(),
        worker_id,
        body.status,
        actor=caller(),
        reason=body.terminated_reason,
        terminated_by=body.terminated_by,
    )
    return WorkerView.of(worker)


# ---- templates ---------------------------------------------------------------------------------------


@app.get("/api/v1/templates")
def list_templates() -> TemplateList:
    return TemplateList(items=[TemplateView.of(t) for t in ctx().store.list_templates()])


@app.get("/api/v1/templates/<name>")
def get_template(name: str) -> TemplateView:
    return TemplateView.of(ctx().store.get_template(name))


@app.put("/api/v1/templates/<name>")
def put_template(name: str, body: TemplateRequest) -> Response[TemplateView]:
    if not catalog.is_valid_name(name):
        raise InvalidInput("name", "letters, digits, '.', '_' or '-'; 1-64 characters")
    store = ctx().store
    existed = store.find_template(name) is not None
    template = WorkerTemplate.model_validate({"name": name, **body.model_dump()})
    stored = catalog.put_template(store, template, actor=caller())
    status = HTTPStatus.OK if existed else HTTPStatus.CREATED
    return Response(status_code=status, content_type="application/json", body=TemplateView.of(stored))


# ---- instances ---------------------------------------------------------------------------------------


@app.post("/api/v1/instances")
def place_instance(body: PlaceInstanceRequest) -> Response[InstanceView]:
    instance = placement.place_instance(
        ctx().store,
        actor=caller(),
        template=body.template,
        pool=body.pool,
        worker_id=body.worker_id,
        strategy=body.strategy,
        timeslot_start=body.timeslot_start,
        timeslot_end=body.timeslot_end,
    )
    return Response(
        status_code=HTTPStatus.CREATED, content_type="application/json", body=InstanceView.of(instance)
    )


@app.get("/api/v1/instances")
def list_instances(
    worker_id: Annotated[str | None, Query(max_length=128)] = None,
    state: Annotated[InstanceState | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    next_token: Annotated[str | None, Query(max_length=2048)] = None,
) -> InstancePage:
    page = ctx().store.list_instances(worker_id=worker_id, state=state, limit=limit, next_token=next_token)
    return InstancePage(items=[InstanceView.of(i) for i in page.items], next_token=page.next_token)


@app.get("/api/v1/instances/<instance_id>")
def get_instance(instance_id: str) -> InstanceView:
    return InstanceView.of(ctx().store.get_instance(instance_id))


@app.post("/api/v1/instances/<instance_id>/state")
def set_instance_state(instance_id: str, body: InstanceStateRequest) -> InstanceView:
    return InstanceView.of(
        instances.change_instance_state(ctx(), instance_id, body.state, actor=caller(), reason=body.reason)
    )


# ---- pools -------------------------------------------------------------------------------------------


@app.get("/api/v1/pools")
def list_pools() -> PoolList:
    return PoolList(items=[PoolView.of(p) for p in ctx().store.list_pools()])


@app.get("/api/v1/pools/<name>")
def get_pool(name: str) -> PoolView:
    store = ctx().store
    pool = store.get_pool(name)
    return PoolView.of(pool, active_instances=store.pool_active_instances(name))


@app.put("/api/v1/pools/<name>")
def put_pool(name: str, body: PoolRequest) -> Response[PoolView]:
    if not catalog.is_valid_name(name):
        raise InvalidInput("name", "letters, digits, '.', '_' or '-'; 1-64 characters")
    pool, created = catalog.put_pool(
        ctx().store,
        name,
        actor=caller(),
        description=body.description,
        status=PoolStatus(body.status) if body.status else None,
    )
    status = HTTPStatus.CREATED if created else HTTPStatus.OK
    return Response(status_code=status, content_type="application/json", body=PoolView.of(pool))


@app.post("/api/v1/pools/<name>/drain")
def drain_pool(name: str, body: PoolDrainRequest) -> Response[PoolView]:
    pool = drains.start_pool_drain(
        ctx(), name, actor=caller(), timeout_seconds=body.timeout_seconds, then=body.then
    )
    return Response(status_code=HTTPStatus.ACCEPTED, content_type="application/json", body=PoolView.of(pool))


@app.post("/api/v1/pools/<name>/cancel-drain")
def cancel_pool_drain(name: str) -> PoolView:
    return PoolView.of(drains.cancel_pool_drain(ctx(), name, actor=caller()))


# ---- stats and contract ------------------------------------------------------------------------------


@app.get("/api/v1/stats")
def get_stats() -> Stats:
    return Stats.model_validate(stats.fleet_stats(ctx()))


@app.get("/openapi.json", include_in_schema=False)
def openapi() -> Response[Any]:
    return Response(
        status_code=HTTPStatus.OK,
        content_type="application/json",
        body=app.get_openapi_json_schema(title="fleetkeeper admin API", version="1"),
    )


@app.not_found
def not_found(_: Exception) -> Response[Any]:
    path = app.current_event.path
    return _error(HTTPStatus.NOT_FOUND, ErrorBody(error="NOT_FOUND", message=f"no route for {path}"))


def log_unexpected(exc: Exception) -> Response[Any]:
    logger.exception("unhandled error")
    return _error(HTTPStatus.INTERNAL_SERVER_ERROR, ErrorBody(error="INTERNAL", message="internal error"))


def handle_request_in_progress(exc: IdempotencyAlreadyInProgressError) -> Response[Any]:
    return _error(
        HTTPStatus.CONFLICT,
        ErrorBody(
            error="REQUEST_IN_PROGRESS",
            message="a request with this Idempotency-Key is still running; retry in a few seconds",
        ),
    )


# Registered by call rather than as decorators: the resolver's decorator is untyped.
app.exception_handler(FleetkeeperError)(handle_domain_error)
app.exception_handler(RequestValidationError)(handle_validation_error)
app.exception_handler(IdempotencyAlreadyInProgressError)(handle_request_in_progress)
app.exception_handler(Exception)(log_unexpected)
