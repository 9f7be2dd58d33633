"""Orphan GC's circuit breaker, one small item per region: PK `BREAKER#orphan-gc#<region>`, SK `BREAKER`,
listed through by_kind (`KIND#BREAKER`).

Every write is conditional on the version it read, so a discovery pass and an operator's confirmation
never overwrite each other unseen: the loser gets `StaleWrite` and reads again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.orphan_breaker import OrphanBreaker
from fleetkeeper.store import keys
from fleetkeeper.store.codec import load_record, record_attributes, serialize
from fleetkeeper.store.schema import BY_KIND
from fleetkeeper.store.table import put_next_version

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient


def breaker_key(region: str) -> dict[str, str]:
    return {"PK": f"BREAKER#orphan-gc#{region}", "SK": "BREAKER"}


class BreakerStore:
    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self.table_name = table_name

    def read(self, region: str) -> OrphanBreaker | None:
        response = with_backoff(
            lambda: self._client.get_item(
                TableName=self.table_name, Key=serialize(breaker_key(region)), ConsistentRead=True
            ),
            name="GetItem",
        )
        item = response.get("Item")
        return load_record(OrphanBreaker, item) if item else None

    def list_all(self) -> list[OrphanBreaker]:
        """Every region's breaker, by region."""
        found: list[OrphanBreaker] = []
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": BY_KIND,
            "KeyConditionExpression": "GSI3PK = :k",
            "ExpressionAttributeValues": {":k": {"S": keys.kind_partition("BREAKER")}},
        }
        while True:
            response = with_backoff(lambda: self._client.query(**request), name="Query")
            found.extend(load_record(OrphanBreaker, item) for item in response.get("Items", []))
            start = response.get("LastEvaluatedKey")
            if not start:
                return sorted(found, key=lambda b: b.region)
            request["ExclusiveStartKey"] = start

    def save(self, current: OrphanBreaker | None, updated: OrphanBreaker) -> OrphanBreaker:
        """Write `updated` as the next version of `current` (None: the item must not exist yet)."""
        expected = current.version if current is not None else 0
        stored = updated.model_copy(update={"version": expected + 1})
        item = {
            **breaker_key(stored.region),
            **record_attributes(stored),
            "GSI3PK": keys.kind_partition("BREAKER"),
            "GSI3SK": stored.region,
        }
        put_next_version(
            self._client,
            self.table_name,
            item,
            expected_version=expected,
            stale=lambda: StaleWrite(
                "orphan-gc-breaker",
                stored.region,
                None,
                f"the orphan GC breaker of {stored.region} changed concurrently; read it again",
            ),
        )
        return stored
