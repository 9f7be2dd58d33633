"""A rollout's audit trail through the API: every status change, newest first, paged, and 404 for an
unknown rollout."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_given_a_rollout_paused_and_cancelled_when_its_events_are_read_then_newest_first(
    control_plane, running_worker
):
    for _ in range(2):
        running_worker(template="lab-small", pool="labs")
    status, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs", "reason": "AMI"}
    )
    assert status == 202, started
    rollout = started["id"]
    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout}/pause", {"reason": "look"})[0] == 200
    assert control_plane.api("POST", f"/api/v1/rollouts/{rollout}/cancel")[0] == 200

    status, page = control_plane.api("GET", f"/api/v1/rollouts/{rollout}/events")

    assert status == 200, page
    assert [(e["action"], e["from_status"], e["to_status"]) for e in page["items"]] == [
        ("RolloutCancelled", "PAUSED", "CANCELLED"),
        ("RolloutPaused", "RUNNING", "PAUSED"),
        ("RolloutStarted", None, "RUNNING"),
    ]
    assert page["items"][1]["reason"] == "look"
    assert page["items"][2]["details"]["total"] == 2
    assert page["next_token"] is None

    status, first = control_plane.api("GET", f"/api/v1/rollouts/{rollout}/events", query={"limit": "2"})
    assert (status, len(first["items"])) == (200, 2)
    status, rest = control_plane.api(
        "GET", f"/api/v1/rollouts/{rollout}/events", query={"limit": "2", "next_token": first["next_token"]}
    )
    assert [e["action"] for e in rest["items"]] == ["RolloutStarted"]


def test_given_an_unknown_rollout_then_404_not_an_empty_trail(control_plane):
    status, body = control_plane.api("GET", "/api/v1/rollouts/ro-nobody/events")

    assert status == 404, body
    assert "ro-nobody" in body["message"]
