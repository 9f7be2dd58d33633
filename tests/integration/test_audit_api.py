"""The audit trail over the API: newest first, paginated, the caller recorded, retained for a set time."""

from __future__ import annotations

import time
from typing import Any

import boto3
import pytest

from fleetkeeper.store import keys
from fleetkeeper.store.schema import TTL_ATTRIBUTE
from fleetkeeper_local.controlplane import refresh_process_caches

pytestmark = pytest.mark.integration

OPERATOR = "arn:aws:iam::123456789012:user/alice"
TEMPLATE = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 2}


def _worker(control_plane: Any) -> str:
    assert control_plane.api("PUT", "/api/v1/templates/lab", TEMPLATE)[0] == 201
    assert control_plane.api("PUT", "/api/v1/pools/labs", {"description": "labs"})[0] == 201
    status, worker = control_plane.api(
        "POST", "/api/v1/workers", {"template": "lab", "pool": "labs"}, caller=OPERATOR
    )
    assert status == 201
    return str(worker["id"])


def test_given_a_worker_with_history_when_its_events_are_read_then_newest_first_with_who_what_from_to(
    control_plane,
):
    worker_id = _worker(control_plane)
    status, _ = control_plane.api(
        "PUT", f"/api/v1/workers/{worker_id}/desired-status", {"desired_status": "STOPPED"}, caller=OPERATOR
    )
    assert status == 200

    status, page = control_plane.api("GET", f"/api/v1/workers/{worker_id}/events")

    assert status == 200
    events = page["items"]
    assert len(events) == 2
    assert events[0]["at"] >= events[1]["at"]
    assert {e["actor"] for e in events} == {OPERATOR}
    created = events[-1]
    assert (created["from_status"], created["to_status"]) == (None, "PENDING")
    assert set(created) >= {"at", "actor", "action", "from_status", "to_status", "reason", "details"}


def test_given_more_events_than_a_page_when_pages_are_followed_then_every_event_comes_once(control_plane):
    worker_id = _worker(control_plane)
    for desired in ("STOPPED", "RUNNING", "STOPPED"):
        body = {"desired_status": desired}
        assert control_plane.api("PUT", f"/api/v1/workers/{worker_id}/desired-status", body)[0] == 200

    status, first = control_plane.api("GET", f"/api/v1/workers/{worker_id}/events", query={"limit": "3"})
    assert (status, len(first["items"])) == (200, 3)
    status, second = control_plane.api(
        "GET", f"/api/v1/workers/{worker_id}/events", query={"limit": "3", "next_token": first["next_token"]}
    )
    assert status == 200
    every = first["items"] + second["items"]
    assert len(every) == 4
    assert [e["at"] for e in every] == sorted((e["at"] for e in every), reverse=True)


def test_given_a_pool_when_its_events_are_read_then_its_creation_is_there(control_plane):
    _worker(control_plane)
    status, page = control_plane.api("GET", "/api/v1/pools/labs/events")
    assert status == 200
    assert page["items"][-1]["to_status"] == "active"


def test_given_an_unknown_worker_or_pool_then_404_not_an_empty_trail(control_plane):
    assert control_plane.api("GET", "/api/v1/workers/w-nobody/events")[0] == 404
    assert control_plane.api("GET", "/api/v1/pools/nowhere/events")[0] == 404


def test_given_a_token_of_another_trail_then_422_names_next_token(control_plane):
    worker_id = _worker(control_plane)
    control_plane.api("PUT", f"/api/v1/workers/{worker_id}/desired-status", {"desired_status": "STOPPED"})
    _, page = control_plane.api("GET", f"/api/v1/workers/{worker_id}/events", query={"limit": "1"})
    status, body = control_plane.api(
        "GET", "/api/v1/pools/labs/events", query={"next_token": page["next_token"]}
    )
    assert status == 422
    assert body["details"][0]["field"] == "next_token"


def test_given_a_retention_when_an_event_is_written_then_it_carries_the_ttl(control_plane, monkeypatch):
    monkeypatch.setenv("AUDIT_RETENTION_DAYS", "30")
    refresh_process_caches()
    worker_id = _worker(control_plane)

    items = boto3.client("dynamodb").query(
        TableName=control_plane.ctx.settings.table_name,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": keys.audit_partition("worker", worker_id)}},
    )["Items"]

    expires = int(items[0][TTL_ATTRIBUTE]["N"])
    assert abs(expires - (time.time() + 30 * 86400)) < 120


def test_given_no_retention_when_an_event_is_written_then_it_is_kept_forever(control_plane, monkeypatch):
    monkeypatch.setenv("AUDIT_RETENTION_DAYS", "0")
    refresh_process_caches()
    worker_id = _worker(control_plane)

    items = boto3.client("dynamodb").query(
        TableName=control_plane.ctx.settings.table_name,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": keys.audit_partition("worker", worker_id)}},
    )["Items"]

    assert items
    assert all(TTL_ATTRIBUTE not in item for item in items)


def test_given_the_contract_then_it_documents_both_trails_with_their_paging(control_plane):
    status, spec = control_plane.api("GET", "/openapi.json")
    assert status == 200
    for path in ("/api/v1/workers/{worker_id}/events", "/api/v1/pools/{name}/events"):
        parameters = {p["name"] for p in spec["paths"][path]["get"]["parameters"]}
        assert {"limit", "next_token"} <= parameters
    assert "AuditPage" in spec["components"]["schemas"]
