"""Every error answer of the admin API: one mapping from typed error to HTTP status, one body shape.

A client mistake is a 4xx that names the field; a 5xx means a bug of ours, or (503) a drain workflow that
could not start, which is rare and safe to retry. docs/api.md lists the codes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cache
from http import HTTPStatus
from typing import Any, Final

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.openapi.exceptions import RequestValidationError
from aws_lambda_powertools.event_handler.openapi.types import OpenAPIResponse
from aws_lambda_powertools.utilities.idempotency.exceptions import (
    IdempotencyAlreadyInProgressError,
    IdempotencyValidationError,
)

from fleetkeeper.api.schemas import ErrorBody, ErrorDetail
from fleetkeeper.domain.errors import (
    CapacityUnavailable,
    Conflict,
    FleetkeeperError,
    IllegalTransition,
    InvalidInput,
    NotFound,
    Unavailable,
    WorkflowUnavailable,
    listed,
)
from fleetkeeper.observability import logger

JSON: Final = "application/json"
# An error answer never grows with the request: a 422 lists at most this many problems (and says how
# many there were), and no client text it quotes is longer than MAX_QUOTED characters. A body with
# 90,000 unknown keys once answered 7 MB, past Lambda's 6 MB response limit (a 502 on AWS).
MAX_ERROR_DETAILS: Final = 20
MAX_QUOTED: Final = 200


def clipped(text: str, limit: int = MAX_QUOTED) -> str:
    """Client text as an error quotes it: at most `limit` characters, marked when cut."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


class UnsupportedMediaType(FleetkeeperError):
    code = "UNSUPPORTED_MEDIA_TYPE"

    def __init__(self, content_type: str) -> None:
        super().__init__(f"send the body as Content-Type: application/json, not {clipped(content_type)}")


class MalformedJson(FleetkeeperError):
    code = "MALFORMED_JSON"


class PayloadTooLarge(FleetkeeperError):
    code = "PAYLOAD_TOO_LARGE"

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than {limit} bytes, the most the API reads")
        self.limit = limit

    def details(self) -> dict[str, str | int | None]:
        return {"max_bytes": self.limit}


class IdempotencyKeyReused(FleetkeeperError):
    code = "IDEMPOTENCY_KEY_REUSED"

    def __init__(self) -> None:
        super().__init__("this Idempotency-Key was used with another body; use a new key for a new request")


class RequestInProgress(FleetkeeperError):
    code = "REQUEST_IN_PROGRESS"

    def __init__(self) -> None:
        super().__init__("a request with this Idempotency-Key is still running; retry in a few seconds")


class MethodNotAllowed(FleetkeeperError):
    code = "METHOD_NOT_ALLOWED"

    def __init__(self, method: str, path: str, allowed: list[str]) -> None:
        super().__init__(f"{path} does not answer {method}; it answers {', '.join(allowed)}")
        self.allowed = allowed

    def details(self) -> dict[str, str | int | None]:
        return {"allowed": ", ".join(self.allowed)}


class Forbidden(FleetkeeperError):
    """The signing principal may call the API but not this route (the internal routes: tooling only)."""

    code = "FORBIDDEN"


class ValidationFailed(FleetkeeperError):
    """A body, query, path or header value of the wrong type, shape or range.

    `total` is how many problems were found when `details` holds only the first of them."""

    code = "VALIDATION_FAILED"

    def __init__(self, details: Sequence[ErrorDetail], total: int | None = None) -> None:
        self.total = max(total or 0, len(details))
        self.fields = [
            ErrorDetail(field=clipped(d.field), reason=clipped(d.reason)) for d in details[:MAX_ERROR_DETAILS]
        ]
        names = [d.field for d in self.fields]
        super().__init__("invalid request: " + listed(names, MAX_ERROR_DETAILS, self.total))


STATUS_FOR_ERROR: Final[dict[type[FleetkeeperError], HTTPStatus]] = {
    NotFound: HTTPStatus.NOT_FOUND,
    Forbidden: HTTPStatus.FORBIDDEN,
    MethodNotAllowed: HTTPStatus.METHOD_NOT_ALLOWED,
    InvalidInput: HTTPStatus.UNPROCESSABLE_ENTITY,
    ValidationFailed: HTTPStatus.UNPROCESSABLE_ENTITY,
    IdempotencyKeyReused: HTTPStatus.UNPROCESSABLE_ENTITY,
    MalformedJson: HTTPStatus.BAD_REQUEST,
    PayloadTooLarge: HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
    UnsupportedMediaType: HTTPStatus.UNSUPPORTED_MEDIA_TYPE,
    IllegalTransition: HTTPStatus.CONFLICT,
    Conflict: HTTPStatus.CONFLICT,
    RequestInProgress: HTTPStatus.CONFLICT,
    # No free slot is an answer about the fleet, not a failure of the service: nobody is paged for it.
    CapacityUnavailable: HTTPStatus.CONFLICT,
    # Step Functions refused to start (throttled or unavailable after retries); nothing was changed.
    WorkflowUnavailable: HTTPStatus.SERVICE_UNAVAILABLE,
    # AWS stayed throttled or unavailable through every retry; nothing was half-written.
    Unavailable: HTTPStatus.SERVICE_UNAVAILABLE,
}
RETRY_AFTER_SECONDS: Final = 5

_DESCRIPTIONS: Final[dict[int, str]] = {
    400: (
        "MALFORMED_JSON: the body is not JSON the API reads (duplicate keys, NaN, a number out of range, "
        "nesting too deep)"
    ),
    403: (
        "FORBIDDEN: the caller is not one of the stage's tooling principals (internal routes), or "
        "worker-agent principals (the health route)"
    ),
    404: "NOT_FOUND: no such entity or route",
    405: "METHOD_NOT_ALLOWED: the path exists, the method does not",
    409: (
        "ILLEGAL_TRANSITION, CONFLICT, DRAIN_IN_PROGRESS, NO_CAPACITY, OPERATION_IN_FLIGHT or "
        "REQUEST_IN_PROGRESS"
    ),
    413: "PAYLOAD_TOO_LARGE: the body is larger than the API reads (details.max_bytes)",
    415: "UNSUPPORTED_MEDIA_TYPE: the Content-Type is not application/json",
    422: "VALIDATION_FAILED, INVALID_INPUT or IDEMPOTENCY_KEY_REUSED; details name each field",
    500: "INTERNAL: a bug of ours",
    503: f"WORKFLOW_UNAVAILABLE: the drain workflow could not start; retry after {RETRY_AFTER_SECONDS} s",
}


def status_of(exc: FleetkeeperError) -> HTTPStatus:
    return next(
        (code for kind, code in STATUS_FOR_ERROR.items() if isinstance(exc, kind)),
        HTTPStatus.INTERNAL_SERVER_ERROR,
    )


# Every route that takes a body may refuse it before its model sees it (api/body.py); api/app.py adds
# these to each such route's documented answers.
BODY_ERRORS: Final = (400, 413, 415)


def description(status: int) -> str:
    """What an error status means in this API, as the contract documents it."""
    return _DESCRIPTIONS[status]


def responses(
    success: dict[int, tuple[str, Any]], *errors: int, conflict: str | None = None
) -> dict[int, OpenAPIResponse]:
    """A route's OpenAPI responses: its success statuses with their models, then the error statuses it
    answers, all with the one ErrorBody. 422 is always there (every route validates its input) and so is
    404 (a path with characters no route accepts is not found, whichever route it resembles). `conflict`
    describes the route's 409 where it has a reason of its own to give."""
    documented: dict[int, OpenAPIResponse] = {
        status: {"description": description, "content": {JSON: {"model": model}}}
        for status, (description, model) in success.items()
    }
    for status in sorted({*errors, 404, 422}):
        text = conflict if status == HTTPStatus.CONFLICT and conflict else _DESCRIPTIONS[status]
        documented[status] = {"description": text, "content": {JSON: {"model": ErrorBody}}}
    return documented


def error_response(exc: FleetkeeperError) -> Response[Any]:
    status = status_of(exc)
    details: list[ErrorDetail] | dict[str, str | int | None] | None = exc.details() or None
    if isinstance(exc, InvalidInput):
        details = [ErrorDetail(field=exc.field, reason=exc.reason)]
    total = None
    if isinstance(exc, ValidationFailed):
        details = exc.fields
        total = exc.total if exc.total > len(exc.fields) else None
    body = ErrorBody(error=exc.code, message=exc.message, details=details, details_total=total)
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == HTTPStatus.SERVICE_UNAVAILABLE else None
    if isinstance(exc, MethodNotAllowed):
        headers = {"Allow": ", ".join(exc.allowed)}
    return Response(
        status_code=status,
        content_type=JSON,
        body=json.dumps(body.model_dump(exclude_none=True), default=str),
        headers=headers,
    )


def register(app: APIGatewayRestResolver) -> None:
    """Install the handlers that turn every exception a route can raise into an ErrorBody answer."""

    def on_domain_error(exc: FleetkeeperError) -> Response[Any]:
        return error_response(exc)

    def on_validation_error(exc: RequestValidationError) -> Response[Any]:
        errors = exc.errors()
        details = [
            ErrorDetail(
                field=".".join(str(part) for part in e.get("loc", ())) or "body",
                # pydantic words a validator's own ValueError "Value error, <it>": the reason is <it>.
                reason=str(e.get("msg") or e.get("type") or "invalid").removeprefix("Value error, "),
            )
            for e in errors[:MAX_ERROR_DETAILS]
        ]
        return error_response(ValidationFailed(details, total=len(errors)))

    def on_idempotency_key_reused(exc: IdempotencyValidationError) -> Response[Any]:
        return error_response(IdempotencyKeyReused())

    def on_in_progress(exc: IdempotencyAlreadyInProgressError) -> Response[Any]:
        return error_response(RequestInProgress())

    def on_unexpected(exc: Exception) -> Response[Any]:
        logger.exception("unhandled error")
        body = ErrorBody(error="INTERNAL", message="internal error")
        return Response(
            status_code=HTTPStatus.INTERNAL_SERVER_ERROR,
            content_type=JSON,
            body=body.model_dump_json(exclude_none=True),
        )

    def on_not_found(_: Exception) -> Response[Any]:
        event = app.current_event
        allowed = allowed_methods(event.path)
        # A path whose characters no route accepts resembles a route but is still not found.
        if allowed and event.http_method not in allowed:
            return error_response(MethodNotAllowed(event.http_method, event.path, allowed))
        return error_response(NotFound("route", event.path))

    @cache
    def route_patterns() -> list[tuple[re.Pattern[str], list[str]]]:
        paths = app.get_openapi_schema().paths or {}
        return [
            (
                re.compile("^" + re.sub(r"\\{[^/]+?\\}", "[^/]+", re.escape(path)) + "$"),
                [m.upper() for m in ("get", "post", "put", "patch") if getattr(item, m, None) is not None],
            )
            for path, item in paths.items()
        ]

    def allowed_methods(path: str) -> list[str]:
        return next((methods for pattern, methods in route_patterns() if pattern.match(path)), [])

    # Registered by call rather than as decorators: the resolver's decorator is untyped.
    app.exception_handler(FleetkeeperError)(on_domain_error)
    app.exception_handler(RequestValidationError)(on_validation_error)
    app.exception_handler(IdempotencyValidationError)(on_idempotency_key_reused)
    app.exception_handler(IdempotencyAlreadyInProgressError)(on_in_progress)
    app.exception_handler(Exception)(on_unexpected)
    app.not_found(on_not_found)
