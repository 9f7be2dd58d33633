"""SSM adapter: Run Command (send a document to one machine, read how its invocation went, cancel it),
and the agents' ping status the health sweep reads.

Errors are classified here, once (on cloud/retry.py's classification): for the reads, throttling, 5xx and
dropped connections are retried by `with_backoff` and end as `Unavailable` when they persist; SendCommand,
which is not idempotent, is retried on throttling only, and a 5xx or dropped connection is an unknown
outcome (`SendOutcomeUnknown`) to look up, never to repeat; everything else is final for the attempt (an
instance SSM does not manage or that is offline, a document or parameter SSM refuses). Right after a
send, SSM may not know the invocation yet (`InvocationDoesNotExist`): that is "not started", not an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.cloud.retry import (
    DEFAULT_BASE_SECONDS,
    DEFAULT_CAP_SECONDS,
    THROTTLING_CODES,
    error_code,
    full_jitter,
    is_retryable,
    with_backoff,
)
from fleetkeeper.domain.repair import CONNECTION_LOST, AgentReading
from fleetkeeper.observability import logger

# Invocation statuses of a command still on its way or running.
IN_PROGRESS: Final = frozenset({"Pending", "InProgress", "Delayed", "Cancelling"})
SUCCESS: Final = "Success"
NOT_YET_KNOWN: Final = "InvocationDoesNotExist"
# SendCommand's TimeoutSeconds: how long SSM tries to deliver to an offline machine (30 s minimum).
DELIVERY_TIMEOUT_SECONDS: Final = 120
COMMENT_LIMIT: Final = 100
# DescribeInstanceInformation answers at most 50 machines a call: the ids go 50 to a call, one page each.
INFORMATION_PAGE_SIZE: Final = 50


SEND_ATTEMPTS: Final = 4
# SendCommand's answer for a machine Systems Manager does not manage. Final for the attempt: the next
# attempt (after the operation's backoff) finds a machine whose agent has registered since.
NOT_MANAGED: Final = "InvalidInstanceId"
NOT_MANAGED_HINT: Final = (
    "the machine is not registered with Systems Manager (launched without the stage's instance profile, "
    "its SSM agent not running yet, or the machine is gone)"
)


class SendOutcomeUnknown(Exception):
    """SendCommand failed in a way that does not say whether the command was sent (5xx, connection)."""


@dataclass(frozen=True)
class Invocation:
    """How one command went on one machine."""

    status: str
    status_details: str = ""
    response_code: int | None = None
    stdout: str = ""
    stderr: str = ""

    @property
    def in_progress(self) -> bool:
        return self.status in IN_PROGRESS

    @property
    def succeeded(self) -> bool:
        return self.status == SUCCESS

    def failure(self) -> str:
        code = f", exit code {self.response_code}" if self.response_code not in (None, -1) else ""
        return f"command {self.status} ({self.status_details or 'no details'}{code})"


def is_final(error: BaseException) -> bool:
    """An SSM error that sending the same request again will not clear."""
    if isinstance(error, BotoCoreError) and not is_retryable(error):
        return True
    return isinstance(error, ClientError) and not is_retryable(error)


def describe(error: BaseException) -> str:
    code = error_code(error)
    if code == NOT_MANAGED:
        return f"{code}: {NOT_MANAGED_HINT}: {error}"[:500]
    return f"{code or type(error).__name__}: {error}"[:500]


class CommandGateway:
    """One region's SSM Run Command, as fleetkeeper uses it."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def send(
        self,
        instance_id: str,
        document: str,
        parameters: Mapping[str, str],
        *,
        comment: str,
        sleep: Callable[[float], None] = time.sleep,
    ) -> str:
        """Send the document to the machine; the command id.

        Only throttling is retried here (a throttled call did not run). A 5xx or a dropped connection
        leaves the outcome unknown - the command may run - and raises `SendOutcomeUnknown`, so the
        caller looks the command up (`find_command`) rather than sending it again.
        """
        for attempt in range(SEND_ATTEMPTS):
            try:
                response = self._client.send_command(
                    InstanceIds=[instance_id],
                    DocumentName=document,
                    Parameters={key: [value] for key, value in parameters.items()},
                    Comment=comment[:COMMENT_LIMIT],
                    TimeoutSeconds=DELIVERY_TIMEOUT_SECONDS,
                )
                return str(response["Command"]["CommandId"])
            except (ClientError, BotoCoreError) as error:
                throttled = error_code(error) in THROTTLING_CODES
                if throttled and attempt + 1 < SEND_ATTEMPTS:
                    sleep(full_jitter(attempt, DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS))
                    continue
                if is_retryable(error) and not throttled:
                    raise SendOutcomeUnknown(describe(error)) from error
                raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def find_command(self, instance_id: str, comment: str, *, sent_after: datetime) -> str | None:
        """The id of a command sent to the machine with this comment since `sent_after`, if any: how a
        sender that died before recording its command id is found out, instead of sending it twice."""
        paginator = self._client.get_paginator("list_commands")
        pages = paginator.paginate(
            InstanceId=instance_id,
            Filters=[{"key": "InvokedAfter", "value": sent_after.strftime("%Y-%m-%dT%H:%M:%SZ")}],
        )
        wanted = comment[:COMMENT_LIMIT]
        for page in with_backoff(lambda: list(pages), name="ListCommands"):
            for command in page.get("Commands", []):
                if command.get("Comment") == wanted:
                    return str(command["CommandId"])
        return None

    def invocation(self, command_id: str, instance_id: str) -> Invocation | None:
        """The command's invocation on the machine; None while SSM does not know it yet."""
        try:
            raw = with_backoff(
                lambda: self._client.get_command_invocation(CommandId=command_id, InstanceId=instance_id),
                name="GetCommandInvocation",
            )
        except ClientError as exc:
            if error_code(exc) == NOT_YET_KNOWN:
                return None
            raise
        code = raw.get("ResponseCode")
        return Invocation(
            status=str(raw.get("Status") or "Pending"),
            status_details=str(raw.get("StatusDetails") or ""),
            response_code=int(code) if isinstance(code, int) else None,
            stdout=str(raw.get("StandardOutputContent") or ""),
            stderr=str(raw.get("StandardErrorContent") or ""),
        )

    def cancel(self, command_id: str, instance_id: str) -> bool:
        """Ask SSM to stop the command on the machine; best effort, once (the attempt is over anyway)."""
        try:
            self._client.cancel_command(CommandId=command_id, InstanceIds=[instance_id])
        except (ClientError, BotoCoreError) as exc:
            logger.warning("CancelCommand failed", command_id=command_id, error=describe(exc))
            return False
        return True


def lost_agents(client: Any) -> dict[str, AgentReading]:
    """Every SSM agent of the region that Systems Manager says lost its connection: one
    DescribeInstanceInformation filtered on `PingStatus`, paged 50 a call. AWS combines no tag filter
    with another, so it lists the account's region, not only the stage's workers: the caller keeps its
    own."""
    return _information(client, [{"Key": "PingStatus", "Values": [CONNECTION_LOST]}])


def agent_readings(client: Any, instance_ids: Iterable[str]) -> dict[str, AgentReading]:
    """The SSM agent's ping status of each of these machines that Systems Manager knows, one
    DescribeInstanceInformation per 50 ids; a machine it does not know is left out. AWS refuses a whole
    call with InvalidInstanceId for one id it will not take (a machine shutting down): such a call is
    asked again id by id, and only the refused ids are left out."""
    found: dict[str, AgentReading] = {}
    ids = sorted(set(instance_ids))
    for start in range(0, len(ids), INFORMATION_PAGE_SIZE):
        chunk = ids[start : start + INFORMATION_PAGE_SIZE]
        try:
            found.update(_information(client, [{"Key": "InstanceIds", "Values": chunk}]))
        except ClientError as error:
            if error_code(error) != NOT_MANAGED:
                raise
            for instance_id in chunk:
                try:
                    found.update(_information(client, [{"Key": "InstanceIds", "Values": [instance_id]}]))
                except ClientError as alone:
                    if error_code(alone) != NOT_MANAGED:
                        raise
    return found


def _information(client: Any, filters: list[dict[str, Any]]) -> dict[str, AgentReading]:
    """The agents DescribeInstanceInformation lists under these filters, every page, each call retried by
    `with_backoff` (the SSM client makes one attempt: a sweep's one throttled call must not cost the
    whole read)."""
    found: dict[str, AgentReading] = {}
    request: dict[str, Any] = {"Filters": filters, "MaxResults": INFORMATION_PAGE_SIZE}
    while True:
        page = with_backoff(
            partial(client.describe_instance_information, **request), name="DescribeInstanceInformation"
        )
        for info in page.get("InstanceInformationList", []):
            found[str(info["InstanceId"])] = AgentReading(
                ping_status=str(info.get("PingStatus", "")), last_ping=info.get("LastPingDateTime")
            )
        if not page.get("NextToken"):
            return found
        request["NextToken"] = page["NextToken"]
