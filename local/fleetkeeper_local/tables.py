"""What the local layers that watch DynamoDB calls (aws_rules.py, index_lag.py) need to know of a table and
of a request: the table's keys and indexes, an item's key, and the items a write changes."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TableShape:
    name: str
    hash_key: str
    range_key: str | None
    # index name -> (hash attribute, range attribute, projection type)
    indexes: Mapping[str, tuple[str, str | None, str]]
    # index name -> the non-key attributes an INCLUDE projection names
    included: Mapping[str, frozenset[str]] = field(default_factory=dict)

    @property
    def index_attributes(self) -> frozenset[str]:
        return frozenset(a for h, r, _ in self.indexes.values() for a in (h, r) if a)

    @property
    def key_names(self) -> tuple[str, ...]:
        return (self.hash_key, self.range_key) if self.range_key else (self.hash_key,)

    def item_key(self, item: Mapping[str, Any]) -> str:
        return json.dumps([item.get(name) for name in self.key_names], sort_keys=True)

    def index_entries(self, attributes: Mapping[str, Any]) -> dict[str, str]:
        """The partition key value of each index the item has an entry in (indexes are sparse)."""
        entries: dict[str, str] = {}
        for name, (hash_attribute, range_attribute, _) in self.indexes.items():
            if hash_attribute in attributes and (range_attribute is None or range_attribute in attributes):
                entries[name] = key_text(attributes[hash_attribute])
        return entries

    def index_entry(self, index: str, item: Mapping[str, Any]) -> dict[str, Any] | None:
        """The item as `index` holds it (its projection), or None when the item has no entry there."""
        hash_attribute, range_attribute, projection = self.indexes[index]
        if hash_attribute not in item or (range_attribute is not None and range_attribute not in item):
            return None
        if projection == "ALL":
            return dict(item)
        kept = {*self.key_names, hash_attribute, *([range_attribute] if range_attribute else [])}
        if projection == "INCLUDE":
            kept |= self.included.get(index, frozenset())
        return {name: value for name, value in item.items() if name in kept}


def describe(client: Any, name: str) -> TableShape:
    """The table's shape, from DescribeTable (raises what DescribeTable raises)."""
    description = client.describe_table(TableName=name)["Table"]
    keys = {k["KeyType"]: k["AttributeName"] for k in description["KeySchema"]}
    indexes: dict[str, tuple[str, str | None, str]] = {}
    included: dict[str, frozenset[str]] = {}
    for index in description.get("GlobalSecondaryIndexes", []):
        index_keys = {k["KeyType"]: k["AttributeName"] for k in index["KeySchema"]}
        projection = index.get("Projection", {})
        indexes[index["IndexName"]] = (
            index_keys["HASH"],
            index_keys.get("RANGE"),
            projection.get("ProjectionType", "ALL"),
        )
        included[index["IndexName"]] = frozenset(projection.get("NonKeyAttributes", []))
    return TableShape(name, keys["HASH"], keys.get("RANGE"), indexes, included)


def key_text(value: Any) -> str:
    """A key attribute value ({"S": "x"}) as text."""
    if isinstance(value, Mapping) and value:
        return str(next(iter(value.values())))
    return str(value)


def write_items(operation: str, body: Mapping[str, Any]) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(table, action, spec) for every item a write request changes or checks."""
    if operation in ("PutItem", "UpdateItem", "DeleteItem"):
        yield str(body.get("TableName", "")), operation.removesuffix("Item"), body
    elif operation == "TransactWriteItems":
        for entry in body.get("TransactItems") or []:
            for action, spec in entry.items():
                yield str(spec.get("TableName", "")), action, spec
    elif operation == "BatchWriteItem":
        for table_name, requests in (body.get("RequestItems") or {}).items():
            for request in requests:
                if "PutRequest" in request:
                    yield table_name, "Put", request["PutRequest"]
                elif "DeleteRequest" in request:
                    yield table_name, "Delete", request["DeleteRequest"]
