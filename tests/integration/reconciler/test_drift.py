"""Drift on DynamoDB Local and moto: what a launch records, what a reconcile cycle finds, what the API
lists, and what one cycle costs in DescribeImages."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate, utcnow
from fleetkeeper.services import catalog, workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from fleetkeeper_local.images import publish_newer_image
from tests.integration.aws_calls import aws_calls
from tests.integration.conftest import ControlPlane
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory
from tests.integration.reconciler.support import launch

pytestmark = pytest.mark.integration

S = WorkerStatus


def put_template(plane: ControlPlane, name: str, **fields: Any) -> dict[str, Any]:
    body = {"instance_type": "m5.large", "ami_name_filter": f"{name}-*", "capacity": 4, **fields}
    status, template = plane.api("PUT", f"/api/v1/templates/{name}", body)
    assert status in {200, 201}, template
    return dict(template)


def running_worker(store: FleetStore, ec2: Any, template: str, image_id: str) -> Worker:
    """A RUNNING worker on a machine of `image_id`, with what it was launched with recorded."""
    worker = workers.create_worker(store, template=template, region="us-east-1", actor="test")
    instance_id = launch(ec2, worker.id, image_id, template=template)
    worker = store.transition_worker(
        worker,
        S.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={
            "ec2_instance_id": instance_id,
            "image_id": image_id,
            "instance_type": "m5.large",
            "launched_at": utcnow(),
        },
    )
    return store.transition_worker(worker, S.RUNNING, cause=Cause.EC2, actor="test")


def drifted_ids(plane: ControlPlane, drifted: str = "true") -> set[str]:
    status, page = plane.api("GET", "/api/v1/workers", query={"drifted": drifted, "limit": "1000"})
    assert status == 200, page
    return {w["id"] for w in page["items"]}


def test_given_a_launch_then_the_worker_records_its_image_type_and_time_and_has_no_drift(
    control_plane, make_ctx: ContextFactory, store, ec2
):
    put_template(control_plane, "lab")
    old, _ = publish_newer_image(ec2, "lab-*")
    status, created = control_plane.api("POST", "/api/v1/workers", {"template": "lab"})
    assert status == 201, created
    ctx = make_ctx()

    reconcile_fleet(ctx)

    worker = store.get_worker(created["id"])
    assert worker.status in {S.PROVISIONING, S.RUNNING}
    assert (worker.image_id, worker.instance_type) == (old, "m5.large")
    assert worker.launched_at is not None
    assert utcnow() - worker.launched_at < timedelta(minutes=1)
    status, shown = control_plane.api("GET", f"/api/v1/workers/{worker.id}")
    assert status == 200
    assert (shown["drift"], shown["image_id"], shown["instance_type"]) == (None, old, "m5.large")


def test_given_a_newer_image_when_one_cycle_runs_then_the_worker_drifts_on_image_and_is_listed(
    control_plane, make_ctx: ContextFactory, store, ec2
):
    put_template(control_plane, "lab")
    old, _ = publish_newer_image(ec2, "lab-*")
    worker = running_worker(store, ec2, "lab", old)
    steady = running_worker(store, ec2, "lab", old)
    ctx = make_ctx()
    reconcile_fleet(ctx)
    assert store.get_worker(worker.id).drift is None
    assert drifted_ids(control_plane) == set()

    new, _ = publish_newer_image(ec2, "lab-*")
    report = reconcile_fleet(ctx)

    status, shown = control_plane.api("GET", f"/api/v1/workers/{worker.id}")
    assert status == 200
    assert shown["drift"]["reasons"] == ["image"]
    assert shown["drift"]["desired"] == {"image_id": new, "instance_type": "m5.large"}
    assert shown["drift"]["since"] is not None
    assert drifted_ids(control_plane) == {worker.id, steady.id}
    assert drifted_ids(control_plane, "false") == set()
    assert report.counters["drift_found"] == 2

    # Unchanged drift costs no write: the next cycle leaves the worker as it is.
    version = store.get_worker(worker.id).version
    again = reconcile_fleet(ctx)
    assert store.get_worker(worker.id).version == version
    assert again.counters["drift_found"] == again.counters["drift_changed"] == 0


def test_given_a_template_with_another_instance_type_when_one_cycle_runs_then_the_drift_is_instance_type(
    control_plane, make_ctx: ContextFactory, store, ec2
):
    put_template(control_plane, "lab")
    image, _ = publish_newer_image(ec2, "lab-*")
    worker = running_worker(store, ec2, "lab", image)

    put_template(control_plane, "lab", instance_type="c5.xlarge")
    reconcile_fleet(make_ctx())

    status, shown = control_plane.api("GET", f"/api/v1/workers/{worker.id}")
    assert status == 200
    assert shown["drift"]["reasons"] == ["instance_type"]
    assert shown["drift"]["desired"] == {"image_id": image, "instance_type": "c5.xlarge"}
    # Back to what it runs: the drift is cleared by the next cycle.
    put_template(control_plane, "lab", instance_type="m5.large")
    report = reconcile_fleet(make_ctx())
    assert control_plane.api("GET", f"/api/v1/workers/{worker.id}")[1]["drift"] is None
    assert report.counters["drift_cleared"] == 1


def test_given_a_lifetime_and_old_workers_when_one_cycle_runs_then_they_are_expired(
    control_plane, make_ctx: ContextFactory, store, ec2
):
    put_template(control_plane, "lab", max_lifetime_hours=2)
    image, _ = publish_newer_image(ec2, "lab-*")
    # Protected from disruption, so they are reported and not replaced (test_expiry.py replaces them).
    protected = {"do_not_disrupt": True}
    launched_long_ago = running_worker(store, ec2, "lab", image)
    launched_long_ago = store.update_worker(
        launched_long_ago,
        {**protected, "launched_at": utcnow() - timedelta(hours=3)},
        actor="test",
        action="Aged",
    )
    # A worker launched before launches were recorded: its age runs from its creation.
    older = running_worker(store, ec2, "lab", image)
    older = store.update_worker(
        older,
        {
            **protected,
            "launched_at": None,
            "image_id": None,
            "instance_type": None,
            "created_at": utcnow() - timedelta(hours=5),
        },
        actor="test",
        action="Aged",
    )
    young = running_worker(store, ec2, "lab", image)

    report = reconcile_fleet(make_ctx())

    assert report.counters["expiry_drains"] == 0
    status, shown = control_plane.api("GET", f"/api/v1/workers/{launched_long_ago.id}")
    assert status == 200
    assert shown["drift"]["reasons"] == ["expired"]
    assert control_plane.api("GET", f"/api/v1/workers/{older.id}")[1]["drift"]["reasons"] == ["expired"]
    assert control_plane.api("GET", f"/api/v1/workers/{young.id}")[1]["drift"] is None
    assert drifted_ids(control_plane) == {launched_long_ago.id, older.id}


def _template(store: FleetStore, name: str) -> WorkerTemplate:
    template = WorkerTemplate(name=name, instance_type="m5.large", ami_name_filter=f"{name}-*", capacity=4)
    return catalog.put_template(store, template, actor="test")


def test_given_two_templates_of_many_workers_then_a_cycle_reads_images_once_per_template_and_region(
    make_ctx: ContextFactory, store, ec2
):
    fleet: list[Worker] = []
    for name in ("alpha", "beta"):
        _template(store, name)
        image, _ = publish_newer_image(ec2, f"{name}-*")
        fleet += [running_worker(store, ec2, name, image) for _ in range(3)]
    for name in ("alpha", "beta"):
        publish_newer_image(ec2, f"{name}-*")

    with aws_calls() as calls:
        report = reconcile_fleet(make_ctx())

    assert calls.of("ec2", "DescribeImages") == 2
    filters = sorted(str(params.get("Filter.1.Value.1")) for params in calls.sent("ec2", "DescribeImages"))
    assert filters == ["alpha-*", "beta-*"]
    assert report.counters["drift_found"] == 6
    assert all(store.get_worker(w.id).drift is not None for w in fleet)


def test_given_many_workers_to_launch_then_a_cycle_reads_their_image_once_and_launches_each_on_it(
    make_ctx: ContextFactory, store, ec2
):
    _template(store, "alpha")
    image, _ = publish_newer_image(ec2, "alpha-*")
    pending = [
        workers.create_worker(store, template="alpha", region="us-east-1", actor="test") for _ in range(6)
    ]

    with aws_calls() as calls:
        report = reconcile_fleet(make_ctx())

    # A wave of launches spends one DescribeImages of the region's budget, not one per launch, and one
    # RunInstances for the six of them (one batch: docs/capacity.md).
    assert calls.of("ec2", "DescribeImages") == 1
    assert calls.of("ec2", "RunInstances") == 1
    launched = [store.get_worker(w.id) for w in pending]
    assert len({w.ec2_instance_id for w in launched if w.ec2_instance_id}) == 6
    assert {w.image_id for w in launched} == {image}
    assert report.counters["reconcile_errors"] == 0


def test_given_describe_images_failing_for_one_template_then_the_others_drift_is_still_computed(
    make_ctx: ContextFactory, store, ec2
):
    fleet: dict[str, list[Worker]] = {}
    for name in ("alpha", "beta"):
        _template(store, name)
        image, _ = publish_newer_image(ec2, f"{name}-*")
        fleet[name] = [running_worker(store, ec2, name, image) for _ in range(2)]
        publish_newer_image(ec2, f"{name}-*")
    denied = faults.Fault(
        service="ec2",
        error="UnauthorizedOperation",
        status=403,
        operations=frozenset({"DescribeImages"}),
        when=lambda _operation, params: params.get("Filter.1.Value.1") == "alpha-*",
    )

    with faults.FaultPlan(faults=[denied]).installed():
        report = reconcile_fleet(make_ctx())

    assert report.completed
    assert denied.injected >= 1
    assert report.counters["drift_image_errors"] == 1
    assert [store.get_worker(w.id).drift for w in fleet["alpha"]] == [None, None]
    assert all(store.get_worker(w.id).drift is not None for w in fleet["beta"])
    assert all(store.get_worker(w.id).status == S.RUNNING for w in fleet["alpha"])


def test_given_a_bad_drifted_value_or_lifetime_then_422_names_the_field(control_plane):
    status, body = control_plane.api("GET", "/api/v1/workers", query={"drifted": "maybe"})
    assert status == 422
    assert {d["field"] for d in body["details"]} == {"query.drifted"}
    # A whole number only: 24.0 is refused too (domain/values.py WholeNumber).
    for hours in (0, 8761, 1.5, "24", 24.0):
        status, body = control_plane.api(
            "PUT",
            "/api/v1/templates/lab",
            {
                "instance_type": "m5.large",
                "ami_name_filter": "lab-*",
                "capacity": 4,
                "max_lifetime_hours": hours,
            },
        )
        assert status == 422, (hours, body)
        assert {d["field"] for d in body["details"]} == {"body.max_lifetime_hours"}
    status, template = control_plane.api(
        "PUT",
        "/api/v1/templates/lab",
        {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 4, "max_lifetime_hours": 24},
    )
    assert (status, template["max_lifetime_hours"]) == (201, 24)
