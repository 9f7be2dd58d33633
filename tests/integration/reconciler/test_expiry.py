"""Expired workers replaced through the pool's disruption budgets: a new worker, and a real drain of the
old one (then terminate) on moto's Step Functions."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Owner, Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.rollouts import Rollout, RolloutStatus, RolloutStrategy
from fleetkeeper.services import catalog, workers
from fleetkeeper.services.reconcile.expiry import replacement_id
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from fleetkeeper_local.images import publish_newer_image
from tests.integration.conftest import ControlPlane
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory
from tests.integration.reconciler.support import launch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S = WorkerStatus


def fleet_of(store: FleetStore, ec2: Any, *, ages_hours: list[float]) -> list[Worker]:
    """RUNNING workers of template `lab` (a lifetime of 2 hours) in pool `labs`, launched so long ago."""
    catalog.put_template(
        store,
        WorkerTemplate(
            name="lab", instance_type="m5.large", ami_name_filter="lab-*", capacity=4, max_lifetime_hours=2
        ),
        actor="test",
    )
    catalog.ensure_pool(store, "labs", actor="test")
    image, _ = publish_newer_image(ec2, "lab-*")
    fleet = []
    for age in ages_hours:
        worker = workers.create_worker(store, template="lab", region="us-east-1", pool="labs", actor="test")
        worker = store.transition_worker(
            worker,
            S.PROVISIONING,
            cause=Cause.CONTROL,
            actor="test",
            changes={
                "ec2_instance_id": launch(ec2, worker.id, image),
                "image_id": image,
                "instance_type": "m5.large",
                "launched_at": utcnow() - timedelta(hours=age),
            },
        )
        fleet.append(store.transition_worker(worker, S.RUNNING, cause=Cause.EC2, actor="test"))
    return fleet


def test_given_an_expired_worker_then_it_gets_one_replacement_and_drains_then_terminates(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
):
    old, young = fleet_of(store, ec2, ages_hours=[3, 0.5])
    ctx = make_ctx()

    report = reconcile_fleet(ctx)

    # The drain of an idle worker may already have ended it.
    draining = store.get_worker(old.id)
    assert draining.status in {S.DRAINING, S.TERMINATING, S.TERMINATED}
    assert draining.drain is not None
    assert (draining.drain.then, draining.drain.requested_by) == (DrainThen.TERMINATE, "reconciler")
    replacement = store.get_worker(replacement_id(old.id))
    assert (replacement.template, replacement.pool, replacement.region) == ("lab", "labs", "us-east-1")
    assert replacement.status == S.PENDING
    assert (report.counters["expiry_replacements"], report.counters["expiry_drains"]) == (1, 1)
    assert store.get_worker(young.id).status == S.RUNNING

    again = reconcile_fleet(ctx)

    assert again.counters["expiry_replacements"] == again.counters["expiry_drains"] == 0
    listed = store.list_workers(template="lab", limit=100).items
    assert len(listed) == 3
    # The drain of an idle worker finishes on its own and ends the machine.
    assert draining.drain.execution_arn is not None
    control_plane.wait_for_execution(draining.drain.execution_arn, timeout=60)
    assert store.get_worker(old.id).status in {S.TERMINATING, S.TERMINATED}


def test_given_a_budget_of_zero_for_expired_then_the_worker_waits_and_nothing_is_made(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
):
    (old,) = fleet_of(store, ec2, ages_hours=[3])
    status, body = control_plane.api(
        "PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 0, "reasons": ["expired"]}]}}
    )
    assert status == 200, body

    report = reconcile_fleet(make_ctx())

    assert report.counters["expiry_held_budget"] == 1
    assert store.get_worker(old.id).status == S.RUNNING
    assert store.find_worker(replacement_id(old.id)) is None
    assert store.get_worker(old.id).drift is not None


def test_given_a_replacement_made_before_a_crash_then_the_next_cycle_drains_without_a_second_one(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
):
    (old,) = fleet_of(store, ec2, ages_hours=[3])
    workers.create_worker(
        store,
        template="lab",
        region="us-east-1",
        pool="labs",
        actor="reconciler",
        worker_id=replacement_id(old.id),
    )

    report = reconcile_fleet(make_ctx())

    assert report.counters["expiry_replacement_exists"] == 1
    assert report.counters["expiry_drains"] == 1
    drained = store.get_worker(old.id)
    assert drained.status in {S.DRAINING, S.TERMINATING, S.TERMINATED}
    assert len(store.list_workers(template="lab", limit=100).items) == 2
    # Ended before the test is, so its execution never reaches into the next test's stack.
    assert drained.drain is not None
    assert drained.drain.execution_arn is not None
    control_plane.wait_for_execution(drained.drain.execution_arn, timeout=60)


def test_given_a_replacement_that_failed_before_the_drain_then_the_worker_gets_a_live_one(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
):
    (old,) = fleet_of(store, ec2, ages_hours=[3])
    # An earlier cycle made the replacement and crashed before the drain; its launch then failed.
    dead = workers.create_worker(
        store,
        template="lab",
        region="us-east-1",
        pool="labs",
        actor="reconciler",
        worker_id=replacement_id(old.id),
    )
    store.transition_worker(dead, S.FAILED, cause=Cause.CONTROL, actor="test")

    report = reconcile_fleet(make_ctx())

    live = [
        w
        for w in store.list_workers(template="lab", limit=100).items
        if w.id != old.id and w.status not in {S.FAILED, S.TERMINATED}
    ]
    drained = store.get_worker(old.id)
    # Never drained without a worker to take its place.
    assert len(live) == 1, report.counters
    assert report.counters["expiry_drains"] == 1
    assert drained.drain is not None
    assert drained.drain.execution_arn is not None
    control_plane.wait_for_execution(drained.drain.execution_arn, timeout=60)


def test_given_an_expired_worker_protected_during_the_cycle_then_it_is_neither_replaced_nor_drained(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
):
    (old,) = fleet_of(store, ec2, ages_hours=[3])

    def protect_meanwhile(_operation: str, _params: dict[str, Any]) -> bool:
        # An operator protects the worker after the cycle read it, while it looks for images.
        workers.set_do_not_disrupt_until(store, old.id, utcnow() + timedelta(hours=1), actor="op")
        return False  # nothing injected: the call goes through

    watch = faults.ec2_throttling(1.0, operations=frozenset({"DescribeImages"}), when=protect_meanwhile)
    with faults.FaultPlan(faults=[watch]).installed():
        report = reconcile_fleet(make_ctx())

    assert store.get_worker(old.id).do_not_disrupt_until is not None  # the operator's write landed
    assert store.get_worker(old.id).status == S.RUNNING, report.counters
    assert store.find_worker(replacement_id(old.id)) is None


def test_given_a_rollout_admits_the_worker_between_expirys_read_and_its_write_then_one_replacement_only(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
):
    """Expiry reads the worker free; before its admitting write lands, a rollout's step takes it. The
    write fails on the worker's version, the door reads again and finds it owned: expiry makes nothing,
    so the worker never gets two replacements."""
    (old,) = fleet_of(store, ec2, ages_hours=[3])
    rollout_owner = Owner(reason="rollout", actor="rollout:ro-fast", since=utcnow(), rollout_id="ro-fast")
    active = make_ctx().rollouts
    taken: list[str] = []

    def rollout_first(params: dict[str, Any], **_: Any) -> None:
        keys = {
            item.get("Update", {}).get("Key", {}).get("PK", {}).get("S") for item in params["TransactItems"]
        }
        admitting = {f"WORKER#{old.id}", "DISRUPTING#labs"} <= keys
        if taken or not admitting:
            return
        taken.append(old.id)
        store.update_worker(
            store.get_worker(old.id), {"owner": rollout_owner}, actor="rollout", action="Held"
        )

    # The rollout the owner names is active (paused, so its own steps stay out of this test).
    active.start(
        Rollout(
            id="ro-fast",
            status=RolloutStatus.PAUSED,
            total=1,
            max_unavailable=1,
            max_unavailable_requested=1,
            strategy=RolloutStrategy.SURGE,
            started_by="test",
            created_at=utcnow(),
            updated_at=utcnow(),
        ),
        [old.id],
        actor="test",
    )
    with faults.installed_hooks([("before-parameter-build.dynamodb.TransactWriteItems", rollout_first)]):
        report = reconcile_fleet(make_ctx())

    assert taken == [old.id]
    assert report.counters["expiry_held_owned"] == 1
    assert report.counters["expiry_replacements"] == report.counters["expiry_drains"] == 0
    assert store.find_worker(replacement_id(old.id)) is None
    assert store.get_worker(old.id).owner == rollout_owner


def test_given_an_expired_worker_in_an_active_rollout_then_the_rollout_replaces_it_not_expiry(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
):
    (old,) = fleet_of(store, ec2, ages_hours=[3])
    status, started = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": [old.id]})
    assert status == 202, started
    assert control_plane.api("POST", f"/api/v1/rollouts/{started['id']}/pause")[0] == 200

    report = reconcile_fleet(make_ctx())

    assert report.counters["expiry_held_owned"] == 1
    assert report.counters["expiry_replacements"] == report.counters["expiry_drains"] == 0
    assert store.find_worker(replacement_id(old.id)) is None
    assert store.get_worker(old.id).status == S.RUNNING

    # Once the rollout has finished, its claim no longer holds the worker back.
    assert control_plane.api("POST", f"/api/v1/rollouts/{started['id']}/cancel")[0] == 200
    after = reconcile_fleet(make_ctx())

    assert after.counters["expiry_replacements"] == 1
    assert store.get_worker(replacement_id(old.id)).status == S.PENDING
