"""Step Functions adapter: starting drain executions and answering their callback tokens."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from fleetkeeper.cloud.retry import with_backoff

# Answers to a token that no longer waits (already answered, timed out, execution over): harmless.
_STALE_TOKEN_ERRORS = frozenset({"TaskTimedOut", "TaskDoesNotExist", "InvalidToken"})


@dataclass(frozen=True)
class ExecutionState:
    """What DescribeExecution says about one execution."""

    arn: str
    status: str  # RUNNING, SUCCEEDED, FAILED, TIMED_OUT, ABORTED, PENDING_REDRIVE
    error: str | None = None
    cause: str | None = None


class Workflows:
    def __init__(self, client: Any, state_machine_arn: str | None) -> None:
        self._client = client
        self._state_machine_arn = state_machine_arn

    @property
    def state_machine_arn(self) -> str:
        if not self._state_machine_arn:
            raise RuntimeError("DRAIN_STATE_MACHINE_ARN is not set: no drain workflow to start")
        return self._state_machine_arn

    def execution_arn(self, name: str) -> str:
        """The ARN an execution of this name has (or will have)."""
        prefix, _, machine = self.state_machine_arn.rpartition(":stateMachine:")
        return f"{prefix}:execution:{machine}:{name}"

    def start(self, name: str, payload: Mapping[str, Any]) -> str:
        """Start the named execution; a name that already ran returns the existing execution."""
        try:
            response = with_backoff(
                lambda: self._client.start_execution(
                    stateMachineArn=self.state_machine_arn, name=name, input=json.dumps(payload)
                ),
                name="sfn:StartExecution",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ExecutionAlreadyExists":
                return self.execution_arn(name)
            raise
        return str(response["executionArn"])

    def describe(self, arn: str) -> ExecutionState | None:
        """The execution's status, or None when Step Functions has no such execution."""
        try:
            response = with_backoff(
                lambda: self._client.describe_execution(executionArn=arn), name="sfn:DescribeExecution"
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ExecutionDoesNotExist":
                return None
            raise
        return ExecutionState(
            arn=arn,
            status=str(response["status"]),
            error=response.get("error"),
            cause=response.get("cause"),
        )

    def succeed(self, token: str, output: Mapping[str, Any]) -> bool:
        """Complete a waiting task; False when the token no longer waits."""
        return self._answer(
            lambda: self._client.send_task_success(taskToken=token, output=json.dumps(output))
        )

    def fail(self, token: str, error: str, cause: str) -> bool:
        """Fail a waiting task with a named error; False when the token no longer waits."""
        return self._answer(
            lambda: self._client.send_task_failure(taskToken=token, error=error, cause=cause[:32000])
        )

    def heartbeat(self, token: str) -> bool:
        return self._answer(lambda: self._client.send_task_heartbeat(taskToken=token))

    @staticmethod
    def _answer(call: Any) -> bool:
        try:
            with_backoff(call, name="sfn:SendTask")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _STALE_TOKEN_ERRORS:
                return False
            raise
        return True
