"""What a request body must be before any model sees it: one JSON object, sent as application/json.

Read in one place (the request-validation middleware, api/app.py) for every route that takes a body:
- a Content-Type, when there is one, is `application/json` (any case, any parameters); anything else is
  a 415, with a body or without;
- at most `MAX_BODY_BYTES`, else 413: a bigger body costs the function time and memory for nothing;
- JSON as RFC 8259 writes it: no duplicate keys (Python keeps the last one silently, so
  `{"dry_run": true, "dry_run": false}` would start a real drain), no NaN or Infinity, no number beyond
  what a float holds or an int may parse from text, no unpaired surrogate (not Unicode, DynamoDB
  refuses it), nesting at most `MAX_JSON_DEPTH` levels; each a 400;
- one object at the top: Powertools would take the first element of an array as the body, so an array
  (or a bare string, number or boolean) is a 422 naming `body`. `null` or no body at all is "no body",
  which routes with an optional body read as all defaults.
"""

from __future__ import annotations

import json
import math
from typing import Any, Final

from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent

from fleetkeeper.api.errors import (
    JSON,
    MalformedJson,
    PayloadTooLarge,
    UnsupportedMediaType,
    ValidationFailed,
    clipped,
)
from fleetkeeper.api.schemas import ErrorDetail

# Far above any request of the contract (the largest, an orphan confirmation of 10,000 worker ids, is
# about 250 KB) and far below API Gateway's 10 MB and Lambda's 6 MB invocation limit.
MAX_BODY_BYTES: Final = 1024 * 1024
# Deeper than this is no request body of ours; a parser would exhaust Python's recursion first.
MAX_JSON_DEPTH: Final = 64


def foreign_content_type(event: BaseProxyEvent) -> str | None:
    """The request's Content-Type when it is not JSON; None when it is JSON or absent."""
    content_type = (event.headers.get("Content-Type") or event.headers.get("content-type") or "").strip()
    # Media types are case-insensitive (RFC 9110, 8.3.1): APPLICATION/JSON is JSON.
    media_type = content_type.split(";", 1)[0].strip().lower()
    if content_type and media_type != JSON:
        return content_type
    return None


def json_depth(text: str) -> int:
    """How deeply a JSON text nests arrays and objects, counted without parsing it."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def read_object(event: BaseProxyEvent) -> dict[str, Any] | None:
    """The request body as one JSON object; None when there is none (no body, or `null`)."""
    foreign = foreign_content_type(event)
    if foreign is not None:
        raise UnsupportedMediaType(foreign)
    text = _text(event)
    if not text:
        return None
    if json_depth(text) > MAX_JSON_DEPTH:
        raise MalformedJson(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_unique_keys,
            parse_constant=_no_constant,
            parse_int=_int,
            parse_float=_finite_float,
        )
    except json.JSONDecodeError as exc:
        raise MalformedJson(f"the body is not valid JSON: {exc.msg} at position {exc.pos}") from exc
    if value is None:
        return None
    if not isinstance(value, dict):
        kind = _JSON_KINDS.get(type(value), "a number")
        raise ValidationFailed([ErrorDetail(field="body", reason=f"must be one JSON object, not {kind}")])
    _refuse_surrogates(value)
    return value


_JSON_KINDS: Final[dict[type, str]] = {list: "an array", str: "a string", bool: "a boolean"}


def _text(event: BaseProxyEvent) -> str:
    # Each character is at least one byte: a text body this long is too large without encoding it.
    if not event.is_base64_encoded and len(event.body or "") > MAX_BODY_BYTES:
        raise PayloadTooLarge(MAX_BODY_BYTES)
    try:
        text = event.decoded_body or ""
        size = len(text.encode("utf-8", errors="surrogatepass"))
    except (ValueError, UnicodeError) as exc:  # a base64 body that is not base64 of UTF-8 text
        raise MalformedJson("the body is not UTF-8 text") from exc
    if size > MAX_BODY_BYTES:
        raise PayloadTooLarge(MAX_BODY_BYTES)
    return text


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise MalformedJson(
                    f"the key {clipped(json.dumps(key))} appears more than once in one object"
                )
            seen.add(key)
    return found


def _no_constant(name: str) -> Any:
    raise MalformedJson(f"{name} is not a JSON number")


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:  # beyond Python's limit on the digits of an int read from text
        raise MalformedJson(f"a number of {len(text)} digits is longer than the API reads") from exc


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise MalformedJson(f"the number {clipped(text)} is beyond what a double holds")
    return value


def _refuse_surrogates(value: Any) -> None:
    """An escaped lone surrogate (\\ud800) parses into a str that is not Unicode text: refuse it here,
    before it reaches a model that would accept it or a client that cannot encode it."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings = [item]
        elif isinstance(item, dict):
            strings = list(item)
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for text in strings:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise MalformedJson(
                    "the body holds an unpaired surrogate (\\ud800-\\udfff), not text"
                ) from exc
