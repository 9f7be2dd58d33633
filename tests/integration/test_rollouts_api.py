"""Rollouts through the API: start (and dry_run), the 422s naming the field, the exact 409 when another
active rollout covers a worker, list and read, pause, resume and cancel with their conflicts, and the
audit trail and events they leave."""

from __future__ import annotations

import pytest

from fleetkeeper.domain.models import Worker
from fleetkeeper.services import rollouts
from fleetkeeper_local.controlplane import DEFAULT_CALLER
from tests.integration.emf import metric_totals

pytestmark = pytest.mark.integration


@pytest.fixture
def labs(control_plane, running_worker) -> list[Worker]:
    """Five RUNNING lab-small workers in pool labs, and one lab-small outside it."""
    inside = [running_worker(template="lab-small", pool="labs") for _ in range(5)]
    running_worker(template="lab-small")
    return inside


def test_given_a_dry_run_then_200_with_the_waves_and_nothing_written(control_plane, labs):
    status, plan = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {"template": "lab-small", "pool": "labs", "max_unavailable": "40%", "dry_run": True},
    )

    assert status == 200, plan
    assert (plan["total"], plan["max_unavailable"]) == (5, 2)
    ids = sorted(w.id for w in labs)
    assert [w["worker_ids"] for w in plan["waves"]] == [ids[0:2], ids[2:4], ids[4:5]]
    assert [w["count"] for w in plan["waves"]] == [2, 2, 1]
    assert control_plane.api("GET", "/api/v1/rollouts")[1]["items"] == []


def test_given_a_dry_run_larger_than_the_listed_workers_then_later_waves_answer_their_count_only(
    control_plane, labs, monkeypatch
):
    # 5 workers in waves of 2, ids listed up to 3: the first wave only (the second would reach 4).
    monkeypatch.setattr(rollouts.commands, "PLAN_LISTED_WORKERS", 3)

    status, plan = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {"template": "lab-small", "pool": "labs", "max_unavailable": 2, "dry_run": True},
    )

    assert status == 200, plan
    ids = sorted(w.id for w in labs)
    assert plan["total"] == 5
    assert [(w["index"], w["count"], w["worker_ids"]) for w in plan["waves"]] == [
        (0, 2, ids[0:2]),
        (1, 2, None),
        (2, 1, None),
    ]


def test_given_a_rollout_started_then_202_with_the_view_and_it_lists_and_reads(
    control_plane, labs, audit_feed
):
    status, started = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {"template": "lab-small", "pool": "labs", "max_unavailable": 2, "checkpoints": [50], "reason": "AMI"},
    )

    assert status == 202, started
    assert started["status"] == "RUNNING"
    assert (started["total"], started["replaced"], started["in_progress"], started["remaining"]) == (
        5,
        0,
        0,
        5,
    )
    assert (started["percent"], started["checkpoint"], started["blocked"], started["waves"]) == (
        0,
        None,
        None,
        3,
    )
    assert started["reason"] == "AMI"
    assert started["started_by"]
    status, read = control_plane.api("GET", f"/api/v1/rollouts/{started['id']}")
    assert (status, read["id"], read["status"]) == (200, started["id"], "RUNNING")
    status, listed = control_plane.api("GET", "/api/v1/rollouts")
    assert (status, [r["id"] for r in listed["items"]]) == (200, [started["id"]])
    assert "RolloutStarted" in audit_feed()
    trail = control_plane.ctx.store.audit_page("rollout", started["id"]).items
    assert [(e.action, e.to_status) for e in trail] == [("RolloutStarted", "RUNNING")]


def test_given_rollouts_then_they_list_newest_first_a_page_at_a_time(control_plane, running_worker):
    ids = []
    for _ in range(3):
        worker = running_worker(template="lab-small")
        _, started = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": [worker.id]})
        ids.append(started["id"])

    _, first = control_plane.api("GET", "/api/v1/rollouts", query={"limit": "2"})
    _, second = control_plane.api(
        "GET", "/api/v1/rollouts", query={"limit": "2", "next_token": first["next_token"]}
    )

    assert [r["id"] for r in first["items"] + second["items"]] == ids[::-1]


ALARMS = "body.rollback_on_alarms"
BAD_REQUESTS = [
    ({"template": "lab-small", "max_unavailable": 0}, "body.max_unavailable"),
    ({"template": "lab-small", "max_unavailable": "150%"}, "body.max_unavailable"),
    ({"template": "lab-small", "strategy": "all_at_once"}, "body.strategy"),
    ({"template": "lab-small", "checkpoints": [60, 30]}, "body.checkpoints"),
    ({"template": "lab-small", "checkpoints": [100]}, "body.checkpoints.0"),
    ({"template": "lab-small", "bake_seconds": 8 * 24 * 3600}, "body.bake_seconds"),
    ({"template": "lab-small", "reason": "r" * 501}, "body.reason"),
    ({"worker_ids": ["w-1", "w-1"]}, "body.worker_ids"),
    ({"template": "lab-small", "colour": "blue"}, "body.colour"),
    ({}, "template"),
    ({"template": "nope"}, "template"),
    ({"template": "lab-small", "pool": "nope"}, "pool"),
    ({"worker_ids": ["w-missing"]}, "worker_ids"),
    ({"template": "lab-small", "worker_ids": ["w-1"]}, "template"),
    ({"template": "lab-small", "rollback_on_alarms": [f"a{i}" for i in range(11)]}, ALARMS),
    ({"template": "lab-small", "rollback_on_alarms": ["a", "a"]}, "body.rollback_on_alarms"),
    ({"template": "lab-small", "rollback_on_alarms": "errors"}, "body.rollback_on_alarms"),
    ({"template": "lab-small", "rollback_on_alarms": [""]}, f"{ALARMS}.0"),
    ({"template": "lab-small", "rollback_on_alarms": ["x" * 256]}, f"{ALARMS}.0"),
]


@pytest.mark.parametrize(("body", "field"), BAD_REQUESTS)
def test_given_a_bad_request_then_422_names_the_field_and_nothing_starts(control_plane, labs, body, field):
    status, answer = control_plane.api("POST", "/api/v1/rollouts", body)

    assert status == 422, answer
    assert [d["field"] for d in answer["details"]] == [field]
    assert control_plane.api("GET", "/api/v1/rollouts")[1]["items"] == []


def test_given_an_active_rollout_then_another_covering_one_of_its_workers_is_409(control_plane, labs):
    _, first = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs"})

    # Another scope that shares one worker: the template everywhere, then one worker named.
    status, whole = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small"})
    status_named, named = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": [labs[3].id]})

    assert (status, whole["error"], whole["details"]["id"]) == (409, "CONFLICT", first["id"])
    assert whole["details"]["current_status"] == "RUNNING"
    assert (status_named, named["details"]["worker_id"]) == (409, labs[3].id)
    # The losers claimed nothing: the worker outside the pool is free for a rollout of its own.
    outside = next(
        w
        for w in control_plane.ctx.store.placement_candidates(template="lab-small", pool=None)
        if w.pool is None
    )
    assert control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": [outside.id]})[0] == 202
    # Once the first is cancelled, its workers can be rolled out again: its claims hold nothing.
    control_plane.api("POST", f"/api/v1/rollouts/{first['id']}/cancel")
    status, again = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs"})
    assert (status, again["total"]) == (202, 5), again
    owners = [control_plane.ctx.store.get_worker(w.id).owner for w in labs]
    assert [o.rollout_id if o else None for o in owners] == [again["id"]] * 5


def test_given_workers_another_rollout_holds_then_a_template_start_leaves_them_to_it(control_plane, labs):
    ids = sorted(w.id for w in labs)
    _, first = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": ids[3:5]})

    status, second = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs"})

    # Accepted: the door keeps the two rollouts apart, worker by worker; the first keeps its own.
    assert (status, second["total"]) == (202, 5), second
    holders = {w: control_plane.ctx.store.get_worker(w).owner for w in ids}
    assert {w: o.rollout_id if o else None for w, o in holders.items()} == {
        ids[0]: second["id"],
        ids[1]: second["id"],
        ids[2]: second["id"],
        ids[3]: first["id"],
        ids[4]: first["id"],
    }


def test_given_pause_resume_cancel_then_each_moves_only_from_its_statuses(control_plane, labs, audit_feed):
    _, started = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs"})
    base = f"/api/v1/rollouts/{started['id']}"

    status, resumed = control_plane.api("POST", f"{base}/resume")
    assert (status, resumed["details"]["current_status"]) == (409, "RUNNING")
    status, paused = control_plane.api("POST", f"{base}/pause", {"reason": "error rate up"})
    assert (status, paused["status"], paused["blocked"]["reason"]) == (200, "PAUSED", "paused")
    assert paused["blocked"]["detail"] == f"paused by {DEFAULT_CALLER}"
    assert control_plane.api("POST", f"{base}/pause")[0] == 409
    status, resumed = control_plane.api("POST", f"{base}/resume")
    assert (status, resumed["status"], resumed["blocked"]) == (200, "RUNNING", None)
    status, cancelled = control_plane.api("POST", f"{base}/cancel")
    assert (status, cancelled["status"]) == (200, "CANCELLED")
    assert cancelled["finished_at"] is not None
    status, again = control_plane.api("POST", f"{base}/cancel")
    assert (status, again["details"]["current_status"]) == (409, "CANCELLED")
    assert control_plane.api("POST", "/api/v1/rollouts/ro-unknown/pause")[0] == 404
    assert control_plane.api("GET", "/api/v1/rollouts/ro-unknown")[0] == 404
    trail = control_plane.ctx.store.audit_page("rollout", started["id"]).items
    assert [(e.action, e.from_status, e.to_status) for e in reversed(trail)] == [
        ("RolloutStarted", None, "RUNNING"),
        ("RolloutPaused", "RUNNING", "PAUSED"),
        ("RolloutResumed", "PAUSED", "RUNNING"),
        ("RolloutCancelled", "RUNNING", "CANCELLED"),
    ]
    assert [e for e in audit_feed() if e.startswith("Rollout")] == [
        "RolloutStarted",
        "RolloutPaused",
        "RolloutResumed",
        "RolloutCancelled",
    ]


def test_given_a_rollout_started_then_cancelled_then_the_api_counts_one_of_each_and_a_plan_none(
    control_plane, labs, capsys
):
    capsys.readouterr()
    body = {"template": "lab-small", "pool": "labs"}
    assert control_plane.api("POST", "/api/v1/rollouts", {**body, "dry_run": True})[0] == 200
    _, started = control_plane.api("POST", "/api/v1/rollouts", body)
    assert control_plane.api("POST", f"/api/v1/rollouts/{started['id']}/cancel")[0] == 200
    assert control_plane.api("POST", f"/api/v1/rollouts/{started['id']}/pause")[0] == 409

    totals = metric_totals(capsys.readouterr().out)

    rollout_metrics = {name: value for name, value in totals.items() if name.startswith("Rollout")}
    assert rollout_metrics == {"RolloutStarted": 1, "RolloutCancelled": 1}


def test_given_a_rollout_then_a_rollback_is_202_rolling_back_once_and_409_or_404_otherwise(
    control_plane, labs, audit_feed
):
    status, started = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {"template": "lab-small", "pool": "labs", "rollback_on_alarms": ["lab-errors"]},
    )
    assert (status, started["rollback_on_alarms"], started["rollback"]) == (202, ["lab-errors"], None)
    base = f"/api/v1/rollouts/{started['id']}"

    status, rolling = control_plane.api("POST", f"{base}/rollback", {"reason": "bad AMI"})

    assert (status, rolling["status"], rolling["finished_at"]) == (202, "ROLLING_BACK", None), rolling
    assert rolling["rollback"]["reason"] == "bad AMI"
    assert rolling["rollback"]["total"] == 1  # the first wave (10% of 5: one worker) is all it reached
    status, again = control_plane.api("POST", f"{base}/rollback")
    assert (status, again["error"], again["details"]["current_status"]) == (409, "CONFLICT", "ROLLING_BACK")
    status, paused = control_plane.api("POST", f"{base}/pause")
    assert (status, paused["details"]["current_status"]) == (409, "ROLLING_BACK")
    status, missing = control_plane.api("POST", "/api/v1/rollouts/ro-unknown/rollback")
    assert (status, missing["error"]) == (404, "NOT_FOUND")
    status, bad = control_plane.api("POST", f"{base}/rollback", {"reason": "r" * 501})
    assert (status, [d["field"] for d in bad["details"]]) == (422, ["body.reason"])
    trail = control_plane.ctx.store.audit_page("rollout", started["id"]).items
    assert [(e.action, e.from_status, e.to_status, e.reason) for e in reversed(trail)] == [
        ("RolloutStarted", None, "RUNNING", None),
        ("RolloutRollbackStarted", "RUNNING", "ROLLING_BACK", "bad AMI"),
    ]
    events = [e for e in audit_feed() if e.startswith("Rollout")]
    assert events == ["RolloutStarted", "RolloutRollbackStarted"]


def test_given_a_finished_rollout_then_it_can_still_be_rolled_back(control_plane, labs):
    _, started = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs"})
    base = f"/api/v1/rollouts/{started['id']}"
    assert control_plane.api("POST", f"{base}/cancel")[0] == 200

    status, rolling = control_plane.api("POST", f"{base}/rollback")

    assert (status, rolling["status"]) == (202, "ROLLING_BACK"), rolling
