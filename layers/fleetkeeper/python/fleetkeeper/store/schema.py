"""The one table definition. CDK, the local stack and the tests all build the table from here.

Single-table layout: workers, templates, pools, instances and audit events share one table, keyed by
PK/SK, with overloaded GSIs for "by status", "by parent" (instances by worker, workers by pool) and
"by kind" (listings), and a sparse index from EC2 instance id to worker. docs/data-model.md has the table.
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

GSI_KEYS: Final[dict[str, tuple[str, str | None]]] = {
    BY_STATUS: ("GSI1PK", "GSI1SK"),
    BY_PARENT: ("GSI2PK", "GSI2SK"),
    BY_KIND: ("GSI3PK", "GSI3SK"),
    BY_EC2_INSTANCE: ("ec2_instance_id", None),
}
# by_ec2_instance only has to find the worker id; the worker item is then read consistently.
KEYS_ONLY_INDEXES: Final = frozenset({BY_EC2_INSTANCE})


def attribute_definitions() -> list[dict[str, str]]:
    names = [PARTITION_KEY, SORT_KEY]
    for partition, sort in GSI_KEYS.values():
        names.append(partition)
        if sort:
            names.append(sort)
    return [{"AttributeName": name, "AttributeType": "S"} for name in names]


def global_secondary_indexes() -> list[dict[str, Any]]:
    indexes: list[dict[str, Any]] = []
    for index_name, (partition, sort) in GSI_KEYS.items():
        key_schema = [{"AttributeName": partition, "KeyType": "HASH"}]
        if sort:
            key_schema.append({"AttributeName": sort, "KeyType": "RANGE"})
        projection = "KEYS_ONLY" if index_name in KEYS_ONLY_INDEXES else "ALL"
        indexes.append(
            {"IndexName": index_name, "KeySchema": key_schema, "Projection": {"ProjectionType": projection}}
        )
    return indexes


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
