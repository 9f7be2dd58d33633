"""The scale-down ledger (fleetkeeper.domain.scale_down_ledger): one item, PK `LEDGER#scale-down`, SK
`LEDGER`, replaced whole under a condition on the version it was read at, so that concurrent reconcile
cycles take turns: the loser gets `StaleWrite` and reads again."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.scale_down_ledger import InFlight, ScaleDownLedger
from fleetkeeper.store.codec import load_record, record_attributes, serialize
from fleetkeeper.store.table import put_next_version

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

LEDGER_KEY = {"PK": "LEDGER#scale-down", "SK": "LEDGER"}


class LedgerStore:
    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self.table_name = table_name

    def read(self) -> ScaleDownLedger:
        """The ledger as last written (an empty one at version 0 before the first write)."""
        response = with_backoff(
            lambda: self._client.get_item(
                TableName=self.table_name, Key=serialize(LEDGER_KEY), ConsistentRead=True
            ),
            name="GetItem",
        )
        item = response.get("Item")
        if not item:
            return ScaleDownLedger()
        return load_record(ScaleDownLedger, item)

    def save(self, current: ScaleDownLedger, entries: list[InFlight]) -> ScaleDownLedger:
        """Write `entries` as the next version of `current`; StaleWrite when another cycle wrote first."""
        stored = ScaleDownLedger(version=current.version + 1, entries=entries)
        put_next_version(
            self._client,
            self.table_name,
            {**LEDGER_KEY, **record_attributes(stored)},
            expected_version=current.version,
            stale=lambda: StaleWrite(
                "scale-down-ledger", "scale-down", None, "another reconcile cycle wrote the ledger first"
            ),
        )
        return stored
