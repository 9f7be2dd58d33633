"""The admin API contract: status codes, error bodies naming fields, idempotency, OpenAPI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper_local.controlplane import TOOLING_CALLER, call_api

pytestmark = pytest.mark.integration


def test_given_a_body_with_bad_fields_then_422_names_each_field(control_plane):
    status, body = control_plane.api(
        "PUT",
        "/api/v1/templates/lab",
        {"instance_type": "m5.large", "capacity": -1, "ami_name_filter": "lab-*", "bogus": 1},
    )
    assert status == 422
    fields = {d["field"] for d in body["details"]}
    assert {"body.capacity", "body.bogus"} <= fields
    assert body["error"] == "VALIDATION_FAILED"


def test_given_a_template_of_an_instance_type_the_stage_may_not_launch_then_422_names_it(control_plane):
    status, body = control_plane.api(
        "PUT",
        "/api/v1/templates/gpu",
        {"instance_type": "p5.48xlarge", "ami_name_filter": "gpu-*", "capacity": 1},
    )
    assert (status, body["error"]) == (422, "INVALID_INPUT")
    (detail,) = body["details"]
    assert detail["field"] == "instance_type"
    assert "'p5.48xlarge' is not an instance type this stage may launch" in detail["reason"]
    assert control_plane.api("GET", "/api/v1/templates/gpu")[0] == 404
    allowed = {"instance_type": "c5.xlarge", "ami_name_filter": "gpu-*", "capacity": 1}
    assert control_plane.api("PUT", "/api/v1/templates/gpu", allowed)[0] == 201


def test_given_malformed_json_then_400(control_plane):
    status, body = control_plane.api("POST", "/api/v1/workers", raw="{not json")
    assert status == 400
    assert body["error"] == "MALFORMED_JSON"


def test_given_unknown_things_then_404(control_plane):
    assert control_plane.api("GET", "/api/v1/workers/w-none")[0] == 404
    assert control_plane.api("GET", "/api/v1/templates/none")[0] == 404
    assert control_plane.api("GET", "/api/v1/instances/i-none")[0] == 404
    status, body = control_plane.api("GET", "/api/v1/nowhere")
    assert (status, body["error"]) == (404, "NOT_FOUND")


def test_given_bad_query_values_then_422_names_the_parameter(control_plane):
    status, body = control_plane.api("GET", "/api/v1/workers", query={"status": "SLEEPING", "limit": "0"})
    assert status == 422
    assert {"query.status", "query.limit"} <= {d["field"] for d in body["details"]}
    status, body = control_plane.api("GET", "/api/v1/workers", query={"next_token": "garbage!"})
    assert status == 422
    assert body["details"] == [{"field": "next_token", "reason": "is not a token this API issued"}]


def test_given_a_template_when_workers_are_created_and_listed_then_pages_follow(control_plane):
    status, template = control_plane.api(
        "PUT",
        "/api/v1/templates/lab",
        {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 3},
    )
    assert (status, template["drain_timeout_hours"]) == (201, 4.0)
    assert (
        control_plane.api(
            "PUT",
            "/api/v1/templates/lab",
            {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 5},
        )[0]
        == 200
    )
    assert control_plane.api("PUT", "/api/v1/pools/labs", {"description": "lab sessions"})[0] == 201
    ids = []
    for _ in range(3):
        status, worker = control_plane.api("POST", "/api/v1/workers", {"template": "lab", "pool": "labs"})
        assert (status, worker["status"], worker["capacity"]) == (201, "PENDING", 5)
        ids.append(worker["id"])
    status, page = control_plane.api("GET", "/api/v1/workers", query={"status": "PENDING", "limit": "2"})
    assert status == 200
    assert len(page["items"]) == 2
    _, rest = control_plane.api(
        "GET", "/api/v1/workers", query={"status": "PENDING", "next_token": page["next_token"]}
    )
    assert sorted(w["id"] for w in page["items"] + rest["items"]) == sorted(ids)
    status, body = control_plane.api("POST", "/api/v1/workers", {"template": "none"})
    assert (status, body["details"]) == (422, [{"field": "template", "reason": "unknown template 'none'"}])


def test_given_a_desired_status_then_it_is_recorded_and_validated(control_plane, running_worker):
    worker = running_worker()
    status, body = control_plane.api(
        "PUT", f"/api/v1/workers/{worker.id}/desired-status", {"desired_status": "STOPPED"}
    )
    assert (status, body["desired_status"]) == (200, "STOPPED")
    status, body = control_plane.api(
        "PUT", f"/api/v1/workers/{worker.id}/desired-status", {"desired_status": "DRAINING"}
    )
    assert status == 422
    assert body["details"][0]["field"] == "body.desired_status"


def test_given_an_orphan_when_marked_terminated_then_its_instances_are_lost(control_plane, running_worker):
    worker = running_worker()
    _, instance = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})
    status, body = control_plane.api(
        "POST",
        f"/api/internal/workers/{worker.id}/status",
        {"status": "TERMINATED", "terminated_reason": "EC2 instance not found during discovery"},
        caller=TOOLING_CALLER,
    )
    assert status == 200
    assert (body["status"], body["terminated_by"]) == ("TERMINATED", TOOLING_CALLER)
    assert body["active_instances"] == 0
    _, ended = control_plane.api("GET", f"/api/v1/instances/{instance['id']}")
    assert (ended["state"], ended["reason"]) == ("TERMINATED", "worker_lost")
    status, body = control_plane.api(
        "POST", f"/api/internal/workers/{worker.id}/status", {"status": "PENDING"}, caller=TOOLING_CALLER
    )
    assert status == 409
    assert body["details"]["current_status"] == "TERMINATED"


def test_given_an_idempotency_key_then_a_repeat_returns_the_first_response(control_plane, running_worker):
    worker = running_worker(capacity=5)
    headers = {"Idempotency-Key": "place-42"}
    first_status, first = control_plane.api(
        "POST", "/api/v1/instances", {"worker_id": worker.id}, headers=headers
    )
    again_status, again = control_plane.api(
        "POST", "/api/v1/instances", {"worker_id": worker.id}, headers=headers
    )
    assert (first_status, again_status) == (201, 201)
    assert again == first
    assert control_plane.ctx.store.get_worker(worker.id).active_instances == 1
    _, other = control_plane.api(
        "POST", "/api/v1/instances", {"worker_id": worker.id}, headers={"Idempotency-Key": "place-43"}
    )
    assert other["id"] != first["id"]


def test_given_instances_then_they_list_by_worker_and_state(control_plane, running_worker):
    worker = running_worker()
    _, first = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})
    control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})
    status, done = control_plane.api("POST", f"/api/v1/instances/{first['id']}/state", {"state": "COMPLETED"})
    assert (status, done["state"]) == (200, "COMPLETED")
    status, body = control_plane.api("POST", f"/api/v1/instances/{first['id']}/state", {"state": "RUNNING"})
    assert (status, body["error"]) == (409, "ILLEGAL_TRANSITION")
    _, page = control_plane.api("GET", "/api/v1/instances", query={"worker_id": worker.id})
    assert len(page["items"]) == 2
    _, page = control_plane.api("GET", "/api/v1/instances", query={"state": InstanceState.COMPLETED.value})
    assert [i["id"] for i in page["items"]] == [first["id"]]


def test_given_a_fleet_then_stats_count_workers_and_instances(control_plane, running_worker, store):
    worker = running_worker()
    other = running_worker()
    store.transition_worker(
        store.get_worker(other.id),
        WorkerStatus.STOPPING,
        cause=Cause.CONTROL,
        actor="t",
    )
    control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})
    status, body = control_plane.api("GET", "/api/v1/stats")
    assert status == 200
    assert body["workers_by_status"] == {"RUNNING": 1, "STOPPING": 1}
    assert body["active_instances"] == 1


def test_given_the_api_then_openapi_describes_every_route(control_plane):
    status, schema = control_plane.api("GET", "/openapi.json")
    assert status == 200
    paths = schema["paths"]
    for path in (
        "/api/v1/workers",
        "/api/v1/workers/{worker_id}/drain",
        "/api/v1/workers/{worker_id}/cancel-drain",
        "/api/v1/instances",
        "/api/v1/pools/{name}/drain",
        "/api/internal/workers/{worker_id}/status",
        "/api/v1/stats",
    ):
        assert path in paths, path
    assert "DrainRequest" in schema["components"]["schemas"]


def test_given_a_form_body_then_415_says_to_send_json(control_plane):
    status, body = control_plane.api(
        "POST",
        "/api/v1/workers",
        raw="template=lab",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 415
    assert "application/json" in body["message"]


def test_given_the_sample_drain_event_then_the_api_handler_answers_it(control_plane, ec2_worker):
    # A real machine: the drain it starts may reach its stop step before the test's teardown stops it.
    worker = ec2_worker()
    event = json.loads((Path(__file__).parents[2] / "events" / "api_drain_worker.json").read_text())
    event["path"] = event["path"].replace("w-0123456789abcdef", worker.id)
    response = call_api(event)
    assert response["statusCode"] == 202
    body = json.loads(response["body"])
    assert (body["requested_by"], body["timeout_seconds"]) == (
        "arn:aws:iam::123456789012:user/ops-alice",
        1800,
    )


def test_given_an_internal_status_call_then_audit_and_terminated_by_name_the_signing_principal(
    control_plane, running_worker
):
    worker = running_worker()
    status, body = control_plane.api(
        "POST",
        f"/api/internal/workers/{worker.id}/status",
        {"status": "TERMINATED", "terminated_by": "someone-else", "terminated_reason": "gone"},
        caller=TOOLING_CALLER,
    )
    # A body cannot name the actor: the field no longer exists, and sending it is refused.
    assert (status, body["details"][0]["field"]) == (422, "body.terminated_by")
    status, body = control_plane.api(
        "POST",
        f"/api/internal/workers/{worker.id}/status",
        {"status": "TERMINATED", "terminated_reason": "gone"},
        caller=TOOLING_CALLER,
    )
    assert (status, body["terminated_by"]) == (200, TOOLING_CALLER)
    last = control_plane.ctx.store.audit_trail("worker", worker.id)[-1]
    assert last.actor == TOOLING_CALLER
