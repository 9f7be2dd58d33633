"""`auto_rollout`: a newer image makes the reconciler start one rollout of the template's drifted RUNNING
workers by itself, which replaces them; a template without it only reports the drift."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Owner, Worker, utcnow
from fleetkeeper.domain.rollouts import replacement_id
from fleetkeeper.services import workers
from fleetkeeper.services.reconcile.cycle import SAFETY_MARGIN_SECONDS
from fleetkeeper.services.rollouts import auto as auto_rollout
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.images import publish_newer_image
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import launch
from tests.integration.reconciler.test_drift import put_template

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_CYCLES = 80


def running_worker(store: FleetStore, ec2: Any, template: str, image_id: str) -> Worker:
    """A RUNNING worker of pool labs on a machine of `image_id`, with what it was launched with recorded."""
    worker = workers.create_worker(store, template=template, region="us-east-1", pool="labs", actor="test")
    instance_id = launch(ec2, worker.id, image_id, template=template)
    launched = {"ec2_instance_id": instance_id, "image_id": image_id, "instance_type": "m5.large"}
    worker = store.transition_worker(
        worker,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={**launched, "launched_at": utcnow()},
    )
    return store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="test")


def drifted_auto_workers(plane: Any, store: FleetStore, ec2: Any, count: int) -> list[Worker]:
    """`count` RUNNING workers of the `auto_rollout` template `auto` in pool labs, on an image a newer
    one has since replaced: drifted by image."""
    put_template(plane, "auto", auto_rollout=True)
    old, _ = publish_newer_image(ec2, "auto-*")
    fleet = [running_worker(store, ec2, "auto", old) for _ in range(count)]
    publish_newer_image(ec2, "auto-*")
    return fleet


def _rollouts(plane: Any) -> list[dict[str, Any]]:
    status, page = plane.api("GET", "/api/v1/rollouts", query={"limit": "50"})
    assert status == 200, page
    return list(page["items"])


def test_given_auto_rollout_and_a_newer_image_then_one_rollout_replaces_the_drifted_workers(
    control_plane, store, ec2
):
    # A pool whose budget lets every wave go at once: the waves follow each other without waiting.
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 3}]}})
    assert status == 201
    put_template(control_plane, "auto", auto_rollout=True)
    put_template(control_plane, "manual")
    old_auto, _ = publish_newer_image(ec2, "auto-*")
    old_manual, _ = publish_newer_image(ec2, "manual-*")
    # Two drifted workers show one rollout covering them all; each more costs a wave of cycles.
    rolled = sorted(running_worker(store, ec2, "auto", old_auto).id for _ in range(2))
    kept = running_worker(store, ec2, "manual", old_manual)
    reconcile_fleet(control_plane.ctx)
    assert _rollouts(control_plane) == []  # no drift, no rollout

    new_auto, _ = publish_newer_image(ec2, "auto-*")
    publish_newer_image(ec2, "manual-*")
    report = reconcile_fleet(control_plane.ctx)
    # The cycle after it finds them covered by the rollout it started: no second one.
    again = reconcile_fleet(control_plane.ctx)

    started = _rollouts(control_plane)
    assert len(started) == 1, started
    rollout = started[0]
    assert (rollout["reason"], rollout["started_by"], rollout["total"]) == ("auto: drift", "reconciler", 2)
    assert report.counters["auto_rollouts_started"] == 1
    assert again.counters["auto_rollouts_started"] == 0
    status, shown = control_plane.api("GET", f"/api/v1/rollouts/{rollout['id']}")
    assert status == 200

    view: dict[str, Any] = shown
    for _ in range(MAX_CYCLES):
        if view["status"] != "RUNNING":
            break
        time.sleep(0.2)
        reconcile_fleet(control_plane.ctx)
        view = control_plane.api("GET", f"/api/v1/rollouts/{rollout['id']}")[1]
    assert (view["status"], view["replaced"]) == ("SUCCEEDED", 2), view

    statuses = store.worker_statuses(rolled)
    assert all(statuses[w] == WorkerStatus.TERMINATED for w in rolled), statuses
    replacements = store.get_workers([replacement_id(rollout["id"], w) for w in rolled])
    assert [(w.status, w.image_id, w.drift) for w in replacements] == [
        (WorkerStatus.RUNNING, new_auto, None)
    ] * 2
    # The template without auto_rollout: drift reported, worker left as it is, one rollout in all.
    manual = store.get_worker(kept.id)
    assert manual.status == WorkerStatus.RUNNING
    assert manual.drift is not None
    assert [str(r) for r in manual.drift.reasons] == ["image"]
    assert len(_rollouts(control_plane)) == 1


def test_given_auto_rollout_as_a_string_then_422_naming_it(control_plane):
    status, body = control_plane.api(
        "PUT",
        "/api/v1/templates/auto",
        {"instance_type": "m5.large", "ami_name_filter": "auto-*", "capacity": 4, "auto_rollout": "yes"},
    )

    assert status == 422, body
    assert {d["field"] for d in body["details"]} == {"body.auto_rollout"}
    shown = put_template(control_plane, "auto")
    assert shown["auto_rollout"] is False


def test_given_a_worker_a_rollback_pinned_then_the_auto_rollout_leaves_it_out(control_plane, store, ec2):
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 3}]}})
    assert status == 201
    put_template(control_plane, "auto", auto_rollout=True)
    old, _ = publish_newer_image(ec2, "auto-*")
    free = running_worker(store, ec2, "auto", old)
    pinned = running_worker(store, ec2, "auto", old)
    store.update_worker(pinned, {"pinned_image_id": old}, actor="test", action="Pinned")

    publish_newer_image(ec2, "auto-*")
    reconcile_fleet(control_plane.ctx)

    started = _rollouts(control_plane)
    assert len(started) == 1, started
    status, rollout = control_plane.api("GET", f"/api/v1/rollouts/{started[0]['id']}")
    assert (status, rollout["total"]) == (200, 1)
    assert holders(control_plane, [free.id, pinned.id]) == {free.id: rollout["id"]}
    assert store.get_worker(pinned.id).drift is not None


def test_given_an_auto_rollout_cancelled_then_the_reconciler_starts_no_other_for_its_workers(
    control_plane, store, ec2
):
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {})
    assert status == 201
    (worker,) = drifted_auto_workers(control_plane, store, ec2, 1)
    reconcile_fleet(control_plane.ctx)
    (started,) = _rollouts(control_plane)
    status, cancelled = control_plane.api("POST", f"/api/v1/rollouts/{started['id']}/cancel", {})
    assert (status, cancelled["status"]) == (200, "CANCELLED"), cancelled

    report = reconcile_fleet(control_plane.ctx)

    assert [r["id"] for r in _rollouts(control_plane)] == [started["id"]]
    assert report.counters["auto_rollouts_started"] == 0
    assert report.counters["auto_rollout_held"] == 1
    assert store.get_worker(worker.id).drift is not None


def test_given_more_drifted_workers_than_one_auto_start_covers_then_each_cycle_starts_one_over_the_rest(
    control_plane, store, ec2, monkeypatch
):
    monkeypatch.setattr(auto_rollout, "AUTO_ROLLOUT_MAX_WORKERS", 2)
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 0}]}})
    assert status == 201
    ids = sorted(w.id for w in drifted_auto_workers(control_plane, store, ec2, 3))

    first = reconcile_fleet(control_plane.ctx)
    second = reconcile_fleet(control_plane.ctx)
    third = reconcile_fleet(control_plane.ctx)

    assert first.counters["auto_rollouts_started"] == 1
    assert first.counters["auto_rollout_workers_waiting"] == 1
    assert second.counters["auto_rollouts_started"] == 1
    assert third.counters["auto_rollouts_started"] == 0
    rollouts = sorted(_rollouts(control_plane), key=lambda r: r["created_at"])
    assert [r["total"] for r in rollouts] == [2, 1]
    assert holders(control_plane, ids) == {
        ids[0]: rollouts[0]["id"],
        ids[1]: rollouts[0]["id"],
        ids[2]: rollouts[1]["id"],
    }


def test_given_too_little_time_left_in_the_cycle_then_no_auto_rollout_starts_and_it_is_counted(
    control_plane, store, ec2
):
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {})
    assert status == 201
    drifted_auto_workers(control_plane, store, ec2, 1)
    # Room for the cycle's margin and its own steps, not for a start on top of them.
    tight = SAFETY_MARGIN_SECONDS + auto_rollout.START_ALLOWANCE_SECONDS - 1

    report = reconcile_fleet(control_plane.ctx, time_left=lambda: tight)

    assert report.counters["auto_rollout_deferred"] == 1
    assert _rollouts(control_plane) == []
    assert reconcile_fleet(control_plane.ctx).counters["auto_rollouts_started"] == 1


def test_given_a_drifted_worker_someone_else_holds_then_the_auto_rollout_starts_over_the_others(
    control_plane, store, ec2
):
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 0}]}})
    assert status == 201
    ids = sorted(w.id for w in drifted_auto_workers(control_plane, store, ec2, 2))
    # Expiry admitted the first worker a moment ago, ahead of making its replacement.
    lease = Owner(
        reason="expired", actor="reconciler", since=utcnow(), until=utcnow() + timedelta(minutes=15)
    )
    store.update_worker(store.get_worker(ids[0]), {"owner": lease}, actor="test", action="Admitted")

    report = reconcile_fleet(control_plane.ctx)

    assert report.counters["auto_rollouts_started"] == 1, dict(report.counters)
    (started,) = _rollouts(control_plane)
    assert started["total"] == 1
    assert holders(control_plane, ids) == {ids[1]: started["id"]}
    assert store.get_worker(ids[0]).owner == lease


def holders(control_plane, ids: list[str]) -> dict[str, str]:
    """The rollout that holds each of these workers (those a rollout holds)."""
    found = {w.id: w.owner for w in control_plane.ctx.store.get_workers(ids)}
    return {w: o.rollout_id for w, o in found.items() if o is not None and o.rollout_id is not None}
