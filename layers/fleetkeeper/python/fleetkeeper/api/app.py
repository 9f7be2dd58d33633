"""The admin API: the resource routers, the error mapping and idempotency, composed into one resolver.

Routes live in api/routes/<resource>.py (one Powertools Router each), errors in api/errors.py, the
Idempotency-Key handling in api/idempotency.py. This module only composes them and publishes the
contract at /openapi.json (and Swagger UI at /docs).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import TYPE_CHECKING, Any, Final

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.api_gateway import ApiGatewayResolver
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
from aws_lambda_powertools.event_handler.middlewares.openapi_validation import (
    OpenAPIRequestValidationMiddleware,
)
from aws_lambda_powertools.event_handler.types import EventHandlerInstance

from fleetkeeper.api import body, errors, idempotency, query
from fleetkeeper.api.routes import (
    ResourceRouter,
    audit,
    drains,
    instances,
    internal,
    operations,
    orphans,
    pools,
    rollouts,
    stats,
    templates,
    workers,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    # Powertools' OpenAPI models take about 70 ms to import: only the contract needs them, so they load
    # on the first request for /openapi.json or /docs, not in every cold start.
    from aws_lambda_powertools.event_handler.openapi.models import OpenAPI, SecurityScheme
    from aws_lambda_powertools.utilities.typing import LambdaContext

TITLE: Final = "fleetkeeper admin API"
VERSION: Final = "1"
DOCS_PATH: Final = "/docs"
OPENAPI_PATH: Final = "/openapi.json"
SIGV4: Final = "sigv4"

# Every router the API serves. A new resource (e.g. api/routes/audit.py) is one import and one entry here.
ROUTERS: Final[tuple[ResourceRouter, ...]] = (
    workers.router,
    drains.router,
    templates.router,
    instances.router,
    pools.router,
    stats.router,
    internal.router,
    audit.router,
    orphans.router,
    operations.router,
    rollouts.router,
)

# OpenAPI links: the id a response returns, and the operations that take it as a path parameter.
# They document how calls chain, and drive schemathesis' stateful sequences.
_ID_LINKS: Final[dict[tuple[str, str, str], tuple[str, str, tuple[tuple[str, str], ...]]]] = {
    ("/api/v1/workers", "post", "201"): (
        "id",
        "worker_id",
        (
            ("/api/v1/workers/{worker_id}", "get"),
            ("/api/v1/workers/{worker_id}/desired-status", "put"),
            ("/api/v1/workers/{worker_id}/drain", "post"),
            ("/api/v1/workers/{worker_id}/drain", "get"),
            ("/api/v1/workers/{worker_id}/drain", "patch"),
            ("/api/v1/workers/{worker_id}/drain/force", "post"),
            ("/api/v1/workers/{worker_id}/cancel-drain", "post"),
            ("/api/v1/workers/{worker_id}/operations", "post"),
            ("/api/v1/workers/{worker_id}/operations", "get"),
        ),
    ),
    ("/api/v1/instances", "post", "201"): (
        "id",
        "instance_id",
        (("/api/v1/instances/{instance_id}", "get"), ("/api/v1/instances/{instance_id}/state", "post")),
    ),
    ("/api/v1/templates/{name}", "put", "201"): ("name", "name", (("/api/v1/templates/{name}", "get"),)),
    ("/api/v1/rollouts", "post", "202"): (
        "id",
        "rollout_id",
        (
            ("/api/v1/rollouts/{rollout_id}", "get"),
            ("/api/v1/rollouts/{rollout_id}/pause", "post"),
            ("/api/v1/rollouts/{rollout_id}/resume", "post"),
            ("/api/v1/rollouts/{rollout_id}/cancel", "post"),
        ),
    ),
    ("/api/v1/pools/{name}", "put", "201"): (
        "name",
        "name",
        (
            ("/api/v1/pools/{name}", "get"),
            ("/api/v1/pools/{name}/drain", "post"),
            ("/api/v1/pools/{name}/cancel-drain", "post"),
        ),
    ),
}


def _add_links(document: dict[str, Any]) -> None:
    paths = document["paths"]
    for (path, method, status), (field, parameter, targets) in _ID_LINKS.items():
        response = paths[path][method]["responses"][int(status)]
        response["links"] = {
            paths[target][verb]["operationId"]: {
                "operationId": paths[target][verb]["operationId"],
                "parameters": {parameter: f"$response.body#/{field}"},
            }
            for target, verb in targets
        }


def _add_body_errors(document: dict[str, Any]) -> None:
    """Every route that takes a body documents the refusals api/body.py may answer before its model runs,
    with the ErrorBody every error shares (the one its 422 carries)."""
    for item in document["paths"].values():
        for operation in item.values():
            if not isinstance(operation, dict) or "requestBody" not in operation:
                continue
            answers = operation["responses"]
            for status in errors.BODY_ERRORS:
                answers.setdefault(
                    status, {"description": errors.description(status), "content": answers[422]["content"]}
                )


# Powertools documents its own 422 body; the API answers every error with ErrorBody instead.
_POWERTOOLS_VALIDATION_SCHEMAS: Final = ("HTTPValidationError", "ValidationError")


class StrictRequests(OpenAPIRequestValidationMiddleware):
    """Request validation that reads a request only as the contract writes it, before any model does.

    The query string is checked by api/query.py: each parameter once, each value spelt as its type. The
    body is read by api/body.py: one JSON object, or nothing, or a 4xx. Powertools would read form and
    multipart bodies as fields, compare the media type case-sensitively, let duplicate keys and NaN
    through, and take the first element of an array as the body.
    """

    def handler(self, app: EventHandlerInstance, next_middleware: NextMiddleware) -> Response[Any]:
        query.check(app.context["_route"], app.current_event)
        return super().handler(app, next_middleware)

    def _get_body(self, app: EventHandlerInstance) -> dict[str, Any] | None:  # type: ignore[override]
        # Powertools reads None as "no body": the route's optional body takes its defaults.
        return body.read_object(app.current_event)


class AdminApiResolver(APIGatewayRestResolver):
    """The REST resolver whose OpenAPI document describes the bodies the API really sends."""

    def __init__(self) -> None:
        super().__init__(enable_validation=True)
        # The resolver runs this middleware first on every validated route.
        self._request_validation_middleware = StrictRequests()  # type: ignore[no-untyped-call]
        self._docs_enabled = False

    def resolve(self, event: Mapping[str, Any], context: LambdaContext) -> dict[str, Any]:
        # Swagger UI's route is added on the first request for it: enabling it imports the OpenAPI
        # models, which every other cold start can do without (see the imports above).
        if not self._docs_enabled and str(event.get("path") or "").startswith(DOCS_PATH):
            self.enable_swagger(path=DOCS_PATH, title=TITLE, version=VERSION)
            self._docs_enabled = True
        return super().resolve(event, context)

    @staticmethod
    def _compile_regex(rule: str, base_regex: str = r"^{}/*\Z") -> Any:
        # Powertools anchors routes with `$`, which also matches before a trailing newline: the path
        # "/api/v1/pools/\n" (a client's "%0A") answered as the pool list. `\Z` ends at the end only.
        return ApiGatewayResolver._compile_regex(rule, base_regex)

    def get_openapi_schema(self, **kwargs: Any) -> OpenAPI:
        from aws_lambda_powertools.event_handler.openapi.models import OpenAPI  # noqa: PLC0415 - see above

        # /docs passes its own (empty) security schemes; the contract always publishes SigV4.
        kwargs["security_schemes"] = kwargs.get("security_schemes") or _security_schemes()
        document = super().get_openapi_schema(**kwargs).model_dump(by_alias=True, exclude_none=True)
        schemas = document.get("components", {}).get("schemas", {})
        for name in _POWERTOOLS_VALIDATION_SCHEMAS:
            schemas.pop(name, None)
        # One tag per resource, in the routers' order, each saying what the resource is (Swagger UI shows
        # it above the resource's routes).
        document["tags"] = [{"name": r.tag, "description": r.description} for r in ROUTERS]
        _add_links(document)
        _add_body_errors(document)
        return OpenAPI.model_validate(document)


def _security_schemes() -> dict[str, SecurityScheme]:
    from aws_lambda_powertools.event_handler.openapi.models import APIKey, APIKeyIn  # noqa: PLC0415

    sigv4 = {
        "type": "apiKey",
        "in": APIKeyIn.header.value,
        "name": "Authorization",
        "description": "AWS Signature Version 4 (API Gateway AWS_IAM authorization)",
        "x-amazon-apigateway-authtype": "awsSigv4",
    }
    return {SIGV4: APIKey.model_validate(sigv4)}


app = AdminApiResolver()
app.configure_openapi(
    title=TITLE,
    version=VERSION,
    description=(
        "Operators' control API for fleetkeeper. Every request is signed with AWS SigV4 "
        "(API Gateway AWS_IAM authorization). Errors are ErrorBody: {error, message, details}."
    ),
    security=[{SIGV4: []}],
)
app.use(middlewares=[idempotency.middleware])
for _router in ROUTERS:
    app.include_router(_router)
errors.register(app)


@app.get(OPENAPI_PATH, include_in_schema=False)
def openapi() -> Response[Any]:
    from aws_lambda_powertools.event_handler.openapi.models import Server  # noqa: PLC0415 - see above

    # The server the caller reached this document on, as /docs computes it for Swagger UI: the stage's
    # path on an execute-api URL, "/" behind a custom domain or locally. The two never disagree.
    server = Server(url=app._get_base_path() or "/")
    return Response(
        status_code=HTTPStatus.OK,
        content_type=errors.JSON,
        body=app.get_openapi_json_schema(servers=[server]),
    )


def contract() -> dict[str, Any]:
    """The OpenAPI document as JSON data, exactly as /openapi.json serves it."""
    document: dict[str, Any] = app.get_openapi_schema().model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
    return document
