"""Disruption budgets through the API: PUT and its 422s, the pool's disruption view, and an operator's
drain that is never refused but says which budget it goes beyond."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fleetkeeper.domain.disruption import MAX_BUDGETS, DisruptionReason, Waiting
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import utcnow

pytestmark = pytest.mark.integration

BUSINESS_HOURS_FREEZE = {
    "max": 0,
    "reasons": ["scale_down", "rollout"],
    "schedule": "0 9 * * mon-fri",
    "duration": "8h",
    "timezone": "Europe/Berlin",
}


def test_given_budgets_in_a_pool_put_then_they_are_stored_echoed_and_replaced_whole(control_plane):
    status, created = control_plane.api(
        "PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": "10%"}, BUSINESS_HOURS_FREEZE]}}
    )
    assert status == 201, created
    assert created["disruption"]["budgets"][0] == {
        "max": "10%",
        "reasons": None,
        "schedule": None,
        "duration": None,
        "timezone": None,
    }
    assert created["disruption"]["budgets"][1] == BUSINESS_HOURS_FREEZE

    # A PUT without the field keeps the budgets; with it, they are replaced; an empty list removes them.
    status, described = control_plane.api("PUT", "/api/v1/pools/labs", {"description": "labs"})
    assert (status, len(described["disruption"]["budgets"])) == (200, 2)
    _, replaced = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": "3"}]}})
    assert [b["max"] for b in replaced["disruption"]["budgets"]] == [3]
    _, cleared = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": []}})
    assert cleared["disruption"] == {"budgets": []}
    assert control_plane.ctx.store.get_pool("labs").disruption.budgets == []


BAD_BUDGETS = [
    ({"max": 1, "schedule": "0 9 * * mon-fry", "duration": "8h"}, "schedule"),
    ({"max": 1, "schedule": "61 9 * * *", "duration": "8h"}, "schedule"),
    ({"max": 1, "schedule": "0 9 * * *", "duration": "8h", "timezone": "Europe/Atlantis"}, "timezone"),
    ({"max": 1, "schedule": "0 9 * * *", "duration": "8h", "timezone": "posix/Europe/Berlin"}, "timezone"),
    ({"max": 1, "schedule": "0 9 * * *", "duration": "8h", "timezone": "right/UTC"}, "timezone"),
    ({"max": 1, "schedule": "0 9 * * *", "duration": "8h", "timezone": "localtime"}, "timezone"),
    ({"max": 1, "schedule": "0 0 30 2 *", "duration": "8h"}, "schedule"),
    ({"max": 1, "schedule": "0 9 * * *", "duration": "eight hours"}, "duration"),
    ({"max": 1, "schedule": "0 9 * * *"}, "duration"),
    ({"max": "ten"}, "max"),
    ({"max": "150%"}, "max"),
    ({"max": -2}, "max"),
    ({"max": 1, "reasons": ["maintenance"]}, "reasons.0"),
    ({"max": 1, "nodes": 2}, "nodes"),
]


def test_given_a_bad_budget_when_put_then_422_names_the_field(control_plane):
    for budget, field in BAD_BUDGETS:
        status, body = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [budget]}})

        assert (status, body["error"]) == (422, "VALIDATION_FAILED"), budget
        assert [d["field"] for d in body["details"]] == [f"body.disruption.budgets.0.{field}"], budget
    assert control_plane.api("GET", "/api/v1/pools/labs")[0] == 404  # nothing was created


def test_given_a_schedule_that_never_fires_when_put_then_422_says_so(control_plane):
    budget = {"max": 0, "schedule": "0 0 31 4 *", "duration": "1h", "timezone": "US/Eastern"}

    status, body = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [budget]}})

    assert status == 422
    assert body["details"] == [
        {
            "field": "body.disruption.budgets.0.schedule",
            "reason": "never fires: none of its months has a day 31",
        }
    ]


def test_given_too_many_budgets_then_422_and_the_item_stays_bounded(control_plane):
    budgets = [{"max": n} for n in range(MAX_BUDGETS + 1)]

    status, body = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": budgets}})

    assert status == 422
    assert [d["field"] for d in body["details"]] == ["body.disruption.budgets"]


def test_given_a_pool_with_budgets_then_its_disruption_view_says_what_applies_and_what_is_in_use(
    control_plane, running_worker
):
    workers = [running_worker(pool="labs") for _ in range(4)]
    store = control_plane.ctx.store
    store.transition_worker(
        workers[0], WorkerStatus.DRAINING, actor="test", reason="by hand", cause=Cause.CONTROL
    )
    always = {"max": "50%", "reasons": ["scale_down"]}
    night = {"max": 1, "schedule": "0 22 * * *", "duration": "8h", "timezone": "America/New_York"}
    control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [always, night]}})
    refused = Waiting(
        worker_id=workers[1].id,
        reason=DisruptionReason.SCALE_DOWN,
        action="drain",
        budget=0,
        allowed=2,
        in_use=2,
        refused_at=utcnow() - timedelta(minutes=1),
    )
    gone = refused.model_copy(update={"worker_id": workers[0].id})
    stale = refused.model_copy(
        update={"worker_id": workers[2].id, "refused_at": utcnow() - timedelta(hours=1)}
    )
    control_plane.ctx.waiting.add("labs", [refused, gone, stale], utcnow())

    status, view = control_plane.api("GET", "/api/v1/pools/labs/disruption")

    assert status == 200, view
    assert (view["members"], view["in_use"], view["disrupting"]) == (4, 1, [workers[0].id])
    assert [(b["index"], b["allowed"]) for b in view["budgets"]] == [(0, 2), (1, 1)]
    assert view["budgets"][0]["active"] is True
    assert view["budgets"][0]["reasons"] == ["scale_down"]
    assert view["budgets"][1]["reasons"] == [r.value for r in DisruptionReason]
    by_reason = {r["reason"]: r for r in view["reasons"]}
    night_active = view["budgets"][1]["active"]
    assert by_reason["scale_down"]["governed_by"] == "pool"
    assert by_reason["scale_down"]["limiting"] == (1 if night_active else 0)
    assert by_reason["rollout"]["governed_by"] == ("pool" if night_active else "stage_default")
    assert view["next_change"] is not None
    assert view["stage_default"] == {"max": "10%", "allowed": 1, "in_use": 1}
    # Only the recent refusal of a worker still RUNNING waits.
    assert [w["worker_id"] for w in view["waiting"]] == [workers[1].id]
    assert view["waiting"][0]["budget"] == 0
    assert control_plane.api("GET", "/api/v1/pools/nowhere/disruption")[0] == 404


def test_given_a_freeze_when_an_operator_drains_then_the_drain_starts_and_names_the_budget(
    control_plane, ec2_worker
):
    worker = ec2_worker(pool="labs")
    ec2_worker(pool="labs")
    control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": "10%"}, {"max": 0}]}})

    status, plan = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {"dry_run": True})
    assert (status, plan["may_start"]) == (200, True)
    assert plan["budget_exceeded"] == {
        "pool": "labs",
        "budget": 1,
        "max": 0,
        "allowed": 0,
        "in_use": 1,
        "until": None,
    }
    status, started = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {})

    assert (status, started["status"]) == (202, "RUNNING")
    assert started["budget_exceeded"]["budget"] == 1
    drained = control_plane.ctx.store.get_worker(worker.id)
    # Nothing runs on it, so its workflow may already have stopped it by the time this reads.
    assert drained.status in {WorkerStatus.DRAINING, WorkerStatus.STOPPING, WorkerStatus.STOPPED}
    assert drained.drain is not None
    assert drained.drain.generation == started["generation"]


def test_given_room_in_the_budgets_or_no_pool_then_the_drain_answer_names_none(control_plane, ec2_worker):
    pooled = ec2_worker(pool="labs")
    loose = ec2_worker()
    control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 1}]}})

    assert control_plane.api("POST", f"/api/v1/workers/{pooled.id}/drain", {})[1]["budget_exceeded"] is None
    assert control_plane.api("POST", f"/api/v1/workers/{loose.id}/drain", {})[1]["budget_exceeded"] is None


def test_given_a_pool_drain_that_drains_its_workers_then_its_answer_names_the_budget(
    control_plane, ec2_worker
):
    ec2_worker(pool="labs")
    ec2_worker(pool="labs")
    control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 1}]}})

    status, pool = control_plane.api("POST", "/api/v1/pools/labs/drain", {"then": "stop"})

    assert (status, pool["status"]) == (202, "draining")
    assert pool["budget_exceeded"]["budget"] == 0
    assert pool["budget_exceeded"]["in_use"] == 2
    # Workers with no instances drain at once: the pool drain may have ended before the cancel.
    control_plane.api("POST", "/api/v1/pools/labs/cancel-drain", {})
    if control_plane.api("GET", "/api/v1/pools/labs")[1]["status"] == "inactive":
        assert control_plane.api("PUT", "/api/v1/pools/labs", {"status": "active"})[0] == 200
    status, quiet = control_plane.api("POST", "/api/v1/pools/labs/drain", {"then": "none"})
    assert status == 202, quiet
    assert quiet["budget_exceeded"] is None
