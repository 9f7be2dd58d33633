"""The OpenAPI contract says what the code does, and docs/api.md is that contract rendered."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext

from fleetkeeper.api.app import SIGV4, app, contract
from fleetkeeper.api.reference import covered_error_codes, render
from fleetkeeper_local.controlplane import api_event
from fleetkeeper_local.lambdas import LocalLambdaContext

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return contract()


def operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if method in ("get", "post", "put", "patch")
    ]


def test_given_the_contract_then_every_error_is_one_error_body_including_422(document):
    assert "HTTPValidationError" not in document["components"]["schemas"]
    assert set(document["components"]["schemas"]["ErrorBody"]["properties"]) == {
        "error",
        "message",
        "details",
        "details_total",
    }
    for path, method, operation in operations(document):
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                schema = response["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorBody"}, (path, method, status)


def test_given_a_write_route_then_it_lists_the_statuses_it_really_answers(document):
    for path, method, operation in operations(document):
        statuses = {int(s) for s in operation["responses"]}
        assert 422 in statuses, (path, method)
        if "requestBody" in operation:
            assert {400, 413, 415} <= statuses, (path, method)
    created = document["paths"]["/api/v1/workers"]["post"]["responses"]
    assert set(created) >= {"201", "409"}
    assert "200" not in created
    drain = document["paths"]["/api/v1/workers/{worker_id}/drain"]["post"]["responses"]
    assert {"200", "202", "404", "409", "503"} <= set(drain)
    placed = document["paths"]["/api/v1/instances"]["post"]["responses"]
    assert "503" not in placed  # no capacity is a 409


def test_given_the_contract_then_each_operation_has_its_resource_tag_a_summary_and_a_description(document):
    # Swagger UI once listed every route under one "default" tag, most summaries repeating the path.
    tags = {tag["name"]: tag.get("description") for tag in document["tags"]}
    assert len(tags) == len(document["tags"]) >= 10
    assert all(tags.values()), "every resource says what it is"
    used = set()
    for path, method, operation in operations(document):
        where = f"{method.upper()} {path}"
        (tag,) = operation["tags"]
        assert tag in tags, where
        used.add(tag)
        summary, description = operation.get("summary", ""), operation.get("description", "")
        assert summary, where
        assert "/api/" not in summary, where
        assert len(description) > len(summary), where
        # The description says the route's own errors; the common ones (400, 413, 415, 422 for a
        # value of the wrong form) are the reference's, and so is 404 for a path no route takes, the
        # only 404 of a route that names nothing (or of a PUT, which creates what it names).
        own = {403, 409, 503} | ({404} if "{" in path and method != "put" else set())
        for status in own & {int(s) for s in operation["responses"]}:
            assert str(status) in description, (where, status)
    assert used == set(tags)


def test_given_the_contract_then_requests_are_signed_with_sigv4(document):
    scheme = document["components"]["securitySchemes"][SIGV4]
    assert scheme["x-amazon-apigateway-authtype"] == "awsSigv4"
    assert document["security"] == [{SIGV4: []}]


def test_given_a_request_body_then_its_schema_carries_an_example(document):
    schemas = document["components"]["schemas"]
    for path, method, operation in operations(document):
        body = operation.get("requestBody")
        if body is None:
            continue
        schema = body["content"]["application/json"]["schema"]
        ref = schema.get("$ref") or next(p["$ref"] for p in schema["anyOf"] if "$ref" in p)
        assert schemas[ref.rsplit("/", 1)[-1]].get("examples"), (path, method)


def test_given_the_docs_page_then_swagger_ui_is_served_at_docs():
    context = cast(LambdaContext, LocalLambdaContext(function_name="fleetkeeper-api"))
    response = app.resolve(api_event("GET", "/docs"), context)
    assert response["statusCode"] == 200
    assert "swagger" in response["body"].lower()


def test_given_the_contract_then_docs_api_md_is_its_rendering(document):
    assert DOCS.read_text(encoding="utf-8") == render(document), (
        "docs/api.md is stale: run `python -m fleetkeeper.api.reference > docs/api.md`"
    )


def test_given_the_readme_then_its_error_table_names_every_error_code():
    readme = README.read_text(encoding="utf-8")
    for code in covered_error_codes():
        assert f"`{code}`" in readme, code
    assert "409 `NO_CAPACITY`" in readme or "| 409 | `NO_CAPACITY`" in readme
