"""Rollbacks advanced by reconcile cycles, with the real drain workflow on moto's Step Functions: the
workers a rollout drained come back with their image and instance type, never more than
max_unavailable replacements drain at once, a surge stopped before its drains keeps its old workers,
and an alarm in ALARM starts the rollback (a CloudWatch that fails leaves the rollout where it is)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

import boto3
import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.rollouts import replacement_id, restoration_id
from fleetkeeper.services import workers
from fleetkeeper_local import faults
from fleetkeeper_local.images import publish_newer_image
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import cycle_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S = WorkerStatus
MAX_CYCLES = 80
_LEAVING = frozenset({S.DRAINING, S.STOPPING, S.TERMINATING})


def _put_template(control_plane, **fields: Any) -> None:
    body = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 4, **fields}
    status, answer = control_plane.api("PUT", "/api/v1/templates/lab", body)
    assert status in {200, 201}, answer


def _cycles(control_plane, until: Callable[[], Any], sample: Callable[[], None] = lambda: None) -> Any:
    return cycle_until(control_plane, until, sample, max_cycles=MAX_CYCLES, pause=0.2)


def _view(control_plane, rollout_id: str) -> dict[str, Any]:
    status, view = control_plane.api("GET", f"/api/v1/rollouts/{rollout_id}")
    assert status == 200, view
    return dict(view)


def _status_is(control_plane, rollout_id: str, *statuses: str) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        view = _view(control_plane, rollout_id)
        return view if view["status"] in statuses else None

    return probe


@pytest.fixture
def fleet_size() -> int:
    """How many workers `launched_fleet` launches; a test that needs no wave beyond the first asks
    for two with `@pytest.mark.parametrize("fleet_size", [2])`: each worker costs its cycles."""
    return 4


@pytest.fixture
def launched_fleet(control_plane, ec2, fleet_size: int) -> tuple[list[str], str]:
    """`fleet_size` RUNNING workers of template lab in pool labs (budget: two disruptions at once),
    launched by the reconciler from the filter's image; returns their ids and that image."""
    _put_template(control_plane)
    image, _ = publish_newer_image(ec2, "lab-*")
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 2}]}})
    assert status == 201
    ids = []
    for _ in range(fleet_size):
        status, created = control_plane.api("POST", "/api/v1/workers", {"template": "lab", "pool": "labs"})
        assert status == 201, created
        ids.append(created["id"])
    store = control_plane.ctx.store
    _cycles(control_plane, lambda: set(store.worker_statuses(ids).values()) == {S.RUNNING})
    return sorted(ids), image


def test_given_a_rollout_that_succeeded_then_its_rollback_restores_the_image_and_type_two_at_a_time(
    control_plane, ec2, launched_fleet
):
    old, original_image = launched_fleet
    store = control_plane.ctx.store
    _put_template(control_plane, instance_type="m5.xlarge")
    new_image, _ = publish_newer_image(ec2, "lab-*")
    _, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "max_unavailable": 2}
    )
    rollout_id = started["id"]
    replacements = [replacement_id(rollout_id, w) for w in old]
    _cycles(control_plane, _status_is(control_plane, rollout_id, "SUCCEEDED", "FAILED"))
    assert _view(control_plane, rollout_id)["status"] == "SUCCEEDED"
    assert {(w.image_id, w.instance_type) for w in store.get_workers(replacements)} == {
        (new_image, "m5.xlarge")
    }

    status, rolling = control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback", {"reason": "bad"})
    assert (status, rolling["status"], rolling["rollback"]["total"]) == (202, "ROLLING_BACK", 4), rolling
    leaving: list[int] = []

    def sample() -> None:
        statuses = store.worker_statuses(replacements)
        leaving.append(sum(1 for s in statuses.values() if s in _LEAVING))

    done = _cycles(
        control_plane, _status_is(control_plane, rollout_id, "ROLLED_BACK", "FAILED"), sample=sample
    )

    assert (done["status"], done["rollback"]["rolled_back"], done["rollback"]["skipped"]) == (
        "ROLLED_BACK",
        4,
        0,
    ), done
    assert max(leaving) <= 2, leaving
    assert max(leaving) >= 1, leaving
    assert set(store.worker_statuses(replacements).values()) == {S.TERMINATED}
    restored = store.get_workers([restoration_id(rollout_id, w) for w in old])
    assert len(restored) == 4
    assert {(w.status, w.image_id, w.instance_type) for w in restored} == {
        (S.RUNNING, original_image, "m5.large")
    }
    # Pinned to what the template no longer launches: drift says so.
    assert all(w.drift is not None for w in restored)
    status, shown = control_plane.api("GET", f"/api/v1/workers/{restored[0].id}")
    pinned = (shown["pinned_image_id"], shown["pinned_instance_type"])
    assert (status, pinned) == (200, (original_image, "m5.large"))
    drain = store.get_worker(replacements[0]).drain
    assert drain is not None
    assert drain.requested_by == f"rollout:{rollout_id}"
    trail = [e.action for e in reversed(store.audit_page("rollout", rollout_id).items)]
    assert trail == ["RolloutStarted", "RolloutSucceeded", "RolloutRollbackStarted", "RolloutRolledBack"]


def test_given_a_surge_stopped_before_its_drains_then_the_rollback_keeps_the_old_workers(
    control_plane, launched_fleet
):
    old, _ = launched_fleet
    store = control_plane.ctx.store
    _, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "max_unavailable": 2}
    )
    rollout_id = started["id"]
    reconcile_fleet(control_plane.ctx)  # the first wave's replacements are created
    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/pause")[0] == 200
    first_wave = old[:2]
    replacements = [replacement_id(rollout_id, w) for w in first_wave]
    assert len(store.get_workers(replacements)) == 2

    status, rolling = control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback")
    assert (status, rolling["rollback"]["total"]) == (202, 2), rolling
    done = _cycles(control_plane, _status_is(control_plane, rollout_id, "ROLLED_BACK", "FAILED"))

    assert (done["status"], done["rollback"]["rolled_back"]) == ("ROLLED_BACK", 2), done
    assert set(store.worker_statuses(old).values()) == {S.RUNNING}
    assert set(store.worker_statuses(replacements).values()) == {S.TERMINATED}
    assert store.get_workers([restoration_id(rollout_id, w) for w in old]) == []


def _alarm(state: Literal["OK", "ALARM"]) -> str:
    cloudwatch = boto3.client("cloudwatch")
    cloudwatch.put_metric_alarm(
        AlarmName="lab-errors",
        Namespace="lab",
        MetricName="Errors",
        Statistic="Sum",
        Period=60,
        EvaluationPeriods=1,
        Threshold=1,
        ComparisonOperator="GreaterThanOrEqualToThreshold",
    )
    cloudwatch.set_alarm_state(AlarmName="lab-errors", StateValue=state, StateReason="test")
    return "lab-errors"


@pytest.mark.parametrize("fleet_size", [2])
@pytest.mark.usefixtures("launched_fleet")
def test_given_an_alarm_in_alarm_then_the_rollout_rolls_back(control_plane):
    name = _alarm("OK")
    _, started = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {"template": "lab", "pool": "labs", "max_unavailable": 2, "rollback_on_alarms": [name, "absent"]},
    )
    rollout_id = started["id"]
    report = reconcile_fleet(control_plane.ctx)
    assert report.counters["rollout_steps"] == 1
    assert _view(control_plane, rollout_id)["status"] == "RUNNING"

    _alarm("ALARM")
    report = reconcile_fleet(control_plane.ctx)

    assert report.counters["rollout_alarm_rollbacks"] == 1
    view = _view(control_plane, rollout_id)
    assert (view["status"], view["rollback"]["started_by"]) == ("ROLLING_BACK", f"alarm:{name}"), view
    trail = control_plane.ctx.store.audit_page("rollout", rollout_id).items
    assert (trail[0].action, trail[0].actor) == ("RolloutRollbackStarted", f"alarm:{name}")
    assert trail[0].reason is not None
    assert name in trail[0].reason


@pytest.mark.parametrize("fleet_size", [2])
def test_given_describe_alarms_failing_then_the_rollout_stays_and_the_cycle_completes(
    control_plane, launched_fleet
):
    old, _ = launched_fleet
    name = _alarm("ALARM")
    _, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "rollback_on_alarms": [name]}
    )
    rollout_id = started["id"]
    before = _view(control_plane, rollout_id)
    plan = faults.FaultPlan(
        seed=1,
        faults=[
            faults.Fault("cloudwatch", "InternalServiceError", frozenset({"DescribeAlarms"}), status=500)
        ],
    )

    with plan.installed():
        report = reconcile_fleet(control_plane.ctx)

    assert report.counters["rollout_alarm_errors"] == 1
    assert report.counters["rollout_steps"] == 0
    after = _view(control_plane, rollout_id)
    # It stays RUNNING, takes no step, and says why.
    assert (after["status"], after["wave"], after["in_progress"]) == ("RUNNING", before["wave"], 0)
    assert after["blocked"]["reason"] == "alarms", after
    assert "cannot be read" in after["blocked"]["detail"]
    assert set(control_plane.ctx.store.worker_statuses(old).values()) == {S.RUNNING}
    with plan.installed():  # still unreadable: the same blocker, not written again
        reconcile_fleet(control_plane.ctx)
    assert _view(control_plane, rollout_id)["updated_at"] == after["updated_at"]
    # CloudWatch answers again: the alarm it could not read starts the rollback.
    reconcile_fleet(control_plane.ctx)
    view = _view(control_plane, rollout_id)
    # Its first wave had not started: the rollback has nothing to undo and may finish in the same cycle.
    assert view["status"] in {"ROLLING_BACK", "ROLLED_BACK"}, view
    assert view["rollback"]["started_by"] == f"alarm:{name}"


def test_given_a_lost_answer_to_a_restoring_workers_creation_then_the_next_cycle_finds_it_not_a_second(
    control_plane, launched_fleet
):
    old, _ = launched_fleet
    store = control_plane.ctx.store
    _, started = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {"template": "lab", "pool": "labs", "max_unavailable": 2, "strategy": "drain_first"},
    )
    rollout_id = started["id"]
    first_wave = old[:2]
    _cycles(control_plane, lambda: set(store.worker_statuses(first_wave).values()) == {S.TERMINATED})
    restoring = [restoration_id(rollout_id, w) for w in first_wave]
    lost = faults.Fault(
        "dynamodb",
        "InternalServerError",
        frozenset({"TransactWriteItems"}),
        status=500,
        after=True,  # the worker is created, the step never hears it
        limit=1,
        when=lambda _operation, params: any(f"WORKER#{w}" in json.dumps(params) for w in restoring),
    )
    status, _ = control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback")
    assert status == 202

    with faults.FaultPlan(seed=1, faults=[lost]).installed():
        reconcile_fleet(control_plane.ctx)
    done = _cycles(control_plane, _status_is(control_plane, rollout_id, "ROLLED_BACK", "FAILED"))

    assert lost.injected == 1
    assert (done["status"], done["rollback"]["rolled_back"]) == ("ROLLED_BACK", 2), done
    status, page = control_plane.api("GET", "/api/v1/workers", query={"pool": "labs", "limit": "100"})
    assert status == 200
    serving = sorted(w["id"] for w in page["items"] if w["status"] == "RUNNING")
    # The two workers the rollout never reached, and one restoring worker for each it drained.
    assert serving == sorted([*old[2:], *restoring])


def _succeeded_rollout(control_plane, ec2, old: list[str]) -> str:
    publish_newer_image(ec2, "lab-*")
    _, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "max_unavailable": 4}
    )
    rollout_id = str(started["id"])
    _cycles(control_plane, _status_is(control_plane, rollout_id, "SUCCEEDED", "FAILED"))
    assert _view(control_plane, rollout_id)["status"] == "SUCCEEDED"
    return rollout_id


@pytest.mark.parametrize("fleet_size", [2])
def test_given_a_restoring_worker_that_failed_to_launch_then_the_rollback_launches_the_next_and_finishes(
    control_plane, ec2, launched_fleet
):
    old, original_image = launched_fleet
    store = control_plane.ctx.store
    rollout_id = _succeeded_rollout(control_plane, ec2, old)
    # An earlier attempt's restoring worker failed to launch (a cause since mended).
    first = workers.create_worker(
        store,
        template="lab",
        region="us-east-1",
        pool="labs",
        actor="test",
        worker_id=restoration_id(rollout_id, old[0]),
    )
    store.transition_worker(first, S.FAILED, cause=Cause.CONTROL, actor="test")

    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback")[0] == 202
    done = _cycles(control_plane, _status_is(control_plane, rollout_id, "ROLLED_BACK", "FAILED"))

    assert (done["status"], done["rollback"]["rolled_back"]) == ("ROLLED_BACK", 2), done
    second = store.get_worker(restoration_id(rollout_id, old[0], 1))
    assert (second.status, second.image_id) == (S.RUNNING, original_image)


@pytest.mark.parametrize("fleet_size", [2])
def test_given_a_replacement_an_operator_drained_then_the_rollback_restores_nothing_in_its_place(
    control_plane, ec2, launched_fleet
):
    old, _ = launched_fleet
    store = control_plane.ctx.store
    rollout_id = _succeeded_rollout(control_plane, ec2, old)
    taken = replacement_id(rollout_id, old[0])
    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{taken}/drain", {"reason": "retire it", "timeout_seconds": 3600}
    )
    assert status == 202, body

    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback")[0] == 202
    done = _cycles(control_plane, _status_is(control_plane, rollout_id, "ROLLED_BACK", "FAILED"))

    assert (done["status"], done["rollback"]["rolled_back"], done["rollback"]["skipped"]) == (
        "ROLLED_BACK",
        1,
        1,
    ), done
    assert store.find_worker(restoration_id(rollout_id, old[0])) is None
    assert all(store.find_worker(restoration_id(rollout_id, w)) is not None for w in old[1:])


@pytest.mark.parametrize("fleet_size", [2])
def test_given_a_rollback_that_cannot_go_on_then_an_operator_cancels_it_and_may_ask_again(
    control_plane, ec2, launched_fleet
):
    old, _ = launched_fleet
    rollout_id = _succeeded_rollout(control_plane, ec2, old)
    # A freeze: no rollout drain is ever admitted, so the rollback would wait for good.
    status, _ = control_plane.api(
        "PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 0, "reasons": ["rollout"]}]}}
    )
    assert status == 200
    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback")[0] == 202
    reconcile_fleet(control_plane.ctx)

    status, cancelled = control_plane.api(
        "POST", f"/api/v1/rollouts/{rollout_id}/cancel", {"reason": "frozen"}
    )

    assert (status, cancelled["status"]) == (200, "CANCELLED"), cancelled
    status, again = control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback")
    assert (status, again["status"]) == (202, "ROLLING_BACK"), again


def test_given_a_rollback_while_the_forward_wave_still_drains_then_never_more_than_max_unavailable_are_out(
    control_plane, ec2, launched_fleet
):
    old, _ = launched_fleet
    store = control_plane.ctx.store
    # A budget that does not bind: only max_unavailable keeps the drains apart here.
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 10}]}})
    assert status == 200
    first_wave = old[:2]
    sessions = []
    for worker_id in first_wave:  # running work keeps their drains in progress
        status, placed = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker_id})
        assert status == 201, placed
        assert (
            control_plane.api("POST", f"/api/v1/instances/{placed['id']}/state", {"state": "RUNNING"})[0]
            == 200
        )
        sessions.append(placed["id"])
    publish_newer_image(ec2, "lab-*")
    _, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "max_unavailable": 2}
    )
    rollout_id = started["id"]
    _cycles(control_plane, lambda: set(store.worker_statuses(first_wave).values()) == {S.DRAINING})
    replacements = [replacement_id(rollout_id, w) for w in first_wave]
    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback")[0] == 202
    out: list[int] = []

    def sample() -> None:
        statuses = store.worker_statuses([*first_wave, *replacements])
        out.append(sum(1 for s in statuses.values() if s in _LEAVING))

    for _ in range(4):  # the old workers still drain: the replacements' drains wait for room
        reconcile_fleet(control_plane.ctx)
        sample()
    assert max(out) <= 2, out
    assert set(store.worker_statuses(replacements).values()) == {S.RUNNING}
    assert _view(control_plane, rollout_id)["blocked"]["reason"] == "drain_waiting"

    for session in sessions:  # the work ends, the old workers go, the rollback goes on
        assert (
            control_plane.api("POST", f"/api/v1/instances/{session}/state", {"state": "COMPLETED"})[0] == 200
        )
    done = _cycles(
        control_plane, _status_is(control_plane, rollout_id, "ROLLED_BACK", "FAILED"), sample=sample
    )

    assert done["status"] == "ROLLED_BACK", done
    assert max(out) <= 2, out
