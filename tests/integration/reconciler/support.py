"""Helpers shared by the reconciler, discovery and EC2 event tests."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import boto3

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.tags import BATCH_TAG, MANAGED_BY_TAG, MANAGED_BY_VALUE, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper.services import catalog
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.controlplane import ensure_worker_profile
from tests.integration.functions import reconcile_fleet

LAB_IMAGE_NAME = "lab-2026.02"


def ensure_template(
    store: FleetStore, name: str = "lab", *, capacity: int = 4, **extra: Any
) -> WorkerTemplate:
    existing = store.find_template(name)
    if existing is not None:
        return existing
    template = WorkerTemplate(
        name=name, instance_type="m5.large", ami_name_filter="lab-*", capacity=capacity, **extra
    )
    return catalog.put_template(store, template, actor="test")


def launch(
    ec2: Any,
    worker_id: str,
    image_id: str,
    *,
    template: str = "lab",
    tagged: bool = True,
    registered: bool = False,
    batch: str | None = None,
) -> str:
    """A running machine; `registered`: launched with the workers' instance profile, as the reconciler
    launches, so its emulated SSM agent answers Run Command; `batch`: tagged as one launch batch's."""
    tags = [{"Key": "Name", "Value": f"test-{worker_id}"}]
    if tagged:
        tags += [
            {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
            {"Key": WORKER_ID_TAG, "Value": worker_id},
            {"Key": TEMPLATE_TAG, "Value": template},
        ]
    if batch is not None:
        tags.append({"Key": BATCH_TAG, "Value": batch})
    response = ec2.run_instances(
        ImageId=image_id,
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        **({"IamInstanceProfile": {"Name": ensure_worker_profile()}} if registered else {}),
    )
    return str(response["Instances"][0]["InstanceId"])


def claimed_and_launched(
    store: FleetStore, ec2: Any, worker: Worker, image_id: str, *, claimed_at: datetime
) -> tuple[Worker, str]:
    """A PENDING worker whose launch a reconciler claimed at `claimed_at` (a batch of one, as the claim
    writes it) and whose RunInstances went through, though the reconciler never recorded its machine."""
    token = f"fkb-test-{worker.id}"
    claimed = store.update_worker(
        worker,
        {
            "launch_claimed_at": claimed_at,
            "launch_token": token,
            "launch_image_id": image_id,
            "launch_index": 0,
            "launch_count": 1,
        },
        actor="test",
        action="LaunchClaimed",
    )
    return claimed, launch(ec2, worker.id, image_id, batch=token)


def ec2_state(ec2: Any, instance_id: str) -> str:
    reservations = ec2.describe_instances(Filters=[{"Name": "instance-id", "Values": [instance_id]}])
    return str(reservations["Reservations"][0]["Instances"][0]["State"]["Name"])


def instances_tagged(ec2: Any, worker_id: str) -> list[str]:
    reservations = ec2.describe_instances(Filters=[{"Name": f"tag:{WORKER_ID_TAG}", "Values": [worker_id]}])
    return [i["InstanceId"] for r in reservations["Reservations"] for i in r["Instances"]]


# Scale-down on, with a metrics period of a minute and half an hour of idleness before a worker goes.
SCALE_DOWN = {"SCALE_DOWN_ENABLED": "true", "METRICS_INTERVAL_SECONDS": "60", "IDLE_WINDOW_SECONDS": "1800"}


def report_cpu(worker: Worker, value: float) -> None:
    """The worker's machine reports `value` percent CPU half a minute ago, as CloudWatch would hold it."""
    boto3.client("cloudwatch").put_metric_data(
        Namespace="AWS/EC2",
        MetricData=[
            {
                "MetricName": "CPUUtilization",
                "Dimensions": [{"Name": "InstanceId", "Value": worker.ec2_instance_id or ""}],
                "Value": value,
                "Timestamp": utcnow() - timedelta(seconds=30),
            }
        ],
    )


def cycle_until(
    control_plane: Any,
    until: Callable[[], Any],
    sample: Callable[[], None] = lambda: None,
    *,
    max_cycles: int,
    pause: float,
) -> Any:
    """Run reconcile cycles (sampling after each) until `until` answers something; that answer. The
    drain workflows run on their own between cycles, so a short pause lets them move."""
    for _ in range(max_cycles):
        reconcile_fleet(control_plane.ctx)
        sample()
        found = until()
        if found:
            return found
        time.sleep(pause)
    raise AssertionError(f"not there in {max_cycles} cycles")


def stopped_wanting_to_run(ctx: Any, store: FleetStore, ec2: Any, worker: Worker) -> Worker:
    """`worker`'s machine stopped from outside, seen STOPPED by a cycle, then asked to run again: the next
    cycle starts it."""
    ec2.stop_instances(InstanceIds=[worker.ec2_instance_id])
    reconcile_fleet(ctx)
    stopped = store.get_worker(worker.id)
    return store.update_worker(
        stopped, {"desired_status": "RUNNING"}, actor="test", action="DesiredStatusSet"
    )


def stopped_warm(store: FleetStore, ec2: Any, workers: list[Worker]) -> list[Worker]:
    """`workers`' machines stopped and the workers STOPPED, as a warm set the reconciler may wake."""
    ec2.stop_instances(InstanceIds=[w.ec2_instance_id for w in workers])
    return [store.transition_worker(w, WorkerStatus.STOPPED, cause=Cause.EC2, actor="test") for w in workers]
