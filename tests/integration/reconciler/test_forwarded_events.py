"""EC2 events of a worker region other than the home one, as the forwarding stack delivers them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.services import workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.images import stock_image
from fleetkeeper_local.invocation import invoke
from tests.integration.reconciler.support import ensure_template

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("handler_context")]

EVENTS = Path(__file__).resolve().parents[3] / "events"
WORKER_REGION = "us-west-2"


def forwarded(name: str, instance_id: str) -> dict[str, Any]:
    """A sample event as it arrives on the home bus: unchanged, so it still names its own region."""
    event: dict[str, Any] = copy.deepcopy(json.loads((EVENTS / f"{name}.json").read_text()))
    event["region"] = WORKER_REGION
    event["detail"]["instance-id"] = instance_id
    event["resources"] = [f"arn:aws:ec2:{WORKER_REGION}:123456789012:instance/{instance_id}"]
    event["time"] = utcnow().strftime("%Y-%m-%dT%H:%M:%SZ")
    return event


def test_given_a_worker_in_another_region_when_its_running_event_is_forwarded_then_it_runs_with_its_addresses(
    store: FleetStore, ec2: Any
) -> None:
    ensure_template(store, "lab")
    remote = boto3.client("ec2", region_name=WORKER_REGION)
    image = stock_image(remote)
    machine = remote.run_instances(ImageId=image, InstanceType="m5.large", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]
    worker = workers.create_worker(store, template="lab", region=WORKER_REGION, actor="test")
    worker = store.transition_worker(
        worker,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"ec2_instance_id": machine["InstanceId"]},
    )

    result = invoke("ec2_events", forwarded("ec2_state_change_running", machine["InstanceId"]))

    assert result["outcome"] == "applied"
    moved = store.get_worker(worker.id)
    assert moved.status == WorkerStatus.RUNNING
    # The addresses were read from the worker's own region, not the home region.
    assert moved.private_ip == machine["PrivateIpAddress"]


def test_given_a_worker_in_another_region_when_its_terminated_event_is_forwarded_then_it_is_retired(
    store: FleetStore, ec2: Any
) -> None:
    ensure_template(store, "lab")
    worker = workers.create_worker(store, template="lab", region=WORKER_REGION, actor="test")
    worker = store.transition_worker(
        worker,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"ec2_instance_id": "i-0f0f0f0f0f0f0f0f0"},
    )
    worker = store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="test")

    result = invoke("ec2_events", forwarded("ec2_state_change_terminated", "i-0f0f0f0f0f0f0f0f0"))

    assert result["outcome"] == "applied"
    assert store.get_worker(worker.id).status == WorkerStatus.TERMINATED
