"""Pool members and scale-out state.

Members: per pool, one item `PK = MEMBERS#<pool>`, `SK = COUNT`, with `members`: the pool's workers in
every status but TERMINATED and FAILED (domain/capacity.member_moves). It changes only in the
transaction that creates a worker or moves its status (store/workers.py), by +1 or -1, so it is exact
whatever the concurrency. A creation under a cap carries the condition `members < max_workers`: two
cycles (or shards) racing to the cap cannot both commit the last place; the second is refused
(PoolFull). The same item counts the pool's bookings waiting for capacity (`bookings_waiting`): +1 by
the transaction that books one, under the condition that the pool still has room for it (a booking
refused there is a 409, never an overbooking), and -1 by the one that places, fails or ends it, whose
condition on the booking's own state makes that happen once.

State: one small item per pool, `PK = CAPACITY#<pool>`, `SK = STATE` (domain/capacity.CapacityState),
replaced whole under a condition on the version it was read at.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.capacity import CapacityState
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.store.codec import load_record, record_attributes, serialize, serialize_value
from fleetkeeper.store.table import put_next_version

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

MEMBERS = "members"
BOOKINGS_WAITING = "bookings_waiting"
# Writers of one pool's state take turns; past this many, the write is left out (the next cycle writes).
STATE_ATTEMPTS = 5


def members_key(pool: str) -> dict[str, str]:
    return {"PK": f"MEMBERS#{pool}", "SK": "COUNT"}


def state_key(pool: str) -> dict[str, str]:
    return {"PK": f"CAPACITY#{pool}", "SK": "STATE"}


def member_updates(
    table_name: str, moves: Mapping[str, int], *, below: int | None = None
) -> list[dict[str, Any]]:
    """The transaction items that add `moves` (pool -> +1 or -1) to the pools' member counts; a pool
    joined under `below` only while it has fewer members than that."""
    items: list[dict[str, Any]] = []
    for pool, delta in sorted(moves.items()):
        update: dict[str, Any] = {
            "TableName": table_name,
            "Key": serialize(members_key(pool)),
            "UpdateExpression": "ADD #m :d",
            "ExpressionAttributeNames": {"#m": MEMBERS},
            "ExpressionAttributeValues": {":d": serialize_value(delta)},
        }
        if below is not None and delta > 0:
            update["ConditionExpression"] = "attribute_not_exists(#m) OR #m < :below"
            update["ExpressionAttributeValues"][":below"] = serialize_value(below)
        items.append({"Update": update})
    return items


def bookings_update(table_name: str, pool: str, delta: int, *, below: int | None = None) -> dict[str, Any]:
    """The transaction item that adds `delta` to the pool's waiting bookings; with `below`, only while
    fewer than that wait."""
    update: dict[str, Any] = {
        "TableName": table_name,
        "Key": serialize(members_key(pool)),
        "UpdateExpression": "ADD #b :d",
        "ExpressionAttributeNames": {"#b": BOOKINGS_WAITING},
        "ExpressionAttributeValues": {":d": serialize_value(delta)},
    }
    if below is not None:
        update["ConditionExpression"] = "attribute_not_exists(#b) OR #b < :below"
        update["ExpressionAttributeValues"][":below"] = serialize_value(below)
    return {"Update": update}


class CapacityStore:
    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self.table_name = table_name

    def members(self, pool: str) -> int:
        """The pool's member count, strongly consistent."""
        return int(self._get(members_key(pool)).get(MEMBERS, {}).get("N", 0))

    def bookings_waiting(self, pool: str) -> int:
        """The pool's bookings waiting for capacity, strongly consistent."""
        return int(self._get(members_key(pool)).get(BOOKINGS_WAITING, {}).get("N", 0))

    def state(self, pool: str) -> CapacityState:
        item = self._get(state_key(pool))
        return load_record(CapacityState, item) if item else CapacityState()

    def update_state(
        self, pool: str, change: Callable[[CapacityState], CapacityState]
    ) -> CapacityState | None:
        """Write `change` of the pool's current state; None when other writers kept winning."""
        for _ in range(STATE_ATTEMPTS):
            current = self.state(pool)
            wanted = change(current)
            if wanted == current:
                return current
            stored = wanted.model_copy(update={"version": current.version + 1})
            try:
                put_next_version(
                    self._client,
                    self.table_name,
                    {**state_key(pool), **record_attributes(stored)},
                    expected_version=current.version,
                    stale=lambda: StaleWrite("capacity", pool, None, "another cycle wrote first"),
                )
            except StaleWrite:
                continue
            return stored
        return None

    def _get(self, key: Mapping[str, str]) -> dict[str, Any]:
        response = with_backoff(
            lambda: self._client.get_item(TableName=self.table_name, Key=serialize(key), ConsistentRead=True),
            name="GetItem",
        )
        return dict(response.get("Item") or {})
