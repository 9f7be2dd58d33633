"""Discover managed EC2 instances and collect orphans (EventBridge Scheduler, rate 5 minutes)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from fleetkeeper.observability import logger, metrics, tracer
from fleetkeeper.services.context import default_context
from fleetkeeper.services.discovery import discover_and_collect
from fleetkeeper.triggers import schedule_input


@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    request = schedule_input(event)
    return discover_and_collect(
        default_context(),
        regions=request.target_regions,
        time_left=lambda: context.get_remaining_time_in_millis() / 1000,
    ).as_dict()
