"""What waits on a pool's disruption budgets (domain/disruption.Waiting): one small item per pool,
PK `WAITING#<pool>`, SK `WAITING`, replaced whole under a condition on the version it was read at."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.disruption import Waiting, WaitingList, with_refusals
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.store.codec import load_record, record_attributes, serialize
from fleetkeeper.store.table import put_next_version

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# Concurrent cycles adding to one pool's list take turns; past this many, the refusals are left out
# (they are a diagnosis, and the next cycle records them again).
WAITING_ATTEMPTS = 5


def waiting_key(pool: str) -> dict[str, str]:
    return {"PK": f"WAITING#{pool}", "SK": "WAITING"}


class WaitingStore:
    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self.table_name = table_name

    def read(self, pool: str) -> WaitingList:
        response = with_backoff(
            lambda: self._client.get_item(
                TableName=self.table_name, Key=serialize(waiting_key(pool)), ConsistentRead=True
            ),
            name="GetItem",
        )
        item = response.get("Item")
        return load_record(WaitingList, item) if item else WaitingList()

    def add(self, pool: str, refusals: Sequence[Waiting], now: datetime) -> bool:
        """Add refusals to the pool's list; False when other writers kept winning (nothing written)."""
        for _ in range(WAITING_ATTEMPTS):
            current = self.read(pool)
            stored = WaitingList(
                version=current.version + 1, entries=with_refusals(current.entries, refusals, now)
            )
            try:
                put_next_version(
                    self._client,
                    self.table_name,
                    {**waiting_key(pool), **record_attributes(stored)},
                    expected_version=current.version,
                    stale=lambda: StaleWrite("disruption-waiting", pool, None, "another cycle wrote first"),
                )
            except StaleWrite:
                continue
            return True
        return False
