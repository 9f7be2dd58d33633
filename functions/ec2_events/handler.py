"""Apply EC2 state changes, spot interruption warnings and rebalance recommendations (EventBridge rules)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools.logging import correlation_paths
from aws_lambda_powertools.utilities.parser import parse
from aws_lambda_powertools.utilities.typing import LambdaContext
from pydantic import ValidationError

from fleetkeeper.observability import logger, metrics, tracer
from fleetkeeper.services import ec2_events
from fleetkeeper.services.context import default_context
from fleetkeeper.triggers import Ec2Event


@logger.inject_lambda_context(correlation_id_path=correlation_paths.EVENT_BRIDGE)
@metrics.log_metrics
@tracer.capture_lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    try:
        parsed = parse(event=event, model=Ec2Event).root
    except (ValidationError, ValueError) as malformed:
        # Returning (not raising) keeps EventBridge from retrying an event that can never succeed.
        return ec2_events.drop(f"malformed or foreign event: {malformed}").as_dict()
    return ec2_events.handle(default_context(), parsed).as_dict()
