"""One retry layer per AWS call: the HTTP attempts one call makes when AWS keeps refusing it.

The refusals are injected at botocore's `before-send`, inside the SDK's own retry loop, so both layers
(the SDK's standard mode and cloud/retry.py's `with_backoff`) see them as they would see AWS's. Nested
layers would multiply: 5 SDK attempts inside each of 5 of ours made 25 sends of one call.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse
from botocore.compat import HTTPHeaders
from botocore.exceptions import ClientError

from fleetkeeper.cloud import ssm
from fleetkeeper.cloud.clients import MAX_POOL_CONNECTIONS, SDK_ATTEMPTS, RetryLayer, client
from fleetkeeper.cloud.retry import DEFAULT_ATTEMPTS, retry_counts
from fleetkeeper.domain.errors import Unavailable
from fleetkeeper.services import operations
from fleetkeeper.services.reconcile import PARALLELISM
from tests.integration.conftest import ControlPlane, WorkerFactory

pytestmark = pytest.mark.integration


class _Body:
    """The raw body of a canned HTTP answer, as botocore reads it."""

    def __init__(self, content: bytes) -> None:
        self._content = content

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._content


def _json_error(code: str) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-ErrorType": code}
    return 400, headers, json.dumps({"__type": code, "message": "injected"}).encode()


def _ec2_error(code: str, status: int) -> tuple[int, dict[str, str], bytes]:
    body = (
        f"<Response><Errors><Error><Code>{code}</Code><Message>injected</Message></Error></Errors>"
        "<RequestID>injected</RequestID></Response>"
    )
    return status, {"Content-Type": "text/xml"}, body.encode()


@contextmanager
def refused(
    aws_client: Any, event: str, answer: tuple[int, dict[str, str], bytes], *, times: int | None = None
) -> Iterator[list[int]]:
    """Answer the first `times` sends (all, when None) of one operation with `answer`; yields the
    number of each HTTP attempt made, refused or not."""
    attempts: list[int] = []
    status, headers, body = answer

    def send(request: Any, **_: Any) -> AWSResponse | None:
        attempts.append(len(attempts) + 1)
        if times is not None and len(attempts) > times:
            return None  # through to the emulator
        return AWSResponse(request.url, status, HTTPHeaders.from_dict(headers), _Body(body))

    aws_client.meta.events.register_first(f"before-send.{event}", send)
    try:
        yield attempts
    finally:
        aws_client.meta.events.unregister(f"before-send.{event}", send)


def test_given_dynamodb_throttles_every_attempt_then_one_store_call_sends_five_requests_not_25(
    control_plane: ControlPlane, running_worker: WorkerFactory
) -> None:
    worker = running_worker()
    store = control_plane.ctx.store

    with (
        refused(client("dynamodb"), "dynamodb.GetItem", _json_error("ThrottlingException")) as attempts,
        pytest.raises(Unavailable),
    ):
        store.get_worker(worker.id)

    assert len(attempts) == DEFAULT_ATTEMPTS


def test_given_dynamodb_throttles_twice_then_the_store_call_succeeds_on_the_third_request(
    control_plane: ControlPlane, running_worker: WorkerFactory
) -> None:
    worker = running_worker()
    before = retry_counts().get("retry:GetItem:ThrottlingException", 0)

    with refused(
        client("dynamodb"), "dynamodb.GetItem", _json_error("ThrottlingException"), times=2
    ) as attempts:
        found = control_plane.ctx.store.get_worker(worker.id)

    assert found.id == worker.id
    assert len(attempts) == 3
    assert retry_counts().get("retry:GetItem:ThrottlingException", 0) - before == 2


def test_given_step_functions_throttles_every_attempt_then_one_describe_sends_five_requests(
    control_plane: ControlPlane,
) -> None:
    workflows = control_plane.ctx.workflows
    arn = workflows.execution_arn("never-started")

    with (
        refused(
            client("stepfunctions"), "sfn.DescribeExecution", _json_error("ThrottlingException")
        ) as attempts,
        pytest.raises(Unavailable),
    ):
        workflows.describe(arn)

    assert len(attempts) == DEFAULT_ATTEMPTS


def test_given_ssm_throttles_every_attempt_then_a_read_sends_five_requests_and_a_send_four(
    control_plane: ControlPlane,
) -> None:
    ssm_client = client("ssm", "us-east-1")
    gateway = ssm.CommandGateway(ssm_client)

    with (
        refused(ssm_client, "ssm.GetCommandInvocation", _json_error("ThrottlingException")) as reads,
        pytest.raises(Unavailable),
    ):
        gateway.invocation("00000000-0000-0000-0000-000000000000", "i-0123456789abcdef0")
    with (
        refused(ssm_client, "ssm.SendCommand", _json_error("ThrottlingException")) as sends,
        pytest.raises(ClientError),
    ):
        gateway.send(
            "i-0123456789abcdef0", "fleetkeeper-dev-CollectSystemInfo", {}, comment="t", sleep=lambda _: None
        )

    assert len(reads) == DEFAULT_ATTEMPTS
    assert len(sends) == ssm.SEND_ATTEMPTS


def test_given_ec2_throttles_twice_then_the_sdk_alone_retries_and_the_call_succeeds(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker = ec2_worker()
    ec2_client = client("ec2", worker.region)
    before = sum(count for key, count in retry_counts().items() if "StopInstances" in key)

    with refused(
        ec2_client, "ec2.StopInstances", _ec2_error("RequestLimitExceeded", 503), times=2
    ) as attempts:
        control_plane.ctx.ec2(worker.region).stop(str(worker.ec2_instance_id))

    assert len(attempts) == 3
    # with_backoff never saw it: the SDK's standard mode is this call's one layer.
    assert sum(count for key, count in retry_counts().items() if "StopInstances" in key) == before


def test_given_ec2_keeps_failing_then_one_call_sends_the_sdks_five_requests(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker = ec2_worker()

    with (
        refused(
            client("ec2", worker.region), "ec2.StopInstances", _ec2_error("InternalError", 500)
        ) as attempts,
        pytest.raises(ClientError),
    ):
        control_plane.ctx.ec2(worker.region).stop(str(worker.ec2_instance_id))

    assert len(attempts) == SDK_ATTEMPTS


def test_given_the_idempotency_records_then_their_dynamodb_client_is_retried_by_the_sdk(
    control_plane: ControlPlane,
) -> None:
    # Powertools calls this client itself, outside with_backoff: the SDK's retries are its only ones.
    idempotency = control_plane.ctx.dynamodb_client
    assert idempotency is client("dynamodb", retries=RetryLayer.SDK)

    with (
        refused(idempotency, "dynamodb.GetItem", _json_error("ThrottlingException"), times=1) as attempts,
    ):
        idempotency.get_item(
            TableName=control_plane.resources.table_name, Key={"PK": {"S": "x"}, "SK": {"S": "x"}}
        )

    assert len(attempts) == 2


@pytest.mark.parametrize(
    "service", ["dynamodb", "ec2", "ssm", "stepfunctions", "cloudwatch", "events", "sns"]
)
def test_given_the_threads_that_share_a_client_then_its_pool_holds_a_connection_for_each(
    service: str,
) -> None:
    threads = max(PARALLELISM, operations.PARALLELISM)
    assert client(service, "us-east-1").meta.config.max_pool_connections >= threads == MAX_POOL_CONNECTIONS
