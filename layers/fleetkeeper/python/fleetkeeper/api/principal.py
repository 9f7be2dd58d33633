"""Who is calling: the IAM principal API Gateway authenticated (AWS_IAM), never a field of the body."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent
from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent

UNKNOWN_CALLER: Final = "unknown-caller"

# An IAM role or user (its path is not part of who it is: a name is unique in its account), or a session
# of a role as API Gateway names a caller who assumed it (the session name is not part of it either).
_IAM_PRINCIPAL: Final = re.compile(
    r"^arn:(?P<partition>aws[a-z-]*):iam::(?P<account>\d{12}):(?P<kind>role|user)/(?:[^/]+/)*(?P<name>[^/]+)$"
)
_ROLE_SESSION: Final = re.compile(
    r"^arn:(?P<partition>aws[a-z-]*):sts::(?P<account>\d{12}):assumed-role/(?P<name>[^/]+)/(?P<session>[^/]+)$"
)


def caller(event: BaseProxyEvent) -> str:
    """The signing principal's ARN; every actor field the API writes (audit, requested_by,
    cancelled_by, terminated_by) comes from here."""
    identity = APIGatewayProxyEvent(event.raw_event).request_context.identity
    return identity.user_arn or identity.caller or UNKNOWN_CALLER


def principal_of(arn: str) -> tuple[str, str, str, str] | None:
    """(partition, account, role|user, name) of an IAM role or user ARN, or of a role session's ARN;
    None for anything else (a federated user, the account root, a service)."""
    found = _IAM_PRINCIPAL.match(arn)
    if found:
        return found["partition"], found["account"], found["kind"], found["name"]
    session = _ROLE_SESSION.match(arn)
    if session:
        return session["partition"], session["account"], "role", session["name"]
    return None


def session_name(arn: str) -> str | None:
    """The session name of a role session's ARN (an instance profile's is its instance id); None for
    anything else."""
    session = _ROLE_SESSION.match(arn)
    return session["session"] if session else None


def is_one_of(caller_arn: str, principals: Iterable[str]) -> bool:
    """Whether the caller is one of these IAM roles or users (as a session of the role, or itself)."""
    who = principal_of(caller_arn)
    return who is not None and who in {principal_of(arn) for arn in principals}
