"""Idempotency-Key on POST, PUT and PATCH: a repeat gets the first response, another body under the key
is a 422.

The record is keyed by (key, caller, method, path) and remembers a hash of the parsed body. Powertools
hashes the body with sorted keys, so the same JSON in another key order is the same request; a different
body under a used key raises IdempotencyValidationError, answered as IDEMPOTENCY_KEY_REUSED.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from http import HTTPStatus
from typing import Any, Final

from aws_lambda_powertools.event_handler import APIGatewayRestResolver, Response
from aws_lambda_powertools.event_handler.middlewares import NextMiddleware
from aws_lambda_powertools.utilities.idempotency import (
    DynamoDBPersistenceLayer,
    IdempotencyConfig,
    idempotent_function,
)
from aws_lambda_powertools.utilities.typing import LambdaContext

from fleetkeeper.api.errors import ValidationFailed, error_response
from fleetkeeper.api.principal import caller
from fleetkeeper.api.schemas import ErrorDetail
from fleetkeeper.services.context import default_context
from fleetkeeper.store.schema import PARTITION_KEY, SORT_KEY, TTL_ATTRIBUTE

HEADER: Final = "Idempotency-Key"
MAX_KEY_LENGTH: Final = 128
IDEMPOTENT_METHODS: Final = frozenset({"POST", "PUT", "PATCH"})

StoredResponse = dict[str, Any]
Replay = Callable[..., StoredResponse]


@cache
def _replayer(table_name: str, ttl_seconds: int, dynamodb: Any) -> tuple[IdempotencyConfig, Replay]:
    """The idempotent wrapper, built once per table and client (once per Lambda container). It uses the
    process's shared client: its own would parse the DynamoDB model again on the first request."""
    config = IdempotencyConfig(
        event_key_jmespath="[key, caller, method, path]",
        payload_validation_jmespath="body",
        raise_on_no_idempotency_key=True,
        expires_after_seconds=ttl_seconds,
    )
    persistence = DynamoDBPersistenceLayer(
        table_name=table_name,
        key_attr=PARTITION_KEY,
        sort_key_attr=SORT_KEY,
        static_pk_value="IDEMPOTENCY",
        expiry_attr=TTL_ATTRIBUTE,
        boto3_client=dynamodb,
    )

    @idempotent_function(  # type: ignore[untyped-decorator]  # Powertools' decorator is unannotated
        data_keyword_argument="request", config=config, persistence_store=persistence
    )
    def run_once(request: dict[str, Any], run: Callable[[], StoredResponse]) -> StoredResponse:
        return run()

    return config, run_once


def _current() -> tuple[IdempotencyConfig, Replay]:
    ctx = default_context()
    return _replayer(ctx.settings.table_name, ctx.settings.idempotency_ttl_seconds, ctx.dynamodb_client)


def register_lambda_context(context: LambdaContext) -> None:
    """Bound in-progress records by the invocation's remaining time (call before resolving)."""
    config, _ = _current()
    config.register_lambda_context(context)


def _canonical_body(raw: str | None) -> Any:
    """The parsed body (hashed with sorted keys); the text itself only if it is not JSON."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return raw


def middleware(resolver: APIGatewayRestResolver, next_middleware: NextMiddleware) -> Response[Any]:
    event = resolver.current_event
    key = event.headers.get(HEADER) or event.headers.get(HEADER.lower())
    if not key or event.http_method not in IDEMPOTENT_METHODS:
        return next_middleware(resolver)
    if len(key) > MAX_KEY_LENGTH:
        return error_response(
            ValidationFailed(
                [ErrorDetail(field=f"header.{HEADER}", reason=f"at most {MAX_KEY_LENGTH} characters")]
            )
        )
    request = {
        "key": key,
        "caller": caller(event),
        "method": event.http_method,
        "path": event.path,
        "body": _canonical_body(event.body),
    }

    def run() -> StoredResponse:
        response = next_middleware(resolver)
        body = response.body if isinstance(response.body, str) else json.dumps(response.body, default=str)
        return {"status_code": response.status_code, "body": body, "content_type": response.content_type}

    _, replay = _current()
    stored = replay(request=request, run=run)
    return Response(
        status_code=int(stored.get("status_code") or HTTPStatus.OK),
        body=stored["body"],
        content_type=stored.get("content_type") or "application/json",
    )
