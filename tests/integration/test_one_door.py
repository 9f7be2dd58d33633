"""One door for disruption and one for new workers, across actors (docs/disruption.md, "Who may disrupt
a worker"): the defects a review reproduced while every actor decided alone, each driven through the
API and the reconcile cycle on the local stack. Each docstring says what used to happen."""

from __future__ import annotations

import logging
import os
import re
import time
from datetime import datetime, timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.rollouts import replacement_id
from fleetkeeper.services import drains
from fleetkeeper.services.context import build_context
from fleetkeeper.services.ec2_events import apply_state_change
from fleetkeeper.settings import Settings, get_settings
from fleetkeeper_local import faults
from fleetkeeper_local.images import register_template_images
from tests.integration.conftest import ControlPlane, WorkerFactory, eventually
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import SCALE_DOWN, cycle_until, ensure_template, instances_tagged

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S = WorkerStatus


def pool_labs(control_plane: ControlPlane, *budgets: dict[str, Any]) -> None:
    status, body = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": list(budgets)}})
    assert status in (200, 201), body


def launchable(control_plane: ControlPlane, ec2: Any) -> None:
    """An AMI for template lab, so the reconciler launches its workers (without one, a launch fails)."""
    register_template_images(ec2, [ensure_template(control_plane.ctx.store)])


def busy(control_plane: ControlPlane, worker_id: str) -> None:
    """A session on the worker: its drain waits for it, and scale-down leaves it alone."""
    status, placed = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker_id})
    assert status == 201, placed


def start_rollout(control_plane: ControlPlane, **body: Any) -> str:
    status, started = control_plane.api("POST", "/api/v1/rollouts", body)
    assert status == 202, started
    return str(started["id"])


def rollout(control_plane: ControlPlane, rollout_id: str) -> dict[str, Any]:
    status, view = control_plane.api("GET", f"/api/v1/rollouts/{rollout_id}")
    assert status == 200, view
    return dict(view)


def disruption_view(control_plane: ControlPlane) -> dict[str, Any]:
    status, view = control_plane.api("GET", "/api/v1/pools/labs/disruption")
    assert status == 200, view
    return dict(view)


def ended(control_plane: ControlPlane, rollout_id: str) -> dict[str, Any] | None:
    view = rollout(control_plane, rollout_id)
    return view if view["status"] not in ("RUNNING", "PAUSED") else None


def in_use_quoted(detail: str) -> int:
    """The in-use count a door's detail quotes ("... allows 0, 1 in use ...")."""
    found = re.search(r"(\d+) in use", detail)
    assert found is not None, detail
    return int(found.group(1))


def window_now() -> tuple[dict[str, Any], datetime]:
    """A freeze of rollouts in a daily window of two hours that began a minute ago, and its end."""
    start = (utcnow() - timedelta(minutes=1)).replace(second=0, microsecond=0)
    budget = {
        "max": 0,
        "reasons": ["rollout"],
        "schedule": f"{start.minute} {start.hour} * * *",
        "duration": "2h",
        "timezone": "UTC",
    }
    return budget, start + timedelta(hours=2)


@pytest.mark.parametrize("windowed", [False, True], ids=["freeze", "window"])
def test_given_a_freeze_on_rollouts_then_a_surge_launches_nothing_and_both_views_say_why(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any, windowed: bool
) -> None:
    """Before: a surge created each replacement first and asked the budget only for the old worker's
    drain, so a freeze on rollouts still launched a machine per worker; its blocked detail could read
    "budget None", and nothing of it showed in the pool's waiting list."""
    budget, until = window_now() if windowed else ({"max": 0, "reasons": ["rollout"]}, None)
    pool_labs(control_plane, budget)
    ids = sorted(ec2_worker(pool="labs").id for _ in range(2))
    for worker_id in ids:
        busy(control_plane, worker_id)
    launchable(control_plane, ec2)
    rollout_id = start_rollout(control_plane, template="lab", pool="labs", max_unavailable=1)

    for _ in range(3):
        reconcile_fleet(control_plane.ctx)

    store = control_plane.ctx.store
    assert [store.find_worker(replacement_id(rollout_id, w)) for w in ids] == [None, None]
    assert sorted(w.id for w in store.workers_in_pool("labs")) == ids
    view = rollout(control_plane, rollout_id)
    blocked = view["blocked"]
    assert (view["status"], blocked["reason"]) == ("RUNNING", "window" if windowed else "budget"), view
    assert f"worker {ids[0]}: pool labs budget 0 allows 0, 0 in use" in blocked["detail"]
    assert "None" not in blocked["detail"]
    pool = disruption_view(control_plane)
    waiting = [(w["worker_id"], w["reason"], w["why"], w["in_use"]) for w in pool["waiting"]]
    assert waiting == [(ids[0], "rollout", blocked["reason"], pool["in_use"])]
    assert in_use_quoted(blocked["detail"]) == pool["in_use"] == 0
    if until is not None:
        assert f"until {until.isoformat()}" in blocked["detail"]
        assert datetime.fromisoformat(pool["waiting"][0]["until"]) == until


def test_given_an_idle_replacement_of_a_paused_surge_then_scale_down_leaves_it_and_the_rollout_goes_on(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, ec2: Any
) -> None:
    """Before: scale-down knew nothing of rollouts. It stopped the idle replacement while the rollout
    waited to drain the old worker, and the step after found the replacement STOPPING and failed the
    rollout with launch_failed."""
    # Room for both: only the rollout's hold on its replacement keeps scale-down away.
    pool_labs(control_plane, {"max": 2})
    old = ec2_worker(pool="labs")
    launchable(control_plane, ec2)
    rollout_id = start_rollout(control_plane, worker_ids=[old.id])
    new_id = replacement_id(rollout_id, old.id)
    store = control_plane.ctx.store

    reconcile_fleet(control_plane.ctx)  # the old worker admitted ahead, its replacement made
    assert store.get_worker(new_id).status == S.PENDING
    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/pause")[0] == 200
    cycle_until(control_plane, lambda: store.get_worker(new_id).status == S.RUNNING, max_cycles=10, pause=0.2)
    store.update_worker(
        store.get_worker(new_id), {"idle_since": utcnow() - timedelta(hours=1)}, actor="test", action="Idle"
    )

    report = reconcile_fleet(build_context(Settings.from_environ({**os.environ, **SCALE_DOWN})))

    assert store.get_worker(new_id).status == S.RUNNING
    assert (report.counters["scale_down_refused_in_flight"], report.counters["scale_down_stop_count"]) == (
        1,
        0,
    )
    waiting = [(w["worker_id"], w["reason"], w["why"]) for w in disruption_view(control_plane)["waiting"]]
    assert waiting == [(new_id, "scale_down", "owned")]
    # The cycles since the pause left the operator's reason in place.
    assert rollout(control_plane, rollout_id)["blocked"]["reason"] == "paused"

    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/resume")[0] == 200
    done = cycle_until(control_plane, lambda: ended(control_plane, rollout_id), max_cycles=40, pause=0.3)

    assert (done["status"], done["replaced"], done["blocked"]) == ("SUCCEEDED", 1, None), done
    assert store.get_worker(new_id).status == S.RUNNING


def test_given_a_pool_drain_under_a_drain_first_rollout_then_nothing_new_enters_the_pool(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    """Before: only placement looked at a pool's status. The rollout created its replacement in the
    draining pool once the old worker was gone, a new rollout over the pool started, and POST
    /api/v1/workers put a new worker into it."""
    pool_labs(control_plane, {"max": 1})
    first, second = sorted(ec2_worker(pool="labs").id for _ in range(2))
    # A session on the second (the rollout's next wave) keeps the pool draining through the test.
    busy(control_plane, second)
    rollout_id = start_rollout(
        control_plane, template="lab", pool="labs", strategy="drain_first", max_unavailable=1
    )
    store = control_plane.ctx.store

    reconcile_fleet(control_plane.ctx)  # the first wave's drain starts
    assert store.get_worker(first).drain is not None
    status, drained = control_plane.api("POST", "/api/v1/pools/labs/drain", {"timeout_seconds": 600})
    assert status == 202, drained

    def refused() -> dict[str, Any] | None:
        view = rollout(control_plane, rollout_id)
        return view if (view["blocked"] or {}).get("reason") == "pool_not_active" else None

    view = cycle_until(control_plane, refused, max_cycles=20, pause=0.3)

    assert view["status"] == "RUNNING", view
    assert f"worker {first}: pool labs is draining" in view["blocked"]["detail"]
    assert store.get_worker(first).status == S.TERMINATED
    assert store.find_worker(replacement_id(rollout_id, first)) is None
    status, again = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs"})
    assert (status, again["error"]) == (409, "POOL_NOT_ACTIVE"), again
    status, created = control_plane.api("POST", "/api/v1/workers", {"template": "lab", "pool": "labs"})
    assert (status, created["error"]) == (409, "POOL_NOT_ACTIVE"), created
    assert sorted(w.id for w in store.workers_in_pool("labs")) == [first, second]


def test_given_workers_still_launching_when_their_pool_drain_ends_then_none_runs_on_in_the_pool(
    control_plane: ControlPlane, ec2: Any
) -> None:
    """Before: provisioning never looked at the pool. A PENDING worker of an inactive pool was launched,
    and one PROVISIONING as the pool's drain ended came up and kept running, though the drain (then
    stop) stopped every other worker of the pool."""
    launchable(control_plane, ec2)
    pool_labs(control_plane)
    store = control_plane.ctx.store

    def create() -> str:
        status, created = control_plane.api("POST", "/api/v1/workers", {"template": "lab", "pool": "labs"})
        assert status == 201, created
        return str(created["id"])

    early = create()
    reconcile_fleet(control_plane.ctx)
    assert store.get_worker(early).status == S.PROVISIONING
    late = create()
    status, drained = control_plane.api(
        "POST", "/api/v1/pools/labs/drain", {"timeout_seconds": 60, "then": "stop"}
    )
    assert status == 202, drained
    eventually(lambda: store.get_worker(early).desired_status == S.STOPPED, timeout=60)
    assert store.get_pool("labs").status == PoolStatus.INACTIVE

    cycle_until(
        control_plane,
        lambda: (
            store.get_worker(late).status == S.TERMINATED
            and store.get_worker(early).status in (S.STOPPING, S.STOPPED)
        ),
        max_cycles=10,
        pause=0.2,
    )

    never = store.get_worker(late)
    assert (never.status_reason, never.ec2_instance_id, instances_tagged(ec2, late)) == (
        "pool labs is inactive",
        None,
        [],
    )
    # It came up first, then the pool drain's desired status stopped it.
    assert "RUNNING" in {e.to_status for e in store.audit_page("worker", early).items}


def test_given_a_failed_launch_and_a_budget_hold_in_one_step_then_the_rollout_fails_saying_launch_failed(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    """Before: a step's blocked was the first reason it met, in the wave's order, so a FAILED rollout
    whose wave had a worker held by its budget ahead of the one whose replacement failed read
    "budget". Here no AMI is published, so the replacement's launch fails for real."""
    pool_labs(control_plane, {"max": 1, "reasons": ["rollout"]})
    first, second = sorted(ec2_worker(pool="labs").id for _ in range(2))
    protect = f"/api/v1/workers/{first}/do-not-disrupt"
    assert control_plane.api("PUT", protect, {"do_not_disrupt_until": "1h"})[0] == 200
    rollout_id = start_rollout(control_plane, worker_ids=[first, second], max_unavailable=2)
    store = control_plane.ctx.store

    reconcile_fleet(control_plane.ctx)  # the first protected, the second admitted with the budget's place
    assert rollout(control_plane, rollout_id)["blocked"]["reason"] == "protected"
    assert store.get_worker(replacement_id(rollout_id, second)).status == S.PENDING
    assert control_plane.api("PUT", protect, {"do_not_disrupt_until": None})[0] == 200

    done = cycle_until(control_plane, lambda: ended(control_plane, rollout_id), max_cycles=5, pause=0.2)

    assert (done["status"], done["blocked"]["reason"]) == ("FAILED", "launch_failed"), done
    assert done["blocked"]["detail"] == f"replacement of worker {second} failed to launch"
    assert store.get_worker(replacement_id(rollout_id, second)).status == S.FAILED
    assert store.find_worker(replacement_id(rollout_id, first)) is None
    # The first waited on the budget in that same step.
    waiting = [(w["worker_id"], w["why"]) for w in disruption_view(control_plane)["waiting"]]
    assert waiting == [(first, "budget")]


def _starts_drain_of(params: dict[str, Any], worker_id: str) -> bool:
    """Whether a TransactWriteItems moves the worker to DRAINING."""
    for item in params["TransactItems"]:
        update = item.get("Update", {})
        if (
            update.get("Key", {}).get("PK", {}).get("S") == f"WORKER#{worker_id}"
            and {"S": "DRAINING"} in update.get("ExpressionAttributeValues", {}).values()
        ):
            return True
    return False


@pytest.mark.parametrize("racer", ["operator_drains", "ec2_stops"])
def test_given_the_old_worker_changes_just_before_the_steps_drain_then_no_error_and_the_next_step_decides(
    control_plane: ControlPlane,
    ec2_worker: WorkerFactory,
    ec2: Any,
    caplog: pytest.LogCaptureFixture,
    racer: str,
) -> None:
    """Between the step's read of a surge's old worker and the write that starts its drain, an operator
    drains it or EC2 stops it. Before: the drain command answered the 409 it gives an operator (the
    worker is no longer RUNNING), and the engine logged it at ERROR and counted it in rollout_errors,
    for a race this ordinary."""
    pool_labs(control_plane, {"max": 2})
    old = ec2_worker(pool="labs")
    launchable(control_plane, ec2)
    rollout_id = start_rollout(control_plane, worker_ids=[old.id])
    # The racer writes with a context made before the hook, so its own writes are not raced.
    plain = control_plane.ctx
    fired: list[str] = []

    def race(params: dict[str, Any], **_: Any) -> None:
        if fired or not _starts_drain_of(params, old.id):
            return
        fired.append(racer)
        if racer == "operator_drains":
            drains.start_worker_drain(plain, old.id, actor="operator", reason="kernel patch")
        else:
            ec2.stop_instances(InstanceIds=[old.ec2_instance_id])
            apply_state_change(
                plain, instance_id=old.ec2_instance_id or "", state="stopping", at=utcnow(), region=old.region
            )

    errors = 0
    done: dict[str, Any] | None = None
    with faults.installed_hooks([("before-parameter-build.dynamodb.TransactWriteItems", race)]):
        hooked = build_context(get_settings())
        for _ in range(40):
            errors += reconcile_fleet(hooked).counters["rollout_errors"]
            done = ended(control_plane, rollout_id)
            if done is not None:
                break
            time.sleep(0.3)

    assert fired == [racer]
    assert errors == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    # The next step found the old worker taken out by the racer: its replacement runs, and that is all.
    assert done is not None
    assert (done["status"], done["replaced"]) == ("SUCCEEDED", 1), done
    store = control_plane.ctx.store
    assert store.get_worker(replacement_id(rollout_id, old.id)).status == S.RUNNING
    assert store.get_worker(old.id).status != S.RUNNING
