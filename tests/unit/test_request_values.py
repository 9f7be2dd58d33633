"""One rule per kind of value, in every request body the contract publishes: an integer is written without
a fraction part (600, not 600.0), a reason is some text or left out (never ""), digits are ASCII, and a
template's tags follow EC2's rules. The fields are found in the contract, so a new one follows the rule
or fails here."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest
from aws_lambda_powertools.event_handler.api_gateway import Route

from fleetkeeper.api.app import app, contract
from fleetkeeper.domain.values import MAX_REASON_LENGTH

DOCUMENT: Final = contract()
SCHEMAS: Final = DOCUMENT["components"]["schemas"]


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = SCHEMAS[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def _kinds(schema: dict[str, Any]) -> set[str]:
    return {str(_resolve(s).get("type")) for s in schema.get("anyOf", [schema])}


def _bodies() -> Iterator[tuple[str, Route, dict[str, Any]]]:
    """Each route that takes a body, its route, and its body model's schema."""
    every = app._static_routes + app._dynamic_routes
    routes = {(r.openapi_path, r.method.lower()): r for r in every if r.include_in_schema}
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if isinstance(operation, dict) and "requestBody" in operation:
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                ref = next(s for s in schema.get("anyOf", [schema]) if "$ref" in s)
                yield f"{method.upper()} {path}", routes[(path, method)], _resolve(ref)


BODIES: Final = list(_bodies())


def _refusals(route: Route, body: dict[str, Any]) -> list[str]:
    _, errors = route.dependant.body_params[0].validate(body, loc=("body",))
    return [".".join(str(p) for p in e["loc"]) for e in errors or []]


def _integer_fields() -> Iterator[tuple[str, Route, dict[str, Any], str, int]]:
    for operation, route, model in BODIES:
        for name, schema in model["properties"].items():
            for part in schema.get("anyOf", [schema]):
                if _resolve(part).get("type") == "integer":
                    yield operation, route, model["examples"][0], name, int(part.get("minimum", 1))


INTEGERS: Final = list(_integer_fields())


def test_given_the_contract_then_the_integer_fields_of_the_bodies_are_found():
    names = {f"{operation} {name}" for operation, _, _, name, _ in INTEGERS}
    assert "POST /api/v1/workers/{worker_id}/drain timeout_seconds" in names
    assert "PUT /api/v1/templates/{name} capacity" in names
    assert "POST /api/v1/rollouts bake_seconds" in names
    assert len(names) >= 10


@pytest.mark.parametrize(
    ("operation", "route", "example", "name", "value"), INTEGERS, ids=[f"{c[0]} {c[3]}" for c in INTEGERS]
)
def test_given_a_whole_number_written_with_a_fraction_then_every_integer_field_refuses_it(
    operation, route, example, name, value
):
    assert f"body.{name}" not in _refusals(route, {**example, name: value}), "the value itself is fine"
    assert _refusals(route, {**example, name: float(value)}) == [f"body.{name}"]
    assert _refusals(route, {**example, name: str(value)}) == [f"body.{name}"]


def test_given_whole_floats_in_nested_integers_then_they_are_refused_too():
    rollouts = next(route for operation, route, _ in BODIES if operation == "POST /api/v1/rollouts")
    pools = next(route for operation, route, _ in BODIES if operation == "PUT /api/v1/pools/{name}")
    assert _refusals(rollouts, {"template": "lab", "checkpoints": [50.0]}) == ["body.checkpoints.0"]
    assert _refusals(rollouts, {"template": "lab", "max_unavailable": 2.0}) == ["body.max_unavailable"]
    budget_max = ["body.disruption.budgets.0.max"]
    assert _refusals(pools, {"disruption": {"budgets": [{"max": 1.0}]}}) == budget_max
    assert _refusals(pools, {"disruption": {"budgets": [{"max": "\u0663"}]}}) == budget_max


REASONS: Final = [
    (operation, route, name)
    for operation, route, model in BODIES
    for name in model["properties"]
    if name.endswith("reason")
]


def test_given_the_contract_then_every_reason_field_is_found():
    # Drains (start, move, force, cancel), pool cancels, rollouts and their moves, instance states, and
    # the internal status report.
    assert len(REASONS) >= 12


@pytest.mark.parametrize(("operation", "route", "name"), REASONS, ids=[f"{c[0]} {c[2]}" for c in REASONS])
def test_given_an_empty_reason_then_every_route_refuses_it_and_takes_it_left_out(operation, route, name):
    # The rollout moves stored "" while the drains refused it: one Reason type everywhere now.
    model = next(m for o, r, m in BODIES if r is route)
    example = {k: v for k, v in model["examples"][0].items() if k != name}
    assert _refusals(route, {**example, name: ""}) == [f"body.{name}"]
    assert _refusals(route, {**example, name: "x" * (MAX_REASON_LENGTH + 1)}) == [f"body.{name}"]
    assert _refusals(route, {**example, name: "kernel patch"}) == []
    assert _refusals(route, example) == []


@pytest.mark.parametrize(
    ("tags", "refused"),
    [
        ({"team": "a\u0000b"}, True),  # once broke the local EC2's XML for every later DescribeInstances
        ({"team\u0007": "a"}, True),
        ({"team": "line\nbreak"}, True),
        ({"team": "a;b"}, True),
        ({"team": "<b>"}, True),
        ({"aws:team": "a"}, True),
        ({"Aws:team": "a"}, True),
        ({"": "a"}, True),
        ({"k" * 129: "a"}, True),
        ({"team": "v" * 257}, True),
        ({f"k{n}": "a" for n in range(51)}, True),
        ({"team": ""}, False),
        ({"k" * 128: "v" * 256}, False),
        ({"Name": "lab sessions", "cost-centre": "4711", "owner": "ops@example.com"}, False),
        ({"équipe": "données", "チーム": "ラボ", "path": "a/b:c=d+e_f.g"}, False),
    ],
)
def test_given_template_tags_then_ec2s_rules_decide_and_name_the_field(tags, refused):
    put = next(route for operation, route, _ in BODIES if operation == "PUT /api/v1/templates/{name}")
    body = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 1, "tags": tags}
    assert _refusals(put, body) == (["body.tags"] if refused else [])
