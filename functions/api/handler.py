"""Admin API entry point (API Gateway REST proxy, AWS_IAM)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from fleetkeeper.api import idempotency
from fleetkeeper.api.app import app
from fleetkeeper.observability import logger, metrics, tracer


@logger.inject_lambda_context(correlation_id_path=correlation_paths.API_GATEWAY_REST, clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    # Idempotency needs the context before any idempotent call runs, to bound in-progress records.
    idempotency.register_lambda_context(context)
    return app.resolve(event, context)
