"""The contract and the validators cannot drift apart.

Every bound, enum, pattern, format and required key the OpenAPI document publishes is checked against what
the API's own validators accept, value for value, just inside and just outside. The document is read as a
client reads it: JSON Schema 2020-12, formats asserted, ECMA-262 regular expressions (jsonschema_rs). The
validators are the ones each route runs on its body and parameters. A value that one side accepts and the
other refuses is drift, with one exception: a rule on the clock (a protection ends in the future, within
366 days), which no schema can state; the field's description says it instead.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any, Final

import jsonschema_rs
import pytest
from aws_lambda_powertools.event_handler.api_gateway import Route

from fleetkeeper.api.app import app, contract

DOCUMENT: Final = contract()
SCHEMAS: Final[dict[str, Any]] = DOCUMENT["components"]["schemas"]
JSON: Final = "application/json"

# What a schema of the contract may say: JSON Schema 2020-12 and OpenAPI 3.1's own keywords. Any other
# key (pydantic's `ge` and `le`, once) is ignored by every client: the contract then allows what the code
# refuses.
KEYWORDS: Final = frozenset(
    {
        "$schema", "$id", "$ref", "$defs", "$anchor", "$dynamicRef", "$dynamicAnchor", "$comment",
        "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "prefixItems", "items",
        "contains", "properties", "patternProperties", "additionalProperties", "propertyNames",
        "unevaluatedItems", "unevaluatedProperties", "type", "const", "enum", "multipleOf", "maximum",
        "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength", "minLength", "pattern", "maxItems",
        "minItems", "uniqueItems", "maxContains", "minContains", "maxProperties", "minProperties", "required",
        "dependentRequired", "format", "title", "description", "default", "deprecated", "readOnly",
        "writeOnly", "examples", "contentEncoding", "contentMediaType", "contentSchema",
        "discriminator", "xml", "externalDocs", "example",
    }
)  # fmt: skip
# Keywords whose value is one schema, a list of schemas, or a map of names to schemas.
_ONE: Final = ("items", "not", "if", "then", "else", "contains", "propertyNames", "additionalProperties")
_LIST: Final = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP: Final = ("properties", "patternProperties", "$defs", "dependentSchemas")
# The one rule on the clock, and how the validator words it.
CLOCK_RULES: Final = ("must be in the future", "must be within 366 days")

_STRINGS: Final = [
    "a", "A1", "-a", "a-", "a.b", "a b", " a", "a ", "a\n", "\na", "é", "a" * 64, "a" * 65, "a" * 128,
    "a" * 129, "a" * 500, "a" * 501,
]  # fmt: skip
_TIMESTAMPS: Final = [
    "2099-03-01T09:00:00Z", "2099-03-01T09:00:00.123+01:00", "2099-03-01T09:00:00", "2099-03-01 09:00:00Z",
    "2099-03-01T09:00Z", "2099-02-30T09:00:00Z", "2099-03-01T09:00:00+0100", "1700000000",
    "2020-03-01T09:00:00Z", f"{datetime.now(UTC).year}-12-31T23:59:59Z",
]  # fmt: skip
_DURATIONS: Final = [
    "2h", "90m", "1h30m", "1d", "45s", "1d2h3m4s", "0s", "367d", "99999999999d", "2H", "h", "1m2h",
    "1d1d", "-2h", "1.5h", "2h ", " 2h", "2h\n",
]  # fmt: skip
_KEYS: Final = [
    "", "k", "good_key", "bad-key", "1bad", "aws:x", "AWS:x", "Aws:x", "k" * 64, "k" * 65, "k" * 128,
    "k" * 129, "k\n",
]  # fmt: skip


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        target = SCHEMAS[schema["$ref"].rsplit("/", 1)[-1]]
        schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def _subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    """The schema and every schema nested in it, walked by keyword (a property may be named `then`)."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key in _ONE:
        yield from _subschemas(schema.get(key))
    for key in _LIST:
        for part in schema.get(key, []):
            yield from _subschemas(part)
    for key in _MAP:
        for part in schema.get(key, {}).values():
            yield from _subschemas(part)


def _validator(schema: dict[str, Any]) -> Any:
    return jsonschema_rs.validator_for(
        {"components": DOCUMENT["components"], **schema}, validate_formats=True
    )


def _first_valid(schema: dict[str, Any], candidates: list[Any]) -> Any:
    check = _validator(schema)
    return next(c for c in candidates if check.is_valid(c))


def _probes(schema: dict[str, Any], depth: int = 0) -> list[Any]:
    """Values at and around every boundary the schema states, and a few of every JSON type."""
    s = _resolve(schema)
    found: list[Any] = [None, True, False, 0, 1, -1, 0.5, 1e300, 10**30, "", "x", [], {}]
    for key in _LIST:
        for part in s.get(key, []):
            found += _probes(part, depth)
    found += list(s.get("examples", [])) + ([s["default"]] if "default" in s else [])
    if "enum" in s:
        found += [*s["enum"], "NOT_A_MEMBER", *(str(v).lower() for v in s["enum"])]
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if key in s:
            bound = s[key]
            if s.get("type") == "integer":
                found += [int(bound) - 1, int(bound), int(bound) + 1]
            else:
                delta = max(abs(bound) * 1e-6, 1e-9)
                found += [bound - delta, bound, bound + delta]
    for key in ("minLength", "maxLength"):
        if key in s:
            found += ["a" * n for n in (s[key] - 1, s[key], s[key] + 1) if n >= 0]
    if s.get("type") == "string" or "pattern" in s or "format" in s:
        examples = [e for e in s.get("examples", []) if isinstance(e, str)]
        found += _STRINGS + _TIMESTAMPS + _DURATIONS
        found += [m for e in examples for m in (e.upper(), e + "\n", " " + e, e + " ", e[:-1], e * 2)]
    if depth < 2 and s.get("type") == "array" and "items" in s:
        items = _probes(s["items"], depth + 1)
        found += [[item] for item in items]
        item = _first_valid(s["items"], items)
        for key in ("minItems", "maxItems"):
            if key in s:
                found += [[item] * n for n in (s[key] - 1, s[key], s[key] + 1) if n >= 0]
    values_schema = s.get("additionalProperties")
    if not isinstance(values_schema, dict):
        values_schema = next(iter(s.get("patternProperties", {}).values()), None)
    if depth < 2 and s.get("type") == "object" and "properties" not in s and values_schema is not None:
        values = _probes(values_schema, depth + 1)
        value = _first_valid(values_schema, values)
        key = _first_valid({**s, "maxProperties": 1, "minProperties": 1}, [{k: value} for k in _KEYS])
        good = next(iter(key))
        found += [{k: value} for k in _KEYS] + [{good: v} for v in values]
        for bound in ("minProperties", "maxProperties"):
            if bound in s:
                found += [{f"k{i}": value for i in range(n)} for n in (s[bound] - 1, s[bound], s[bound] + 1)]
    unique: dict[str, Any] = {}
    for value in found:
        unique.setdefault(json.dumps(value, sort_keys=True), value)
    return list(unique.values())


def _routes() -> dict[tuple[str, str], Route]:
    return {
        (route.openapi_path, route.method.lower()): route
        for route in app._static_routes + app._dynamic_routes
        if route.include_in_schema
    }


def _operations() -> Iterator[tuple[str, str, dict[str, Any], Route]]:
    routes = _routes()
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            if isinstance(operation, dict) and (path, method) in routes:
                yield path, method, operation, routes[(path, method)]


def _on_the_clock(errors: list[dict[str, Any]]) -> bool:
    return all(any(rule in str(e.get("msg")) for rule in CLOCK_RULES) for e in errors)


def _body_cases() -> Iterator[tuple[str, dict[str, Any], Route]]:
    for path, method, operation, route in _operations():
        if "requestBody" in operation:
            yield f"{method.upper()} {path}", operation["requestBody"]["content"][JSON]["schema"], route


_BODY_CASES: Final = list(_body_cases())


@pytest.mark.parametrize(("operation", "schema", "route"), _BODY_CASES, ids=[c[0] for c in _BODY_CASES])
def test_given_a_body_value_at_any_published_boundary_then_the_contract_and_the_validator_agree(
    operation, schema, route
):
    field = route.dependant.body_params[0]
    check = _validator(schema)
    model = _resolve(next(s for s in _subschemas(schema) if "$ref" in s))
    base = model["examples"][0]
    assert check.is_valid(base), f"{operation}: its example breaks the contract"
    drift = []
    for name, property_schema in model["properties"].items():
        without = {k: v for k, v in base.items() if k != name}
        for body in [without] + [{**base, name: value} for value in _probes(property_schema)]:
            published = check.is_valid(body)
            _, errors = field.validate(body, loc=("body",))
            if published == (not errors) or (published and _on_the_clock(errors or [])):
                continue
            side = "the contract allows, the validator refuses" if published else "the validator allows"
            drift.append(f"{operation} body.{name} = {json.dumps(body.get(name, '<absent>'))[:80]}: {side}")
    assert not drift, "\n".join(drift)


def _parameter_cases() -> Iterator[tuple[str, dict[str, Any], Any]]:
    for path, method, operation, route in _operations():
        fields = {f.alias: f for f in route.dependant.path_params + route.dependant.query_params}
        for parameter in operation.get("parameters", []):
            field = fields[parameter["name"]]
            yield f"{method.upper()} {path} {parameter['in']}.{parameter['name']}", parameter["schema"], field


_PARAMETER_CASES: Final = list(_parameter_cases())


@pytest.mark.parametrize(
    ("parameter", "schema", "field"), _PARAMETER_CASES, ids=[c[0] for c in _PARAMETER_CASES]
)
def test_given_a_parameter_at_any_published_boundary_then_the_contract_and_the_validator_agree(
    parameter, schema, field
):
    check = _validator(schema)
    integer = any(s.get("type") == "integer" for s in _subschemas(_resolve(schema)))
    drift = []
    for value in _probes(schema):
        # A parameter arrives as text: an integer one is its number written out, as a client sends it.
        if not (
            isinstance(value, int) and not isinstance(value, bool) if integer else isinstance(value, str)
        ):
            continue
        published = check.is_valid(value)
        _, errors = field.validate(str(value), loc=("query",))
        if published != (not errors):
            side = "the contract allows, the validator refuses" if published else "the validator allows"
            drift.append(f"{parameter} = {json.dumps(value)[:80]}: {side}")
    assert not drift, "\n".join(drift)


def test_given_every_schema_of_the_contract_then_it_says_only_json_schema():
    roots = list(SCHEMAS.values())
    for _, _, operation, _ in _operations():
        roots += [p["schema"] for p in operation.get("parameters", [])]
        roots += [c["schema"] for c in operation.get("requestBody", {}).get("content", {}).values()]
    unknown = {
        (schema.get("title", "?"), key)
        for root in roots
        for schema in _subschemas(root)
        for key in schema
        if key not in KEYWORDS
    }
    assert not unknown


def test_given_the_contract_then_no_date_in_its_examples_or_descriptions_is_in_the_past():
    now = datetime.now(UTC)
    text = json.dumps(DOCUMENT)
    stamps = re.findall(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})", text)
    assert stamps, "the examples show no timestamp at all"
    assert [s for s in stamps if datetime.fromisoformat(s) <= now] == []


def test_given_an_instance_state_report_then_the_contract_offers_no_state_it_refuses():
    state = _resolve(SCHEMAS["InstanceStateRequest"]["properties"]["state"])
    assert "SCHEDULED" not in state["enum"]
