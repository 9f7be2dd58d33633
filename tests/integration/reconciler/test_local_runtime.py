"""The local scheduler and EC2 event pump, as a user of `make run` meets them."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.services import workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.event_shapes import schedule_input
from fleetkeeper_local.images import register_template_images
from fleetkeeper_local.scheduler import Ec2EventPump, LocalScheduler, Schedule
from tests.integration.reconciler.support import ensure_template

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("handler_context")]


def wait_for(condition: Callable[[], bool], seconds: float) -> float:
    """Seconds it took for the condition to hold; fails the test after `seconds`."""
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        if condition():
            return time.monotonic() - started
        time.sleep(0.1)
    pytest.fail(f"condition not met within {seconds}s")


def status_is(store: FleetStore, worker_id: str, status: WorkerStatus) -> Callable[[], bool]:
    return lambda: store.get_worker(worker_id).status == status


def test_given_the_local_schedules_then_a_new_worker_runs_and_a_terminated_machine_is_seen_in_seconds(
    store, ec2, lab_image
):
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", actor="api")
    scheduler = LocalScheduler(
        [Schedule("fleetkeeper-reconcile", "reconcile", 0.5, schedule_input("reconcile"))]
    )
    pump = Ec2EventPump(ec2, interval_seconds=0.2)
    scheduler.start()
    try:
        wait_for(status_is(store, worker.id, WorkerStatus.RUNNING), 20)
        scheduler.stop()  # from here on only the event path can notice the termination
        pump.start()
        time.sleep(0.5)  # let the pump take its baseline
        ec2.terminate_instances(InstanceIds=[store.get_worker(worker.id).ec2_instance_id])

        took = wait_for(status_is(store, worker.id, WorkerStatus.TERMINATED), 10)
    finally:
        scheduler.stop()
        pump.stop()

    assert took < 10
    assert store.get_worker(worker.id).terminated_by == "ec2-events"


def test_given_a_state_change_then_the_pump_delivers_one_event_of_the_real_shape(ec2, lab_image):
    delivered: list[dict[str, Any]] = []
    pump = Ec2EventPump(ec2, deliver=delivered.append)
    instance_id = ec2.run_instances(ImageId=lab_image, InstanceType="m5.large", MinCount=1, MaxCount=1)[
        "Instances"
    ][0]["InstanceId"]
    pump.poll_once()  # baseline

    ec2.stop_instances(InstanceIds=[instance_id])
    events = pump.poll_once()
    again = pump.poll_once()

    assert [e["detail"] for e in events] == [{"instance-id": instance_id, "state": "stopped"}]
    assert events[0]["detail-type"] == "EC2 Instance State-change Notification"
    assert events[0]["source"] == "aws.ec2"
    assert events[0]["resources"] == [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"]
    assert delivered == events
    assert again == []


def test_given_templates_then_each_name_filter_gets_one_owned_image(ec2):
    templates = [
        WorkerTemplate(name="a", instance_type="m5.large", ami_name_filter="fleet-lab-*", capacity=1),
        WorkerTemplate(name="b", instance_type="m5.large", ami_name_filter="fleet-lab-*", capacity=1),
        WorkerTemplate(name="c", instance_type="m5.large", ami_name_filter="fleet-batch-*", capacity=1),
    ]

    first = register_template_images(ec2, templates)
    again = register_template_images(ec2, templates)

    assert sorted(first) == ["fleet-batch-*", "fleet-lab-*"]
    assert again == first
    owned = ec2.describe_images(Owners=["self"])["Images"]
    assert sorted(i["Name"] for i in owned) == ["fleet-batch-2026.01", "fleet-lab-2026.01"]
