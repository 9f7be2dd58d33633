"""Task states of the drain state machine: begin, await-empty, recheck, force, finish, record-error."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from fleetkeeper.observability import logger, metrics, tracer
from fleetkeeper.services.context import default_context
from fleetkeeper.services.drains import StepRequest, run_step


@logger.inject_lambda_context(correlation_id_path="drain.worker_id || drain.pool", clear_state=True)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = StepRequest.model_validate(event)
    logger.append_keys(step=request.step, generation=request.drain.generation)
    return run_step(default_context(), request)
