"""Conversion between pydantic records and DynamoDB attribute maps."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, TypeVar

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from pydantic import BaseModel

from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.store.schema import GSI_KEYS, PARTITION_KEY, SORT_KEY

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()

M = TypeVar("M", bound=BaseModel)


def _to_dynamo_value(value: Any) -> Any:
    if isinstance(value, float):
        return Decimal(str(value))
    if isinstance(value, dict):
        return {k: _to_dynamo_value(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_to_dynamo_value(v) for v in value]
    return value


def _from_dynamo_value(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _from_dynamo_value(v) for k, v in value.items()}
    if isinstance(value, list | set):
        return [_from_dynamo_value(v) for v in value]
    return value


def serialize(plain: Mapping[str, Any]) -> dict[str, Any]:
    """A plain JSON-like mapping to a DynamoDB attribute map; None values are left out."""
    return {k: _serializer.serialize(_to_dynamo_value(v)) for k, v in plain.items() if v is not None}


def serialize_value(value: Any) -> Any:
    return _serializer.serialize(_to_dynamo_value(value))


def deserialize(item: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _from_dynamo_value(_deserializer.deserialize(v)) for k, v in item.items()}


def record_attributes(record: BaseModel) -> dict[str, Any]:
    return record.model_dump(mode="json", exclude_none=True)


def load_record(model: type[M], item: Mapping[str, Any]) -> M:
    """Build a record from a stored item, ignoring key and index attributes."""
    plain = deserialize(item)
    fields = model.model_fields
    return model.model_validate({k: v for k, v in plain.items() if k in fields})


# ---- page tokens -----------------------------------------------------------------------------------
#
# A token is checked, not signed (docs/api.md, "Page tokens"): it carries the start key and a fingerprint
# of the query that produced it. Reading one back, the fingerprint must match the query being run, and
# the start key must hold exactly the key attributes of the table and the queried index, as strings of a
# legal key length, inside the query's partition (and its sort-key prefix). A client can therefore only
# ever start a page somewhere inside the very query it is allowed to run, and no token reaches DynamoDB
# as a key it would reject. No secret is needed, so none has to be provisioned or rotated.

_NOT_OURS = "is not a token this API issued"
_OTHER_QUERY = "belongs to another query: repeat the filters of the request that returned it"
# DynamoDB caps a partition key at 2,048 bytes and a sort key at 1,024; ours are far shorter.
_MAX_KEY_BYTES = 1024
_FINGERPRINTED = ("IndexName", "KeyConditionExpression", "FilterExpression", "ExpressionAttributeValues")


def query_fingerprint(query: Mapping[str, Any]) -> str:
    """What makes two queries the same listing: index, key condition, filters and their values."""
    shape = {name: query.get(name) for name in _FINGERPRINTED}
    raw = json.dumps(shape, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def _key_attributes(query: Mapping[str, Any]) -> set[str]:
    names = {PARTITION_KEY, SORT_KEY}
    index = query.get("IndexName")
    if index is not None:
        partition, sort = GSI_KEYS[index]
        names.add(partition)
        if sort:
            names.add(sort)
    return names


def _inside_query(plain: Mapping[str, str], query: Mapping[str, Any]) -> bool:
    """The start key lies in the query's partition and, if it has one, its sort-key prefix."""
    index = query.get("IndexName")
    partition, sort = GSI_KEYS[index] if index is not None else (PARTITION_KEY, SORT_KEY)
    values = query.get("ExpressionAttributeValues") or {}
    condition = str(query.get("KeyConditionExpression") or "")
    expected_partition = values.get(":pk", {}).get("S")
    if expected_partition is not None and plain.get(partition) != expected_partition:
        return False
    prefix_name = next(
        (name for name in (":prefix", ":w", ":i") if name in values and f"{name})" in condition), None
    )
    if prefix_name and sort:
        return str(plain.get(sort, "")).startswith(values[prefix_name]["S"])
    return True


def encode_page_token(
    last_evaluated_key: Mapping[str, Any] | None, query: Mapping[str, Any] | None = None
) -> str | None:
    if not last_evaluated_key:
        return None
    payload = {"k": deserialize(last_evaluated_key), "q": query_fingerprint(query or {})}
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_page_token(token: str | None, query: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """The start key of a token issued for this query; InvalidInput('next_token') for anything else."""
    if not token:
        return None
    query = query or {}
    try:
        payload = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput("next_token", _NOT_OURS) from exc
    if not isinstance(payload, dict) or set(payload) != {"k", "q"}:
        raise InvalidInput("next_token", _NOT_OURS)
    plain, fingerprint = payload["k"], payload["q"]
    if not isinstance(plain, dict) or not isinstance(fingerprint, str):
        raise InvalidInput("next_token", _NOT_OURS)
    if not hmac.compare_digest(fingerprint, query_fingerprint(query)):
        raise InvalidInput("next_token", _OTHER_QUERY)
    if set(plain) != _key_attributes(query) or not all(
        isinstance(v, str) and 0 < len(v.encode()) <= _MAX_KEY_BYTES for v in plain.values()
    ):
        raise InvalidInput("next_token", _NOT_OURS)
    if not _inside_query(plain, query):
        raise InvalidInput("next_token", _OTHER_QUERY)
    return serialize(plain)


# ---- walks: one listing over several partitions (write shards) -------------------------------------
#
# A listing whose key is split into write shards reads its partitions one after another, each in key
# order; a token names the partition it stopped in (its position in the walk) and the start key inside
# it, with the fingerprint of the whole walk. The start key is checked against that partition's query
# as a single query's token is.


def walk_fingerprint(queries: Sequence[Mapping[str, Any]]) -> str:
    """What makes two walks the same listing: every one of their queries, in order."""
    raw = json.dumps([query_fingerprint(q) for q in queries], separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def encode_walk_token(
    position: int, last_evaluated_key: Mapping[str, Any] | None, queries: Sequence[Mapping[str, Any]]
) -> str | None:
    """The token of a walk stopped at `position`, inside that partition (a start key) or at its start."""
    if position >= len(queries):
        return None
    payload = {
        "p": position,
        "k": deserialize(last_evaluated_key) if last_evaluated_key else None,
        "q": walk_fingerprint(queries),
    }
    raw = json.dumps(payload, separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_walk_token(
    token: str | None, queries: Sequence[Mapping[str, Any]]
) -> tuple[int, dict[str, Any] | None]:
    """(partition position, start key or None) of a token issued for this walk; InvalidInput otherwise."""
    if not token:
        return 0, None
    try:
        payload = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidInput("next_token", _NOT_OURS) from exc
    if not isinstance(payload, dict) or set(payload) != {"p", "k", "q"}:
        raise InvalidInput("next_token", _NOT_OURS)
    position, plain, fingerprint = payload["p"], payload["k"], payload["q"]
    if not isinstance(fingerprint, str) or not isinstance(position, int) or isinstance(position, bool):
        raise InvalidInput("next_token", _NOT_OURS)
    if not hmac.compare_digest(fingerprint, walk_fingerprint(queries)):
        raise InvalidInput("next_token", _OTHER_QUERY)
    if not 0 <= position < len(queries):
        raise InvalidInput("next_token", _NOT_OURS)
    if plain is None:
        return position, None
    query = queries[position]
    if not isinstance(plain, dict):
        raise InvalidInput("next_token", _NOT_OURS)
    if set(plain) != _key_attributes(query) or not all(
        isinstance(v, str) and 0 < len(v.encode()) <= _MAX_KEY_BYTES for v in plain.values()
    ):
        raise InvalidInput("next_token", _NOT_OURS)
    if not _inside_query(plain, query):
        raise InvalidInput("next_token", _OTHER_QUERY)
    return position, serialize(plain)
