"""Reconcile every worker needing action, or one shard's share of them (EventBridge Scheduler, rate 1
minute, one schedule per shard, staggered inside the period)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.typing import LambdaContext

from fleetkeeper.observability import logger, metrics, tracer
from fleetkeeper.services.context import default_context
from fleetkeeper.services.reconcile.schedule import scheduled_cycle
from fleetkeeper.triggers import schedule_input


@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    report = scheduled_cycle(
        default_context(),
        schedule_input(event),
        time_left=lambda: context.get_remaining_time_in_millis() / 1000,
        owner=context.aws_request_id,
    )
    return report.as_dict()
