"""The one table definition. CDK, the local stack and the tests all build the table from here.

Single-table layout: workers, templates, pools, instances and audit events share one table, keyed by
PK/SK, with overloaded GSIs: "by status" (instances by state, open operations; workers before the
layout migration), "by parent" (instances by worker; workers by pool before the migration), "by kind"
(templates, pools, stats and breakers; workers and instances before the migration), a sparse index
from EC2 instance id to worker, and the two worker indexes keyed by bucket: "by shard" (a status
split into write shards, sorted by bucket, so that a reconcile shard reads only its own workers) and
"by pool" (a pool split into write shards). docs/data-model.md has the table.
"""

from __future__ import annotations

from typing import Any, Final

PARTITION_KEY: Final = "PK"
SORT_KEY: Final = "SK"
TTL_ATTRIBUTE: Final = "expiration"

BY_STATUS: Final = "by_status"
BY_PARENT: Final = "by_parent"
BY_KIND: Final = "by_kind"
BY_EC2_INSTANCE: Final = "by_ec2_instance"
BY_SHARD: Final = "by_shard"
BY_POOL: Final = "by_pool"

GSI_KEYS: Final[dict[str, tuple[str, str | None]]] = {
    BY_STATUS: ("GSI1PK", "GSI1SK"),
    BY_PARENT: ("GSI2PK", "GSI2SK"),
    BY_KIND: ("GSI3PK", "GSI3SK"),
    BY_EC2_INSTANCE: ("ec2_instance_id", None),
    BY_SHARD: ("GSI4PK", "GSI4SK"),
    BY_POOL: ("GSI5PK", "GSI5SK"),
}
# by_ec2_instance only has to find the worker id; the worker item is then read consistently.
KEYS_ONLY_INDEXES: Final = frozenset({BY_EC2_INSTANCE})
# The worker indexes hold what their queries read (filters, placement's free slots) and nothing that
# changes with every placement but `active_instances`: DynamoDB rewrites an index entry only when a key
# or a projected attribute changes, so a placement rewrites one small entry per index, not the whole
# worker item (`version` and `updated_at` change with it too). Whatever else a reader needs it reads
# from the base table.
WORKER_SUMMARY: Final = ("id", "template", "region", "pool", "status", "capacity", "active_instances")
INCLUDE_INDEXES: Final[dict[str, tuple[str, ...]]] = {BY_SHARD: WORKER_SUMMARY, BY_POOL: WORKER_SUMMARY}


def attribute_definitions() -> list[dict[str, str]]:
    names = [PARTITION_KEY, SORT_KEY]
    for partition, sort in GSI_KEYS.values():
        names.append(partition)
        if sort:
            names.append(sort)
    return [{"AttributeName": name, "AttributeType": "S"} for name in names]


def _projection(index_name: str) -> dict[str, Any]:
    if index_name in KEYS_ONLY_INDEXES:
        return {"ProjectionType": "KEYS_ONLY"}
    if index_name in INCLUDE_INDEXES:
        return {"ProjectionType": "INCLUDE", "NonKeyAttributes": list(INCLUDE_INDEXES[index_name])}
    return {"ProjectionType": "ALL"}


def global_secondary_indexes(leave_out: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Every index of the definition, but those in `leave_out` (an upgrade adds one index per deploy,
    docs/deploy.md)."""
    unknown = leave_out - GSI_KEYS.keys()
    if unknown:
        raise ValueError(f"no such index: {', '.join(sorted(unknown))}")
    indexes: list[dict[str, Any]] = []
    for index_name, (partition, sort) in GSI_KEYS.items():
        if index_name in leave_out:
            continue
        key_schema = [{"AttributeName": partition, "KeyType": "HASH"}]
        if sort:
            key_schema.append({"AttributeName": sort, "KeyType": "RANGE"})
        indexes.append(
            {"IndexName": index_name, "KeySchema": key_schema, "Projection": _projection(index_name)}
        )
    return indexes


def attribute_definitions_for(indexes: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The attribute definitions a table with exactly these indexes declares (CloudFormation refuses
    a definition that no key uses)."""
    used = {PARTITION_KEY, SORT_KEY}
    for index in indexes:
        used |= {key["AttributeName"] for key in index["KeySchema"]}
    return [d for d in attribute_definitions() if d["AttributeName"] in used]


def create_table_request(table_name: str) -> dict[str, Any]:
    """Arguments for DynamoDB CreateTable, on-demand billing."""
    if len(table_name) < 3:
        raise ValueError(f"table_name: '{table_name}' is shorter than DynamoDB's 3-character minimum")
    return {
        "TableName": table_name,
        "BillingMode": "PAY_PER_REQUEST",
        "AttributeDefinitions": attribute_definitions(),
        "KeySchema": [
            {"AttributeName": PARTITION_KEY, "KeyType": "HASH"},
            {"AttributeName": SORT_KEY, "KeyType": "RANGE"},
        ],
        "GlobalSecondaryIndexes": global_secondary_indexes(),
    }
