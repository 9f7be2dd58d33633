"""Who is calling: the IAM principal API Gateway authenticated (AWS_IAM), never a field of the body."""

from __future__ import annotations

from typing import Final

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent

UNKNOWN_CALLER: Final = "unknown-caller"


def caller(event: BaseProxyEvent) -> str:
    """The signing principal's ARN; every actor field the API writes (audit, requested_by,
    cancelled_by, terminated_by) comes from here."""
    identity = APIGatewayProxyEvent(event.raw_event).request_context.identity
    return identity.user_arn or identity.caller or UNKNOWN_CALLER
