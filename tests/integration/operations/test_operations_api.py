"""POST/GET /api/v1/workers/{id}/operations: 202 and the listing, one in flight (409), 422 naming fields."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest

from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.models import Worker
from fleetkeeper.domain.operations import OperationStatus
from fleetkeeper.services import operations
from fleetkeeper.services.context import Context
from fleetkeeper.store.codec import serialize
from tests.integration.operations.conftest import api, start_drain

pytestmark = pytest.mark.integration

LICENSE = {"name": "register-license", "parameters": {"licenseServer": "licenses.example.com"}}


def path(worker: Worker) -> str:
    return f"/api/v1/workers/{worker.id}/operations"


def test_given_a_running_worker_when_an_operation_is_requested_then_202_pending_with_defaults_filled_in(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()

    status, body = api("POST", path(worker), LICENSE)

    assert status == 202
    assert (body["status"], body["name"], body["attempts"], body["worker_id"]) == (
        "PENDING",
        "register-license",
        0,
        worker.id,
    )
    assert body["parameters"] == {
        "licenseServer": "licenses.example.com",
        "licenseParameter": "/fleetkeeper/test/license",
    }
    status, listed = api("GET", path(worker))
    assert status == 200
    assert [o["id"] for o in listed["items"]] == [body["id"]]


def test_given_an_operation_in_flight_when_another_is_requested_then_409_names_the_one_in_flight(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    _, first = api("POST", path(worker), LICENSE)

    status, body = api("POST", path(worker), {"name": "collect-system-info"})

    assert status == 409
    assert body["error"] == "OPERATION_IN_FLIGHT"
    assert body["details"]["operation_id"] == first["id"]


def test_given_concurrent_requests_on_one_worker_then_exactly_one_is_accepted(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()

    def ask(_: int) -> str:
        try:
            operations.request(ctx, worker.id, "collect-system-info", {}, actor="op")
        except Conflict as refused:
            return refused.code
        return "ACCEPTED"

    with ThreadPoolExecutor(max_workers=6) as pool:
        answers = sorted(pool.map(ask, range(6)))

    assert answers == ["ACCEPTED"] + ["OPERATION_IN_FLIGHT"] * 5
    assert len(ctx.store.list_operations(worker.id).items) == 1


def test_given_finished_operations_when_listed_then_newest_first_in_pages(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    ids = []
    for _ in range(3):
        op = operations.request(ctx, worker.id, "collect-system-info", {}, actor="op")
        ctx.store.save_operation(op, {"status": OperationStatus.CANCELLED}, actor="test")
        ids.append(op.id)

    status, first = api("GET", path(worker), query={"limit": "2"})
    assert status == 200
    status, second = api("GET", path(worker), query={"limit": "2", "next_token": first["next_token"]})

    assert status == 200
    assert [o["id"] for o in first["items"] + second["items"]] == ids[::-1]
    assert second["next_token"] is None
    assert {o["status"] for o in first["items"]} == {"CANCELLED"}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "reboot-everything"}, "name"),
        (
            {"name": "register-license", "parameters": {"licenseServer": "x", "bogus": "1"}},
            "parameters.bogus",
        ),
        ({"name": "register-license"}, "parameters.licenseServer"),
        (
            {"name": "register-license", "parameters": {"licenseServer": "no spaces!"}},
            "parameters.licenseServer",
        ),
        ({"name": "register-license", "parameters": {"licenseServer": 7}}, "body.parameters.licenseServer"),
        ({"name": "Bad Name"}, "body.name"),
    ],
)
def test_given_a_name_or_parameter_the_catalogue_refuses_then_422_names_the_field(
    ctx: Context, machine_worker: Callable[..., Worker], body: dict[str, object], field: str
) -> None:
    worker = machine_worker()

    status, answer = api("POST", path(worker), body)

    assert status == 422
    assert field in {d["field"] for d in answer["details"]}
    assert ctx.store.list_operations(worker.id).items == []


def test_given_a_draining_worker_then_only_cleanup_operations_are_accepted(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    start_drain(ctx, worker)

    refused, body = api("POST", path(worker), LICENSE)
    accepted, cleanup = api("POST", path(worker), {"name": "deregister-license"})

    assert (refused, body["error"]) == (409, "CONFLICT")
    assert "RUNNING" in body["message"]
    assert (accepted, cleanup["status"]) == (202, "PENDING")


def test_given_an_unknown_worker_then_404(ctx: Context) -> None:
    assert api("POST", "/api/v1/workers/w-none/operations", LICENSE)[0] == 404
    assert api("GET", "/api/v1/workers/w-none/operations")[0] == 404


def test_given_a_template_naming_a_before_stop_operation_then_it_must_be_a_cleanup_one(
    ctx: Context,
) -> None:
    template = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 2}

    refused, body = api("PUT", "/api/v1/templates/lab", {**template, "before_stop": ["register-license"]})
    accepted, stored = api(
        "PUT", "/api/v1/templates/lab", {**template, "before_stop": ["deregister-license"]}
    )

    assert (refused, body["details"][0]["field"]) == (422, "before_stop.0")
    assert (accepted, stored["before_stop"]) == (201, ["deregister-license"])


def test_given_a_lock_left_by_an_unreadable_operation_then_the_next_request_releases_it(
    ctx: Context, machine_worker: Callable[..., Worker], table_name: str
) -> None:
    worker = machine_worker()
    ddb = boto3.client("dynamodb")
    ddb.put_item(
        TableName=table_name,
        Item=serialize({"PK": f"WORKER#{worker.id}", "SK": "OPERATION#op-0-bad", "status": "SLEEPING"}),
    )
    ddb.update_item(
        TableName=table_name,
        Key=serialize({"PK": f"WORKER#{worker.id}", "SK": "WORKER"}),
        UpdateExpression="SET operation_in_flight = :id",
        ExpressionAttributeValues={":id": {"S": "op-0-bad"}},
    )

    status, body = api("POST", path(worker), {"name": "collect-system-info"})

    assert (status, body["status"]) == (202, "PENDING")
    assert ctx.store.operation_lock(worker.id) == body["id"]
    released = [e for e in ctx.store.audit_trail("worker", worker.id) if e.action == "OperationLockReleased"]
    assert [e.reason for e in released] == ["operation op-0-bad is unreadable"]
