"""Builders for integration tests on the local stack."""

from __future__ import annotations

import contextlib
import itertools
import json
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper.services import catalog, workers
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import lambdas
from fleetkeeper_local.controlplane import (
    DEFAULT_CALLER,
    LocalResources,
    api_event,
    call_api,
    ensure_worker_profile,
    provision,
    refresh_process_caches,
)
from fleetkeeper_local.images import stock_image
from fleetkeeper_local.lambdas import LambdaDispatcher
from fleetkeeper_local.stack import LocalStack
from tests.clients import shared_client

pytestmark = pytest.mark.integration

_fake_ec2_ids = (f"i-{n:017x}" for n in itertools.count(0xABC000))

WorkerFactory = Callable[..., Worker]


@pytest.fixture
def running_worker(store: FleetStore) -> WorkerFactory:
    """Make a RUNNING worker through the real lifecycle (PENDING -> PROVISIONING -> RUNNING)."""

    def make(
        *,
        template: str = "lab",
        capacity: int = 4,
        pool: str | None = None,
        region: str = "us-east-1",
        drain_timeout_hours: float = 4,
    ) -> Worker:
        if store.find_template(template) is None:
            catalog.put_template(
                store,
                WorkerTemplate(
                    name=template,
                    instance_type="m5.large",
                    ami_name_filter="lab-*",
                    capacity=capacity,
                    drain_timeout_hours=drain_timeout_hours,
                ),
                actor="test",
            )
        if pool is not None:
            catalog.ensure_pool(store, pool, actor="test")
        worker = workers.create_worker(store, template=template, region=region, pool=pool, actor="test")
        if worker.capacity != capacity:
            worker = store.update_worker(worker, {"capacity": capacity}, actor="test", action="Resized")
        worker = store.transition_worker(
            worker,
            WorkerStatus.PROVISIONING,
            cause=Cause.CONTROL,
            actor="test",
            changes={"ec2_instance_id": next(_fake_ec2_ids)},
        )
        return store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="test")

    return make


# ---- the local control plane: drain state machine, in-process Lambda, API adapter -------------------


@dataclass
class ControlPlane:
    resources: LocalResources
    dispatcher: LambdaDispatcher

    @property
    def ctx(self) -> Context:
        return default_context()

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: str | None = None,
        query: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        caller: str = DEFAULT_CALLER,
    ) -> tuple[int, Any]:
        text = raw if raw is not None else (json.dumps(body) if body is not None else None)
        response = call_api(api_event(method, path, body=text, query=query, headers=headers, caller=caller))
        payload = json.loads(response["body"]) if response.get("body") else None
        return int(response["statusCode"]), payload

    @property
    def _sfn(self) -> Any:
        # One client for the helpers' polling: making a client costs more than the call it makes.
        return shared_client("stepfunctions")

    def execution(self, arn: str) -> dict[str, Any]:
        return dict(self._sfn.describe_execution(executionArn=arn))

    def wait_for_execution(self, arn: str, timeout: float = 30) -> dict[str, Any]:
        def finished() -> dict[str, Any] | None:
            execution = self.execution(arn)
            return execution if execution["status"] != "RUNNING" else None

        return dict(eventually(finished, timeout))

    def states_entered(self, arn: str) -> list[str]:
        events = self._sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
        return [e["stateEnteredEventDetails"]["name"] for e in events if "stateEnteredEventDetails" in e]


def eventually(probe: Callable[[], Any], timeout: float = 15, interval: float = 0.1) -> Any:
    """Poll until probe returns something truthy; fail with the last value after timeout.

    Each probe is a call to an emulator running on the same two cores as the code under test, so the
    interval trades a little latency for CPU the system under test needs."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last value: {last!r})")


@pytest.fixture
def control_plane_factory(
    local_stack: LocalStack, table_name: str, monkeypatch: pytest.MonkeyPatch, ec2: Any
):
    # After `ec2`, so torn down before it: the steps still under way finish before moto is reset, and
    # never stop a machine moto has just forgotten.
    started: list[ControlPlane] = []

    def start(heartbeat_seconds: int = 300) -> ControlPlane:
        resources = provision(local_stack, table_name)
        for key, value in resources.environment(heartbeat_seconds).items():
            monkeypatch.setenv(key, value)
        refresh_process_caches()
        plane = ControlPlane(resources, lambdas.dispatcher)
        started.append(plane)
        return plane

    yield start
    sfn = shared_client("stepfunctions")
    for plane in started:
        plane.dispatcher.unregister(plane.resources.drain_function_arn.split(":")[-1])
        # Waiting executions would otherwise call into the next test's table.
        with contextlib.suppress(ClientError):
            running = sfn.list_executions(
                stateMachineArn=plane.resources.state_machine_arn, statusFilter="RUNNING"
            )
            for execution in running["executions"]:
                sfn.stop_execution(executionArn=execution["executionArn"])
    # A step already running when its execution stopped still writes: the table is emptied after it.
    if started and not lambdas.dispatcher.wait_idle(timeout=60):
        raise AssertionError("a drain step was still running a minute after its execution was stopped")
    lambdas.dispatcher.forget()
    refresh_process_caches()


@pytest.fixture
def control_plane(control_plane_factory) -> ControlPlane:
    plane: ControlPlane = control_plane_factory()
    return plane


@pytest.fixture
def ec2_worker(store: FleetStore, running_worker: WorkerFactory, ec2: Any) -> WorkerFactory:
    """A RUNNING worker backed by a real (emulated) EC2 instance."""

    def make(**kwargs: Any) -> Worker:
        worker = running_worker(**kwargs)
        image = stock_image(ec2)
        # Tagged as the reconciler tags its launches: the functions' roles reach only such machines.
        tags = {MANAGED_BY_TAG: MANAGED_BY_VALUE, WORKER_ID_TAG: worker.id, TEMPLATE_TAG: worker.template}
        launched = ec2.run_instances(
            ImageId=image,
            InstanceType="m5.large",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ],
        )["Instances"][0]
        return store.update_worker(
            worker, {"ec2_instance_id": launched["InstanceId"]}, actor="test", action="Attached"
        )

    return make


@pytest.fixture
def machine_worker(store: FleetStore, running_worker: WorkerFactory, ec2: Any) -> WorkerFactory:
    """A RUNNING worker on an emulated machine that Run Command reaches: launched with the workers'
    profile and tagged as the reconciler tags it, since the roles may send commands only to machines
    tagged as managed."""

    def make(*, instance_type: str = "m5.large", **kwargs: Any) -> Worker:
        worker = running_worker(**kwargs)
        image = stock_image(ec2)
        # Tagged as the reconciler tags its launches: Run Command reaches only such machines.
        tags = {MANAGED_BY_TAG: MANAGED_BY_VALUE, WORKER_ID_TAG: worker.id, TEMPLATE_TAG: worker.template}
        launched = ec2.run_instances(
            ImageId=image,
            InstanceType=instance_type,
            MinCount=1,
            MaxCount=1,
            IamInstanceProfile={"Name": ensure_worker_profile()},
            TagSpecifications=[
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ],
        )["Instances"][0]
        return store.update_worker(
            worker, {"ec2_instance_id": launched["InstanceId"]}, actor="test", action="Attached"
        )

    return make


@pytest.fixture
def audit_feed(control_plane: Any) -> Callable[[], list[str]]:
    """Every audit event on the bus, delivered to an SQS queue by an EventBridge rule."""
    sqs, events = shared_client("sqs"), shared_client("events")
    queue_url = sqs.create_queue(QueueName=f"audit-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    bus = control_plane.resources.audit_bus_name
    events.put_rule(Name="all-audit", EventBusName=bus, EventPattern=json.dumps({"source": ["fleetkeeper"]}))
    events.put_targets(Rule="all-audit", EventBusName=bus, Targets=[{"Id": "queue", "Arn": queue_arn}])
    received: list[dict[str, Any]] = []

    def read() -> list[str]:
        while True:
            messages = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
            if not messages:
                return [e["detail-type"] for e in received]
            received.extend(json.loads(m["Body"]) for m in messages)

    return read
