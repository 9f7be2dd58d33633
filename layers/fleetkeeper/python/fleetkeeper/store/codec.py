"""Conversion between pydantic records and DynamoDB attribute maps."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, TypeVar

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from pydantic import BaseModel

from fleetkeeper.domain.errors import InvalidInput

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


def encode_page_token(last_evaluated_key: Mapping[str, Any] | None) -> str | None:
    if not last_evaluated_key:
        return None
    raw = json.dumps(deserialize(last_evaluated_key), separators=(",", ":"), sort_keys=True)
    return base64.urlsafe_b64encode(raw.encode()).decode()


def decode_page_token(token: str | None) -> dict[str, Any] | None:
    if not token:
        return None
    try:
        plain = json.loads(base64.urlsafe_b64decode(token.encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput("next_token", "is not a token this API issued") from exc
    if not isinstance(plain, dict) or not all(isinstance(v, str) for v in plain.values()):
        raise InvalidInput("next_token", "is not a token this API issued")
    return serialize(plain)
