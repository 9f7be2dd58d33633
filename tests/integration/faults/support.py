"""What the fault-class convergence tests share: driving drains through the API and checking the end state."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import boto3

from fleetkeeper.api.schemas import MIN_DRAIN_TIMEOUT_SECONDS as MIN_API_DRAIN_SECONDS
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainThen, Worker
from fleetkeeper.services import drains
from fleetkeeper_local.event_shapes import schedule_input
from fleetkeeper_local.invocation import invoke
from fleetkeeper_local.lambdas import for_target
from tests.integration.conftest import ControlPlane

# Step Functions retries a crashed step after 1 s (2 s for RecordError): one crash, one retry.
RUNS_AFTER_ONE_CRASH = 2


def drain_function(plane: ControlPlane) -> str:
    return plane.resources.drain_function_arn.split(":")[-1]


def crash(plane: ControlPlane, step: str, target: str, *, after: bool, times: int = 1) -> None:
    """The drain Lambda dies at `step` for this worker or pool: before its handler ran, or after."""
    plane.dispatcher.inject_failure(
        drain_function(plane), step=step, times=times, after=after, when=for_target(target)
    )


def runs(plane: ControlPlane, step: str, target: str) -> int:
    return plane.dispatcher.runs(step, target)


def place(plane: ControlPlane, **body: Any) -> dict[str, Any]:
    status, instance = plane.api("POST", "/api/v1/instances", body)
    assert status == 201, instance
    return dict(instance)


def drain(plane: ControlPlane, worker_id: str, **body: Any) -> dict[str, Any]:
    """Start a drain through the API; one with a deadline seconds away goes through the drain service.

    The API refuses timeouts under a minute (a typo, not a policy), but internal callers such as spot
    warnings start drains that short, and the fault tests need their deadlines to pass quickly.

    Tests whose drained worker must keep its instances pass `reschedule=False`: otherwise the drain
    moves SCHEDULED instances to the other test workers and the step under test never waits.
    """
    timeout = body.get("timeout_seconds")
    if isinstance(timeout, int) and timeout < MIN_API_DRAIN_SECONDS:
        status = drains.start_worker_drain(
            plane.ctx,
            worker_id,
            actor="test",
            timeout_seconds=timeout,
            then=DrainThen(body.get("then", DrainThen.STOP.value)),
            reason=body.get("reason"),
            reschedule=body.get("reschedule", True),
        )
        return status.model_dump(mode="json")
    status_code, payload = plane.api("POST", f"/api/v1/workers/{worker_id}/drain", body)
    assert status_code == 202, payload
    return dict(payload)


def drain_pool(plane: ControlPlane, pool: str, **body: Any) -> dict[str, Any]:
    status, payload = plane.api("POST", f"/api/v1/pools/{pool}/drain", body)
    assert status == 202, payload
    return dict(payload)


def complete(plane: ControlPlane, instance_id: str) -> dict[str, Any]:
    status, body = plane.api("POST", f"/api/v1/instances/{instance_id}/state", {"state": "COMPLETED"})
    assert status == 200, body
    return dict(body)


def token_stored(plane: ControlPlane, worker_id: str) -> bool:
    record = plane.ctx.store.get_worker(worker_id).drain
    return bool(record and record.task_token)


def reconcile() -> dict[str, Any]:
    """One scheduled reconcile invocation, as EventBridge Scheduler sends it."""
    report: dict[str, Any] = invoke("reconcile", schedule_input("reconcile"))
    return report


def audit_actions(plane: ControlPlane, entity: str, entity_id: str) -> list[str]:
    return [e.action for e in plane.ctx.store.audit_trail(entity, entity_id)]


def ec2_state(ec2: Any, instance_id: str) -> str:
    found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return str(found["State"]["Name"])


def assert_drained_once(
    plane: ControlPlane, ec2: Any, worker: Worker, execution_arn: str, *, outcome: str = "SUCCESS"
) -> None:
    """The drain's execution succeeded, the worker is stopping, and the drain completed exactly once."""
    assert plane.wait_for_execution(execution_arn, timeout=30)["status"] == "SUCCEEDED"
    final = plane.ctx.store.get_worker(worker.id)
    assert final.status is WorkerStatus.STOPPING
    assert final.drain is not None
    assert final.drain.outcome.value == outcome
    assert final.drain.finished_at is not None
    assert final.drain.task_token is None
    assert audit_actions(plane, "worker", worker.id).count("WorkerDrainCompleted") == 1
    assert ec2_state(ec2, worker.ec2_instance_id or "") in ("stopping", "stopped")


def alert_feed(plane: ControlPlane) -> Callable[[], list[dict[str, Any]]]:
    """Messages published to the operators' topic, read through an SQS subscription."""
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=f"alerts-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    boto3.client("sns").subscribe(TopicArn=plane.resources.topic_arn, Protocol="sqs", Endpoint=queue_arn)
    received: list[dict[str, Any]] = []

    def read() -> list[dict[str, Any]]:
        while True:
            messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return received
            received.extend(json.loads(m["Body"]) for m in messages)

    return read
