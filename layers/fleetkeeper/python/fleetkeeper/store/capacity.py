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

Recount: workers that joined a pool before member counts existed (or were counted by the layout
migration) are in the exact per-scope counters (store/counters.py) but not in the member count. Every
worker transaction moves both by the same amount, so their difference is constant between recounts:
`recount_members` reads it from one consistent snapshot (TransactGetItems of the member item and the
pool's counter items) and adds it back in one conditional write, exact whatever else writes meanwhile.

State: one small item per pool, `PK = CAPACITY#<pool>`, `SK = STATE` (domain/capacity.CapacityState),
replaced whole under a condition on the version it was read at.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.capacity import NOT_MEMBERS, CapacityState
from fleetkeeper.domain.disruption import pool_of_scope
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.store.codec import deserialize, load_record, record_attributes, serialize, serialize_value
from fleetkeeper.store.counters import counter_keys, member_total
from fleetkeeper.store.table import put_next_version

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

MEMBERS = "members"
# How many recounts the member item has taken: two recounters of one snapshot cannot both add.
RECOUNTS = "recounts"
# A TransactGetItems holds 100 items: the member item and up to this many counter items.
MAX_RECOUNT_ITEMS = 99
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


@dataclass(frozen=True)
class MemberCounts:
    """A pool's member item: its members and its bookings waiting for capacity."""

    members: int
    bookings_waiting: int


class CapacityStore:
    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self.table_name = table_name

    def member_counts(self, pool: str) -> MemberCounts:
        """Both counts of the pool's member item, in one strongly consistent read."""
        item = self._get(members_key(pool))
        return MemberCounts(
            members=int(item.get(MEMBERS, {}).get("N", 0)),
            bookings_waiting=int(item.get(BOOKINGS_WAITING, {}).get("N", 0)),
        )

    def members(self, pool: str) -> int:
        """The pool's member count, strongly consistent."""
        return self.member_counts(pool).members

    def bookings_waiting(self, pool: str) -> int:
        """The pool's bookings waiting for capacity, strongly consistent."""
        return self.member_counts(pool).bookings_waiting

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

    def recount_members(self, pool: str) -> int | None:
        """Make the pool's member count what its counters say: the correction added (0: it was
        right), or None when it could not be made exactly now (another recount or a new counter item
        came between; more counter items than one snapshot holds)."""
        keys = counter_keys(self._client, self.table_name, lambda scope: pool_of_scope(scope) == pool)
        if len(keys) > MAX_RECOUNT_ITEMS:
            return None
        member_key = serialize(members_key(pool))
        response = with_backoff(
            lambda: self._client.transact_get_items(
                TransactItems=[
                    {"Get": {"TableName": self.table_name, "Key": key}} for key in [member_key, *keys]
                ]
            ),
            name="TransactGetItems",
        )
        got = [deserialize(r["Item"]) if r.get("Item") else {} for r in response["Responses"]]
        members, recounts = int(got[0].get(MEMBERS, 0)), int(got[0].get(RECOUNTS, 0))
        correction = member_total(got[1:], NOT_MEMBERS) - members
        # Counter items are never deleted: the same keys now means none was missing from the snapshot.
        again = counter_keys(self._client, self.table_name, lambda scope: pool_of_scope(scope) == pool)
        if len(again) != len(keys):
            return None
        if correction == 0:
            return 0
        condition = "#r = :g" if recounts else "attribute_not_exists(#r)"
        values = {":d": serialize_value(correction), ":one": serialize_value(1)}
        if recounts:
            values[":g"] = serialize_value(recounts)
        try:
            with_backoff(
                lambda: self._client.update_item(
                    TableName=self.table_name,
                    Key=member_key,
                    UpdateExpression="ADD #m :d, #r :one",
                    ConditionExpression=condition,
                    ExpressionAttributeNames={"#m": MEMBERS, "#r": RECOUNTS},
                    ExpressionAttributeValues=values,
                ),
                name="UpdateItem",
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return None
            raise
        return correction

    def _get(self, key: Mapping[str, str]) -> dict[str, Any]:
        response = with_backoff(
            lambda: self._client.get_item(TableName=self.table_name, Key=serialize(key), ConsistentRead=True),
            name="GetItem",
        )
        return dict(response.get("Item") or {})
