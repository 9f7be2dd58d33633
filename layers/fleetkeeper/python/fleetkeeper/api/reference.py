"""docs/api.md, rendered from the OpenAPI contract so the reference cannot drift from the code.

Regenerate with `python -m fleetkeeper.api.reference > docs/api.md`; tests/unit/test_api_reference.py
fails when the checked-in file differs.
"""

from __future__ import annotations

import json
from typing import Any, Final

from fleetkeeper.api.body import MAX_BODY_BYTES, MAX_JSON_DEPTH
from fleetkeeper.api.errors import MAX_ERROR_DETAILS, RETRY_AFTER_SECONDS, STATUS_FOR_ERROR
from fleetkeeper.api.idempotency import HEADER, MAX_KEY_LENGTH
from fleetkeeper.api.schemas import MIN_DRAIN_TIMEOUT_SECONDS
from fleetkeeper.domain.drain_policy import MAX_DEADLINE_MOVES
from fleetkeeper.domain.models import MAX_DRAIN_TIMEOUT_SECONDS

_METHOD_ORDER: Final = ("get", "post", "put", "patch")

_ERROR_ROWS: Final = (
    (
        "400",
        "`MALFORMED_JSON`",
        "the body is not JSON the API reads: malformed, a key twice in one object, `NaN` or `Infinity`, a "
        "number out of range, an unpaired surrogate, or nested too deep",
    ),
    (
        "403",
        "`FORBIDDEN`",
        "an internal route, and the caller is not one of the stage's tooling principals; the health route, "
        "and the caller is neither a worker-agent nor a tooling principal",
    ),
    ("404", "`NOT_FOUND`", "no such worker, instance, template, pool or route"),
    ("405", "`METHOD_NOT_ALLOWED`", "the path exists, not with this method; `Allow` names the ones it has"),
    (
        "409",
        "`ILLEGAL_TRANSITION`, `CONFLICT`, `DRAIN_IN_PROGRESS`",
        "the entity's state does not allow this; `details.current_status` says which",
    ),
    (
        "409",
        "`DRAIN_FINISHING`",
        "a cancel, deadline move or force after the drain's Finish step began its before-stop operations "
        "and stop; the worker stops",
    ),
    (
        "409",
        "`DEADLINE_PASSED`",
        "a deadline move after the drain's deadline passed (or it was forced): its force may have begun",
    ),
    (
        "409",
        "`TOO_MANY_DEADLINE_MOVES`",
        f"the drain's deadline already moved {MAX_DEADLINE_MOVES} times; force it or cancel it",
    ),
    ("409", "`NO_CAPACITY`", "no free slot for the placement: an answer about the fleet, it never pages"),
    ("409", "`REQUEST_IN_PROGRESS`", f"a request with the same `{HEADER}` is still running; retry shortly"),
    ("409", "`OPERATION_IN_FLIGHT`", "the worker already runs an operation; `details` names it"),
    (
        "413",
        "`PAYLOAD_TOO_LARGE`",
        f"the body is larger than {MAX_BODY_BYTES} bytes; `details.max_bytes` says so",
    ),
    (
        "415",
        "`UNSUPPORTED_MEDIA_TYPE`",
        "a Content-Type other than `application/json` on a route that takes a body, with a body or without",
    ),
    ("422", "`VALIDATION_FAILED`, `INVALID_INPUT`", "a value of the wrong type, shape or range, named"),
    ("422", "`IDEMPOTENCY_KEY_REUSED`", f"the `{HEADER}` was already used with a different body"),
    ("500", "`INTERNAL`", "a bug of ours (it raises the API 5xx alarm)"),
    (
        "503",
        "`WORKFLOW_UNAVAILABLE`",
        f"the drain workflow could not start after retries; nothing changed; retry after `Retry-After` "
        f"({RETRY_AFTER_SECONDS} s). Rare, and counted by the 5xx alarm on purpose",
    ),
    (
        "503",
        "`SERVICE_UNAVAILABLE`",
        f"AWS stayed throttled or unavailable through every retry; nothing was half-written; retry after "
        f"`Retry-After` ({RETRY_AFTER_SECONDS} s)",
    ),
)
_ERROR_TABLE: Final = "\n".join(
    ["| status | error codes | meaning |", "|---|---|---|"]
    + [f"| {status} | {codes} | {meaning} |" for status, codes, meaning in _ERROR_ROWS]
)

_PREAMBLE: Final = f"""# Admin API reference

Generated from the OpenAPI contract (`GET /openapi.json`) by `python -m fleetkeeper.api.reference`;
do not edit by hand. Swagger UI serves the same contract at `GET /docs` (locally, and on AWS where the
stage enables `api.swagger_ui` in cdk.json, behind the same IAM authorization).

## Authentication

Every request is signed with AWS Signature Version 4 (API Gateway `AWS_IAM` authorization). Who signed is
the actor of every change: audit entries, `requested_by`, `cancelled_by` and `terminated_by` all name the
signing principal, never a field of the body. The stack exports three IAM policies: operator (every
public route), read-only (GET), and internal tooling (`POST /api/internal/...` only, which the other two
explicitly deny).

## Internal routes

`POST /api/internal/...` serves GC and admin tooling, and is locked twice, both times against the stage's
`api.tooling_principals` (IAM role or user ARNs in cdk.json):

- At the gateway: the API's resource policy denies `execute-api:Invoke` on `/api/internal` and
  `/api/internal/*` (every stage, every method) to any principal whose `aws:PrincipalArn` is not one of
  them. An explicit Deny on the API wins over every identity policy, so AdministratorAccess or a broad
  `execute-api:Invoke` grant does not reach these routes. With no tooling principals nobody can call
  them; a tooling principal still needs the tooling policy (or another Invoke grant) to be allowed.
- In the function: the route answers 403 `FORBIDDEN` unless the signing principal is one of them. A role
  matches its sessions (`arn:aws:sts::<account>:assumed-role/<role>/<session>`); a role's path is not
  part of who it is.

Why both: IAM authorizes the request for the resource path API Gateway matched, and API Gateway matches
paths case-sensitively and by its own reading of percent-escapes, doubled slashes and trailing slashes,
which need not be the path the function routes on. A spelling such as `/api/%69nternal/...` or
`/api/internal/.../status/` may reach the function through `/api/{{proxy+}}` (which operators may invoke)
rather than through the resource the Deny names. So the check sits in the route function, not on a path
prefix: whatever spelling routes to the internal handler meets it, and every other spelling is a 404.

The route keeps its own resource (`/api/internal/{{proxy+}}`) on the one API and stage: one endpoint and
one signing set-up for operators and tooling, while the resource policy, the operator and read-only
policies' Deny and the route's check all name it exactly. A separate API would add a URL to distribute
without narrowing who can call the route.

## Errors

Every error is an `ErrorBody`: `{{"error": CODE, "message": text, "details": ...}}`. For 422 `details`
lists `{{"field", "reason"}}` for each bad value (`body.<field>`, `query.<name>`, `path.<name>`,
`header.<name>` or a bare name for checks made after parsing); for 404 and 409 it describes the entity.
No answer grows with the request: `details` lists at most the first {MAX_ERROR_DETAILS} bad values, and
`details_total` then says how many there were; client text an error quotes is cut to a few hundred
characters.

{_ERROR_TABLE}

## Bodies

A route that takes a body reads one JSON object, sent as `application/json` (any case, any parameters
such as `charset`), of at most {MAX_BODY_BYTES} bytes (1 MiB, far above any request of this contract;
larger is a 413). No body, an empty one or `null` means "no body": routes whose body is optional then use
their defaults, the others answer 422. The JSON is read strictly (RFC 8259): a key twice in one object is
a 400, not "the last one wins"; `NaN`, `Infinity`, a number beyond a double or an integer of more than
4300 digits, an escaped unpaired surrogate and nesting deeper than {MAX_JSON_DEPTH} levels are 400s. An
array, string, number or boolean at the top is a 422 naming `body`, never read as its first element.
Routes that take no body ignore one. On AWS, a body near or above Lambda's 6 MB invocation limit never
reaches the function: API Gateway or Lambda refuses it first, with an answer that is not an `ErrorBody`.

Values are strict: `true` is not a number, `"60"` is not an integer, `0` is not a boolean, and a timestamp
is an RFC 3339 string with its offset, e.g. `2099-03-01T09:00:00Z` (a naive time, an epoch number, a space
for the `T` or an offset without its colon is refused). An integer is written without a fraction part,
in every field: `600`, not `600.0` (which JSON Schema would call an integer too). Digits are ASCII:
`"٣"` is not 3. A `reason` (of a drain, a cancel, a force, a rollout or its moves, an instance's state)
is 1 to 500 characters, or left out; `""` is refused. A template's `tags` follow EC2's rules: keys of 1 to
128 and values of up to 256 letters, digits, spaces and `+ - = . _ : / @`, no key starting with `aws:`,
at most 50 tags. A drain timeout is a whole number of seconds from
{MIN_DRAIN_TIMEOUT_SECONDS} to {MAX_DRAIN_TIMEOUT_SECONDS}; leave it out for the default (the template's
timeout for a worker, 300 s for a pool). An empty drain body means all defaults. A running drain's
deadline moves with `PATCH .../drain {{"timeout_seconds": N}}`: N is its whole timeout, counted from its
`started_at`, in the same range; a deadline that would already be past forces the drain now. Some values
are checked against the fleet, each a 422 naming the field: a worker's `region` must be one the stage
manages, and a placement's `template` or `pool` next to a `worker_id` must be that worker's own.

A query parameter is given once: `?drifted=true&drifted=false` is a 422 naming `query.drifted`, never
one of the two. Its value is text read as the contract's type is written: a boolean is `true` or `false`
(not `yes`, `1`, `on` or `True`), an integer is its decimal digits 0-9 (not `5.0`, `+5`, ` 5` or `5_0`).

## Pages

List routes return `next_token` while more items remain. A token is opaque and bound to the query that
issued it: it carries the start key and a fingerprint of the query (index, key condition, filters). It is
checked, not signed, so no secret has to be provisioned: a token used with other filters, or whose start
key lies outside the query's partition, is a 422 naming `next_token`, and a client can never start a page
outside a query it may run anyway. A listing whose key is split into write shards (workers, instances in
a state) reads them one after another: its token also names the write shard it stopped in. A page holds
at most `limit` items and may hold fewer (filters, or items that changed since the index was written)
while a token is returned; follow tokens until there is none. What a listing of every worker promises
while workers change status is in docs/data-model.md, "Listing every worker". Tokens issued before an
upgrade that changes how a listing is read (docs/deploy.md, "Upgrading the table") are refused the same
way: start the listing again.

## Idempotency

`POST`, `PUT` and `PATCH` accept an `{HEADER}` header (at most {MAX_KEY_LENGTH} characters). The first
response is kept for the stage's `idempotency_ttl_seconds` and replayed for the same key, caller, method,
path and body; the body is compared as parsed JSON, so key order and whitespace do not matter. The same
key with a different body is a 422 `IDEMPOTENCY_KEY_REUSED`.

## Routes
"""


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        if key in schema:
            names = [_schema_name(part) for part in schema[key] if part.get("type") != "null"]
            return " | ".join(names) + (" (optional)" if len(names) < len(schema[key]) else "")
    return str(schema.get("type", "object"))


def _request_example(document: dict[str, Any], body: dict[str, Any]) -> Any:
    schema = body["content"]["application/json"]["schema"]
    name = _schema_name(schema).split(" ")[0]
    component = document["components"]["schemas"].get(name, {})
    examples = component.get("examples") or []
    return examples[0] if examples else None


def render(document: dict[str, Any]) -> str:
    """The Markdown reference of an OpenAPI document (the one `contract()` returns)."""
    lines = [_PREAMBLE]
    for path in sorted(document["paths"]):
        for method in _METHOD_ORDER:
            operation = document["paths"][path].get(method)
            if operation is None:
                continue
            lines.append(f"### `{method.upper()} {path}`\n")
            lines.append(f"**{operation['summary']}** ({operation['tags'][0]})\n")
            lines.append(f"{operation['description']}\n")
            parameters = operation.get("parameters") or []
            if parameters:
                lines.append("| parameter | in | required | type |")
                lines.append("|---|---|---|---|")
                for parameter in parameters:
                    schema = parameter.get("schema", {})
                    bounds = [
                        f"{key} {schema[key]}"
                        for key in ("minLength", "maxLength", "minimum", "maximum", "pattern")
                        if key in schema
                    ]
                    kind = _schema_name(schema) + (f" ({', '.join(bounds)})" if bounds else "")
                    required = "yes" if parameter.get("required") else "no"
                    lines.append(f"| `{parameter['name']}` | {parameter['in']} | {required} | {kind} |")
                lines.append("")
            body = operation.get("requestBody")
            if body:
                schema = body["content"]["application/json"]["schema"]
                lines.append(f"Body: `{_schema_name(schema)}` (application/json)")
                example = _request_example(document, body)
                if example is not None:
                    lines.append("\n```json\n" + json.dumps(example, sort_keys=True) + "\n```")
                lines.append("")
            lines.append("| status | answer |")
            lines.append("|---|---|")
            for status in sorted(operation["responses"], key=int):
                response = operation["responses"][status]
                content = response.get("content", {}).get("application/json", {}).get("schema", {})
                model = _schema_name(content) if content else ""
                description = response.get("description", "").replace("|", "\\|")
                lines.append(f"| {status} | `{model}`: {description} |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def covered_error_codes() -> set[str]:
    """The error codes the mapping knows; the reference's table must name every one of them."""
    return {kind.code for kind in STATUS_FOR_ERROR}


if __name__ == "__main__":
    from fleetkeeper.api.app import contract

    print(render(contract()), end="")
