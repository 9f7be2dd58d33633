"""Regression tests: every client mistake found by fuzzing the API is a 4xx naming what is wrong."""

from __future__ import annotations

import base64
import functools
import json
from datetime import UTC, datetime
from typing import Any

import pytest
import requests

from fleetkeeper.api import idempotency
from fleetkeeper.api.app import contract
from fleetkeeper.api.body import MAX_BODY_BYTES
from fleetkeeper.domain.models import MAX_DRAIN_TIMEOUT_SECONDS
from fleetkeeper_local.controlplane import ApiServer, refresh_process_caches
from fleetkeeper_local.stack import free_port

pytestmark = pytest.mark.integration

LONG_ID = "w" * 3000
WRITE_ROUTES = (
    ("POST", "/api/v1/workers", {"template": "lab"}),
    ("PUT", "/api/v1/templates/lab", {"instance_type": "m5.large", "ami_name_filter": "x", "capacity": 1}),
    ("PUT", "/api/v1/pools/labs", {"description": "x"}),
    ("POST", "/api/v1/instances", {"template": "lab"}),
)
# No error answer grows with the request: a few kilobytes, whatever was sent.
MAX_ANSWER_BYTES = 16 * 1024


# Building the document costs a quarter of a CPU-second, and it is the same for every test of the process.
_contract = functools.cache(contract)


def _body_routes() -> list[tuple[str, str]]:
    """Every route that takes a body, with its path parameters filled in."""
    document = _contract()
    return [
        (
            method.upper(),
            path.replace("{worker_id}", "w-1").replace("{instance_id}", "i-1").replace("{name}", "lab"),
        )
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if isinstance(operation, dict) and "requestBody" in operation
    ]


def _template(control_plane: Any, capacity: int = 4) -> None:
    status, _ = control_plane.api(
        "PUT",
        "/api/v1/templates/lab",
        {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": capacity},
    )
    assert status in (200, 201)


def _token(payload: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(payload).encode()).decode()


def _untoken(token: str) -> dict[str, Any]:
    payload: dict[str, Any] = json.loads(base64.urlsafe_b64decode(token.encode()))
    return payload


# ---- page tokens ------------------------------------------------------------------------------------


def test_given_a_page_token_when_used_with_another_query_then_422_names_next_token(control_plane):
    _template(control_plane)
    for _ in range(2):
        control_plane.api("POST", "/api/v1/workers", {"template": "lab"})
    _, page = control_plane.api("GET", "/api/v1/workers", query={"status": "PENDING", "limit": "1"})
    token = page["next_token"]

    status, body = control_plane.api("GET", "/api/v1/workers", query={"next_token": token})
    assert status == 422
    assert body["details"][0]["field"] == "next_token"
    status, _ = control_plane.api("GET", "/api/v1/instances", query={"next_token": token})
    assert status == 422


def test_given_a_forged_page_token_then_422_not_500(control_plane):
    _template(control_plane)
    for _ in range(2):
        control_plane.api("POST", "/api/v1/workers", {"template": "lab"})
    _, page = control_plane.api("GET", "/api/v1/workers", query={"status": "PENDING", "limit": "1"})
    issued = _untoken(page["next_token"])
    key = issued["k"]
    forgeries = [
        _token({"PK": "x", "SK": "y"}),  # the old token shape: a bare start key
        _token({"k": {**key, "GSI1PK": "WORKER_STATUS#RUNNING"}, "q": issued["q"]}),  # another partition
        _token({"k": {**key, "SK": "S" * 1100}, "q": issued["q"]}),  # longer than a key may be
        _token({"k": {**key, "extra": "1"}, "q": issued["q"]}),  # not the index's key attributes
        _token({"k": {**key, "PK": 7}, "q": issued["q"]}),  # not a string key
        _token([1, 2]),
        "%%%",
    ]
    for forged in forgeries:
        status, body = control_plane.api(
            "GET", "/api/v1/workers", query={"status": "PENDING", "next_token": forged}
        )
        assert (status, body["details"][0]["field"]) == (422, "next_token"), forged


# ---- query parameters ------------------------------------------------------------------------------


def _filled(path: str) -> str:
    return path.replace("{worker_id}", "w-1").replace("{instance_id}", "i-1").replace("{rollout_id}", "ro-1")


def _query_parameters(kind: str | None = None) -> list[tuple[str, str, str]]:
    """(method, path, name) of every query parameter of the contract (only those of JSON type `kind` if
    given), path parameters filled in."""
    found = []
    for path, item in _contract()["paths"].items():
        for method, operation in item.items():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                schema = parameter["schema"]
                types = {s.get("type") for s in schema.get("anyOf", [schema])}
                if parameter["in"] == "query" and (kind is None or kind in types):
                    found.append((method.upper(), _filled(path.replace("{name}", "lab")), parameter["name"]))
    return found


@pytest.mark.parametrize("value", ["yes", "no", "1", "0", "on", "off", "True", "FALSE", "t", "y", ""])
def test_given_a_boolean_query_parameter_other_than_true_or_false_then_422_names_it(control_plane, value):
    # pydantic alone reads yes, on, 1 and their kin as true: the contract's boolean is `true` or `false`.
    flags = _query_parameters("boolean")
    assert flags, "the contract has no boolean query parameter"
    for method, path, name in flags:
        status, body = control_plane.api(method, path, query={name: value})
        expected = [{"field": f"query.{name}", "reason": "true or false"}]
        assert (status, body["details"]) == (422, expected), (method, path, name)


def test_given_true_or_false_in_a_boolean_query_parameter_then_it_is_accepted(control_plane):
    for method, path, name in _query_parameters("boolean"):
        for accepted in ("true", "false"):
            assert control_plane.api(method, path, query={name: accepted})[0] != 422, (path, name, accepted)


@pytest.mark.parametrize("value", ["5.0", " 5", "5 ", "+5", "5_0", "\u0665", "0x5", "5e0", ""])
def test_given_an_integer_query_parameter_not_in_digits_then_422_names_it(control_plane, value):
    # `limit=5_0` used to list 50 workers: a query integer is its decimal digits, as the contract writes it.
    numbers = _query_parameters("integer")
    assert len(numbers) >= 6
    for method, path, name in numbers:
        status, body = control_plane.api(method, path, query={name: value})
        expected = [{"field": f"query.{name}", "reason": "a whole number written with the digits 0-9"}]
        assert (status, body["details"]) == (422, expected), (method, path, name)


def test_given_digits_in_an_integer_query_parameter_then_they_are_accepted(control_plane):
    for method, path, name in _query_parameters("integer"):
        assert control_plane.api(method, path, query={name: "5"})[0] != 422, (path, name)


def test_given_any_query_parameter_twice_then_422_names_it(control_plane):
    # `?drifted=true&drifted=false` used to answer with one of the two, silently.
    parameters = _query_parameters()
    assert len(parameters) > 10
    for method, path, name in parameters:
        status, body = control_plane.api(method, path, query=[(name, "x"), (name, "x")])
        assert (status, body["details"]) == (
            422,
            [{"field": f"query.{name}", "reason": "given 2 times; it takes one value"}],
        ), (method, path, name)


def test_given_a_repeated_parameter_over_http_then_422_as_api_gateway_would_answer(control_plane):
    # The local adapter hands every value over, as API Gateway does in multiValueQueryStringParameters.
    server = ApiServer(port=free_port()).start()
    try:
        answer = requests.get(f"{server.url}/api/v1/workers?drifted=true&drifted=false", timeout=30)
    finally:
        server.stop()
    assert (answer.status_code, answer.json()["details"][0]["field"]) == (422, "query.drifted")


# ---- content types, ids, nesting ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content_type", "raw"),
    [
        ("text/plain", '{"template": "lab"}'),
        ("application/xml", "<worker><template>lab</template></worker>"),
        ("application/x-www-form-urlencoded", "template=lab"),
        ("multipart/form-data", '{"template": "lab"}'),  # no boundary: once a 500 from the parser
        (
            "multipart/form-data; boundary=XyZ",
            '--XyZ\r\nContent-Disposition: form-data; name="template"\r\n\r\nlab\r\n--XyZ--\r\n',
        ),
    ],
)
def test_given_a_non_json_body_on_a_write_route_then_415_and_nothing_is_created(
    control_plane, content_type, raw
):
    _template(control_plane)
    for method, path, _ in WRITE_ROUTES:
        status, body = control_plane.api(method, path, raw=raw, headers={"Content-Type": content_type})
        assert (status, body["error"]) == (415, "UNSUPPORTED_MEDIA_TYPE"), (method, path)
    assert control_plane.api("GET", "/api/v1/workers")[1]["items"] == []


def test_given_json_with_a_charset_then_it_is_accepted(control_plane):
    _template(control_plane)
    status, _ = control_plane.api(
        "POST",
        "/api/v1/workers",
        raw='{"template": "lab"}',
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert status == 201


@pytest.mark.parametrize(
    ("method", "path", "parameter"),
    [
        ("GET", f"/api/v1/workers/{LONG_ID}", "path.worker_id"),
        ("GET", f"/api/v1/workers/{LONG_ID}/drain", "path.worker_id"),
        ("POST", f"/api/v1/workers/{LONG_ID}/cancel-drain", "path.worker_id"),
        ("GET", f"/api/v1/instances/{LONG_ID}", "path.instance_id"),
        ("GET", f"/api/v1/templates/{LONG_ID}", "path.name"),
        ("GET", f"/api/v1/pools/{LONG_ID}", "path.name"),
    ],
)
def test_given_an_id_longer_than_a_key_then_422_names_the_parameter(control_plane, method, path, parameter):
    status, body = control_plane.api(method, path)
    assert status == 422
    assert [d["field"] for d in body["details"]] == [parameter]


@pytest.mark.parametrize("depth", [100, 1000, 100_000])
def test_given_json_nested_very_deep_then_400(control_plane, depth):
    raw = "[" * depth + "]" * depth
    status, body = control_plane.api("POST", "/api/v1/workers", raw=raw)
    assert status in (400, 422)
    if depth >= 1000:
        assert (status, body["error"]) == (400, "MALFORMED_JSON")


# ---- strict models --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("drain", "field"),
    [
        ({"timeout_seconds": True}, "body.timeout_seconds"),
        ({"timeout_seconds": "60"}, "body.timeout_seconds"),
        ({"timeout_seconds": 60.5}, "body.timeout_seconds"),
        ({"timeout_seconds": 30}, "body.timeout_seconds"),
        ({"timeout_seconds": 0}, "body.timeout_seconds"),
        ({"timeout_seconds": -5}, "body.timeout_seconds"),
        ({"timeout_seconds": 1_000_000_000}, "body.timeout_seconds"),
        ({"dry_run": 0}, "body.dry_run"),
        ({"dry_run": "true"}, "body.dry_run"),
        ({"reschedule": "yes"}, "body.reschedule"),
    ],
)
def test_given_a_drain_value_that_is_not_what_it_says_then_422_names_the_field(
    control_plane, running_worker, drain, field
):
    worker = running_worker()
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", drain)
    assert status == 422
    assert [d["field"] for d in body["details"]] == [field]
    if field == "body.timeout_seconds" and not isinstance(drain[field.split(".")[1]], bool | str):
        assert f"from 60 to {MAX_DRAIN_TIMEOUT_SECONDS}" in body["details"][0]["reason"]
    assert control_plane.ctx.store.get_worker(worker.id).drain is None


def test_given_a_pool_drain_timeout_below_a_minute_then_422(control_plane):
    control_plane.api("PUT", "/api/v1/pools/labs", {})
    status, body = control_plane.api("POST", "/api/v1/pools/labs/drain", {"timeout_seconds": -1})
    assert (status, body["details"][0]["field"]) == (422, "body.timeout_seconds")


def test_given_an_empty_drain_body_then_the_defaults_apply(control_plane, ec2_worker):
    # A real machine: the drain may reach its stop before the test's teardown ends it.
    worker = ec2_worker(drain_timeout_hours=2)
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", raw="")
    assert (status, body["timeout_seconds"]) == (202, 7200)
    control_plane.api("PUT", "/api/v1/pools/labs", {})
    status, body = control_plane.api("POST", "/api/v1/pools/labs/drain", {})
    assert (status, body["drain_timeout_seconds"]) == (202, 300)


@pytest.mark.parametrize(
    ("template", "field"),
    [
        ({"capacity": "3"}, "body.capacity"),
        ({"capacity": True}, "body.capacity"),
        ({"drain_timeout_hours": True}, "body.drain_timeout_hours"),
        ({"drain_timeout_hours": 0.001}, "body.drain_timeout_hours"),
    ],
)
def test_given_a_template_value_that_is_not_what_it_says_then_422(control_plane, template, field):
    spec = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 2, **template}
    status, body = control_plane.api("PUT", "/api/v1/templates/lab", spec)
    assert status == 422
    assert [d["field"] for d in body["details"]] == [field]


@pytest.mark.parametrize(
    "slot",
    [
        {"timeslot_start": 0},
        {"timeslot_start": 1_700_000_000},
        {"timeslot_start": "2026-03-01T09:00:00"},
        {"timeslot_end": "2026-03-01T09:00:00"},
        # Text that pydantic alone reads as a time, and RFC 3339 (the contract's date-time) does not.
        {"timeslot_start": "1700000000"},
        {"timeslot_start": "2099-03-01 09:00:00Z"},
        {"timeslot_end": "2099-03-01T09:00:00+0100"},
        # Valid RFC 3339 whose UTC time is outside the years 1 to 9999.
        {"timeslot_start": "9999-12-31T23:59:59-01:00"},
        {"timeslot_end": "0001-01-01T00:00:00+01:00"},
    ],
)
def test_given_a_timestamp_that_is_a_number_or_naive_then_422_names_it(control_plane, running_worker, slot):
    worker = running_worker()
    status, body = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id, **slot})
    assert status == 422
    assert [d["field"] for d in body["details"]] == [f"body.{next(iter(slot))}"]


def test_given_an_aware_timestamp_then_the_instance_is_placed(control_plane, running_worker):
    worker = running_worker()
    status, body = control_plane.api(
        "POST",
        "/api/v1/instances",
        {"worker_id": worker.id, "timeslot_start": "2026-03-01T09:00:00+01:00"},
    )
    assert status == 201
    placed = datetime.fromisoformat(body["timeslot_start"])
    assert placed == datetime(2026, 3, 1, 8, tzinfo=UTC)


# ---- capacity -------------------------------------------------------------------------------------------


def test_given_no_free_slot_then_placement_is_409_no_capacity_not_a_5xx(control_plane, running_worker):
    worker = running_worker(capacity=1)
    assert control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})[0] == 201
    status, body = control_plane.api("POST", "/api/v1/instances", {"template": "lab"})
    assert (status, body["error"]) == (409, "NO_CAPACITY")


# ---- idempotency ----------------------------------------------------------------------------------------


def test_given_one_key_and_the_same_json_in_another_order_then_the_first_response_is_replayed(
    control_plane,
):
    _template(control_plane)
    control_plane.api("PUT", "/api/v1/pools/labs", {})
    headers = {"Idempotency-Key": "create-1"}
    first = control_plane.api(
        "POST", "/api/v1/workers", raw='{"template": "lab", "pool": "labs"}', headers=headers
    )
    again = control_plane.api(
        "POST", "/api/v1/workers", raw='{ "pool":"labs","template":"lab" }', headers=headers
    )
    assert first[0] == 201
    assert again == first
    assert len(control_plane.api("GET", "/api/v1/workers")[1]["items"]) == 1


def test_given_one_key_and_another_body_then_422_idempotency_key_reused_and_nothing_runs(control_plane):
    _template(control_plane)
    control_plane.api("PUT", "/api/v1/pools/labs", {})
    headers = {"Idempotency-Key": "create-2"}
    assert control_plane.api("POST", "/api/v1/workers", {"template": "lab"}, headers=headers)[0] == 201
    status, body = control_plane.api(
        "POST", "/api/v1/workers", {"template": "lab", "pool": "labs"}, headers=headers
    )
    assert (status, body["error"]) == (422, "IDEMPOTENCY_KEY_REUSED")
    assert len(control_plane.api("GET", "/api/v1/workers")[1]["items"]) == 1


def test_given_many_keyed_requests_then_the_idempotent_wrapper_is_built_once(control_plane):
    _template(control_plane)
    idempotency._replayer.cache_clear()
    for n in range(3):
        control_plane.api(
            "POST", "/api/v1/workers", {"template": "lab"}, headers={"Idempotency-Key": f"k{n}"}
        )
    assert idempotency._replayer.cache_info().misses == 1


# ---- found by schemathesis ------------------------------------------------------------------------


def test_given_a_method_a_route_does_not_answer_then_405_names_the_allowed_ones(control_plane):
    status, body = control_plane.api("TRACE", "/api/v1/templates")
    assert (status, body["error"]) == (405, "METHOD_NOT_ALLOWED")
    assert body["details"] == {"allowed": "GET"}
    assert control_plane.api("DELETE", "/api/v1/workers/w-1")[0] == 405
    assert control_plane.api("TRACE", "/api/v1/nowhere")[0] == 404


def test_given_a_whole_number_written_as_a_float_then_422_and_nothing_starts(control_plane, running_worker):
    # 1800.0 used to be read as 1800 here and refused in rollouts: one rule now, a fraction is no integer.
    worker = running_worker()
    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/drain", {"timeout_seconds": 1800.0}
    )
    assert (status, [d["field"] for d in body["details"]]) == (422, ["body.timeout_seconds"])
    assert control_plane.ctx.store.get_worker(worker.id).drain is None
    spec = {"instance_type": "m5.large", "ami_name_filter": "x", "capacity": 3.0}
    status, body = control_plane.api("PUT", "/api/v1/templates/other", spec)
    assert (status, [d["field"] for d in body["details"]]) == (422, ["body.capacity"])
    assert control_plane.api("GET", "/api/v1/templates/other")[0] == 404


# ---- paths ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/pools/\n", "/api/v1/workers\n", "/api/v1/templates/lab\n"])
def test_given_a_path_ending_in_a_newline_then_it_matches_no_route(control_plane, path):
    # A regex `$` also matches before a final newline: "/api/v1/pools/%0A" once answered with the pool list.
    status, body = control_plane.api("GET", path)
    assert status == 404, body
    assert body["error"] == "NOT_FOUND"


# ---- the body: exactly one JSON object, or none ----------------------------------------------------


@pytest.mark.parametrize("content_type", ["APPLICATION/JSON", "Application/Json; Charset=UTF-8"])
def test_given_json_spelt_in_capitals_then_it_is_read_as_json(control_plane, running_worker, content_type):
    # Media types are case-insensitive: this once answered 500.
    worker = running_worker()
    status, body = control_plane.api(
        "POST",
        f"/api/v1/workers/{worker.id}/drain",
        raw='{"dry_run": true}',
        headers={"Content-Type": content_type},
    )
    assert (status, body["status"]) == (200, "NOT_RUN")
    assert control_plane.ctx.store.get_worker(worker.id).drain is None


@pytest.mark.parametrize("content_type", ["text/plain", "TEXT/PLAIN", "application/xml"])
@pytest.mark.parametrize("raw", [None, ""])
def test_given_a_non_json_media_type_without_a_body_then_415_and_nothing_changes(
    control_plane, running_worker, content_type, raw
):
    worker = running_worker()
    for route in ("drain", "cancel-drain"):
        status, body = control_plane.api(
            "POST", f"/api/v1/workers/{worker.id}/{route}", raw=raw, headers={"Content-Type": content_type}
        )
        assert (status, body["error"]) == (415, "UNSUPPORTED_MEDIA_TYPE"), route
        assert content_type in body["message"]
    assert control_plane.ctx.store.get_worker(worker.id).drain is None


@pytest.mark.parametrize(
    ("number", "named"),
    [
        ("1" * 4301, "4301 digits"),  # past Python's limit on the digits of an int read from text
        ("-" + "9" * 10_000, "10001 digits"),
        ("1e999", "1e999"),  # a float that parses as infinity
        ("NaN", "NaN"),
        ("Infinity", "Infinity"),
        ("-Infinity", "-Infinity"),
    ],
)
def test_given_a_number_the_api_cannot_read_then_400_names_it_and_no_drain_starts(
    control_plane, running_worker, number, named
):
    worker = running_worker()
    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/drain", raw=f'{{"timeout_seconds": {number}}}'
    )
    assert (status, body["error"]) == (400, "MALFORMED_JSON")
    assert named in body["message"]
    assert control_plane.ctx.store.get_worker(worker.id).drain is None


def test_given_a_long_integer_the_api_reads_then_422_names_the_field(control_plane, running_worker):
    worker = running_worker()
    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/drain", raw='{"timeout_seconds": ' + "1" * 4300 + "}"
    )
    assert status == 422
    assert [d["field"] for d in body["details"]] == ["body.timeout_seconds"]
    assert len(json.dumps(body)) < MAX_ANSWER_BYTES


@pytest.mark.parametrize(
    "raw",
    ['{"dry_run": true, "dry_run": false}', '{"dry_run": true, "dry\\u005frun": false}'],
)
def test_given_a_key_twice_then_400_names_it_and_no_drain_starts(control_plane, running_worker, raw):
    # The last one used to win: this body started a real drain.
    worker = running_worker()
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", raw=raw)
    assert (status, body["error"]) == (400, "MALFORMED_JSON")
    assert '"dry_run"' in body["message"]
    assert control_plane.ctx.store.get_worker(worker.id).drain is None


def test_given_a_key_twice_in_a_nested_object_then_400(control_plane, running_worker):
    worker = running_worker()
    raw = '{"name": "register-license", "parameters": {"a": "1", "a": "2"}}'
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/operations", raw=raw)
    assert (status, body["error"]) == (400, "MALFORMED_JSON")


def test_given_an_unpaired_surrogate_in_a_tag_then_400_and_no_template(control_plane):
    # "\\ud800" is not Unicode text: as a tag key it used to be stored mangled, and the template made.
    raw = '{"instance_type": "m5.large", "ami_name_filter": "x", "capacity": 1, "tags": {"team\\ud800": "a"}}'
    status, body = control_plane.api("PUT", "/api/v1/templates/lab", raw=raw)
    assert (status, body["error"]) == (400, "MALFORMED_JSON")
    assert "surrogate" in body["message"]
    assert control_plane.api("GET", "/api/v1/templates/lab")[0] == 404


def test_given_an_array_on_a_pool_drain_then_422_names_the_body_and_the_pool_does_not_drain(control_plane):
    # `[null]` once started the drain with every default: Powertools read the array's first element.
    control_plane.api("PUT", "/api/v1/pools/labs", {})
    status, body = control_plane.api("POST", "/api/v1/pools/labs/drain", raw="[null]")
    assert status == 422
    assert body["details"] == [{"field": "body", "reason": "must be one JSON object, not an array"}]
    assert control_plane.api("GET", "/api/v1/pools/labs")[1]["drain_generation"] == 0


def test_given_an_array_of_states_then_422_and_the_instance_keeps_its_state(control_plane, running_worker):
    worker = running_worker()
    _, placed = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})
    status, body = control_plane.api(
        "POST", f"/api/v1/instances/{placed['id']}/state", [{"state": "RUNNING"}, {"state": "FAILED"}]
    )
    assert (status, [d["field"] for d in body["details"]]) == (422, ["body"])
    assert control_plane.api("GET", f"/api/v1/instances/{placed['id']}")[1]["state"] == "SCHEDULED"


@pytest.mark.parametrize("raw", ["[]", "[null]", "[{}]", '"lab"', "7", "true"])
def test_given_a_body_that_is_not_an_object_then_every_route_answers_422_naming_the_body(control_plane, raw):
    for method, path in _body_routes():
        status, body = control_plane.api(method, path, raw=raw)
        assert (status, body["error"]) == (422, "VALIDATION_FAILED"), (method, path)
        assert [d["field"] for d in body["details"]] == ["body"], (method, path)


# ---- how much the API reads, and how much it answers -------------------------------------------------


def test_given_tens_of_thousands_of_unknown_keys_then_the_422_lists_the_first_and_counts_them_all(
    control_plane, running_worker
):
    # 0.98 MB of unknown keys once answered 7.4 MB: past Lambda's 6 MB response limit, a 502 on AWS.
    worker = running_worker()
    raw = json.dumps({f"k{n}": 1 for n in range(90_000)}, separators=(",", ":"))
    assert 0.9 * MAX_BODY_BYTES < len(raw) < MAX_BODY_BYTES
    response = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", raw=raw)
    status, body = response
    assert status == 422
    assert len(body["details"]) == 20
    assert body["details_total"] == 90_000
    assert body["message"].endswith("and 89,980 more")
    assert len(json.dumps(body)) < MAX_ANSWER_BYTES


def test_given_a_key_of_a_megabyte_then_the_answer_quotes_only_its_start(control_plane, running_worker):
    worker = running_worker()
    raw = json.dumps({"k" * (MAX_BODY_BYTES // 2): 1, "timeout_seconds": "x" * 100_000})
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", raw=raw)
    assert status == 422
    assert body.get("details_total") is None
    assert len(body["details"]) == 2
    assert len(json.dumps(body)) < MAX_ANSWER_BYTES


def test_given_a_body_at_the_cap_then_it_is_read_and_one_byte_more_is_413(control_plane, running_worker):
    worker = running_worker()
    frame = '{"reason": ""}'
    at_cap = frame.replace('""', '"' + "x" * (MAX_BODY_BYTES - len(frame)) + '"')
    assert len(at_cap.encode()) == MAX_BODY_BYTES
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", raw=at_cap)
    assert (status, [d["field"] for d in body["details"]]) == (
        422,
        ["body.reason"],
    )  # read: too long a reason
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", raw=at_cap + " ")
    assert (status, body["error"], body["details"]) == (
        413,
        "PAYLOAD_TOO_LARGE",
        {"max_bytes": MAX_BODY_BYTES},
    )
    # The cap counts bytes, not characters: half as many two-byte characters are just as many bytes.
    wide = frame.replace('""', '"' + "\u00e9" * (MAX_BODY_BYTES // 2) + '"')
    assert len(wide) < MAX_BODY_BYTES < len(wide.encode())
    assert control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", raw=wide)[0] == 413
    assert control_plane.ctx.store.get_worker(worker.id).drain is None


def test_given_a_ten_megabyte_body_then_413_and_a_small_answer(control_plane, running_worker):
    worker = running_worker()
    raw = json.dumps({f"unknown{n}": "x" * 100 for n in range(90_000)})
    assert len(raw) > 10_000_000
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", raw=raw)
    assert (status, body["error"]) == (413, "PAYLOAD_TOO_LARGE")
    assert len(json.dumps(body)) < MAX_ANSWER_BYTES


# ---- values that disagree with the fleet -----------------------------------------------------------


def test_given_a_region_the_stage_does_not_manage_then_422_names_it_and_no_worker_is_made(control_plane):
    # The worker used to be created, then stayed PENDING for ever: its launch refused every cycle.
    _template(control_plane)
    status, body = control_plane.api("POST", "/api/v1/workers", {"template": "lab", "region": "zz-nowhere-9"})
    assert status == 422
    assert body["details"] == [
        {
            "field": "region",
            "reason": "'zz-nowhere-9' is not a region this stage manages; it manages us-east-1",
        }
    ]
    assert control_plane.api("GET", "/api/v1/workers")[1]["items"] == []
    status, body = control_plane.api("POST", "/api/v1/workers", {"template": "lab", "region": "us-east-1"})
    assert (status, body["region"]) == (201, "us-east-1")


def test_given_configured_regions_then_only_they_take_workers(control_plane, monkeypatch):
    _template(control_plane)
    monkeypatch.setenv("REGION_CONFIGS", '{"eu-west-1": {}, "eu-central-1": {}}')
    refresh_process_caches()
    try:
        created = control_plane.api("POST", "/api/v1/workers", {"template": "lab", "region": "eu-west-1"})
        # Without a region a worker goes to the API's own, which this stage does not manage.
        status, body = control_plane.api("POST", "/api/v1/workers", {"template": "lab"})
    finally:
        # The settings are cached for the process: the next test must not inherit these regions.
        monkeypatch.delenv("REGION_CONFIGS")
        refresh_process_caches()
    assert created[0] == 201
    assert (status, body["details"][0]["field"]) == (422, "region")
    assert "eu-central-1, eu-west-1" in body["details"][0]["reason"]


@pytest.mark.parametrize(
    ("claim", "field"),
    [
        ({"template": "other"}, "template"),
        ({"pool": "elsewhere"}, "pool"),
        ({"template": "lab", "pool": "x"}, "pool"),
    ],
)
def test_given_a_worker_id_with_a_template_or_pool_it_does_not_have_then_422_and_nothing_is_placed(
    control_plane, running_worker, claim, field
):
    # The instance used to be recorded under the worker's template and pool, not the ones asked for.
    worker = running_worker(pool="labs")
    status, body = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id, **claim})
    assert status == 422
    assert [d["field"] for d in body["details"]] == [field]
    assert control_plane.ctx.store.get_worker(worker.id).active_instances == 0


def test_given_a_worker_id_with_its_own_template_and_pool_then_the_instance_is_placed(
    control_plane, running_worker
):
    worker = running_worker(pool="labs")
    status, body = control_plane.api(
        "POST", "/api/v1/instances", {"worker_id": worker.id, "template": "lab", "pool": "labs"}
    )
    assert (status, body["worker_id"], body["template"], body["pool"]) == (201, worker.id, "lab", "labs")


def test_given_a_worker_without_a_pool_and_a_pool_named_then_422(control_plane, running_worker):
    worker = running_worker()
    status, body = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id, "pool": "labs"})
    assert (status, body["details"][0]["field"]) == (422, "pool")
    assert "has pool none" in body["details"][0]["reason"]


def test_given_ten_thousand_unknown_workers_in_a_rollout_then_422_names_ten_and_counts_the_rest(
    control_plane,
):
    unknown = [f"w-gone-{n:05d}" for n in range(10_000)]
    status, body = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": unknown})
    assert (status, [d["field"] for d in body["details"]]) == (422, ["worker_ids"])
    reason = body["details"][0]["reason"]
    assert reason == f"unknown workers: {', '.join(unknown[:10])} and 9,990 more"
    assert control_plane.api("GET", "/api/v1/rollouts")[1]["items"] == []
