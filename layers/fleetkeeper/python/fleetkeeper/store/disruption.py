"""The disruption counts and what waits on a pool's budgets.

Counts (domain/admission.py): per pool, one item `PK = DISRUPTING#<pool>` (`-` for workers without one),
`SK = COUNT`, with `in_use` (the pool's workers with a counted owner) and `in_use#<template>` (the same
per template); fleet-wide, `PK = DISRUPTING`, `SK = FLEET`, with `in_use`. They change only in the
transaction that changes a worker's owner (store/workers.py), by +1 or -1, so they are exact whatever the
concurrency. The write that admits a disruption carries the door's claim as the conditions of these
updates: the budget's bound on `in_use`, the template's count as read. Two admissions that would pass a
budget together cannot both commit: the second fails its condition and the door decides again.

Waiting (domain/disruption.Waiting): one small item per pool, `PK = WAITING#<pool>`, `SK = WAITING`,
replaced whole under a condition on the version it was read at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.admission import Claim
from fleetkeeper.domain.disruption import Waiting, WaitingList, with_refusals
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.lifecycle import PoolStatus
from fleetkeeper.store import keys
from fleetkeeper.store.codec import deserialize, load_record, record_attributes, serialize, serialize_value
from fleetkeeper.store.table import put_next_version

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# Concurrent cycles adding to one pool's list take turns; past this many, the refusals are left out
# (they are a diagnosis, and the next cycle records them again).
WAITING_ATTEMPTS = 5
IN_USE = "in_use"
FLEET_KEY = {"PK": "DISRUPTING", "SK": "FLEET"}


def counts_key(pool: str | None) -> dict[str, str]:
    return {"PK": f"DISRUPTING#{pool or '-'}", "SK": "COUNT"}


def template_attribute(template: str) -> str:
    return f"{IN_USE}#{template}"


class BudgetTaken(StaleWrite):
    """The write that admitted a disruption found the budget's room (or the template's count) taken by
    another admission since the door read it: the door reads again and decides again."""

    def __init__(self, pool: str | None) -> None:
        super().__init__("disruption", pool or "-", None, "another disruption took the room first")


class PoolMoved(StaleWrite):
    """The pool changed (its status or its budgets) since the door read it."""

    def __init__(self, pool: str) -> None:
        super().__init__("pool", pool, None, f"pool {pool} changed since it was read")


@dataclass(frozen=True)
class DisruptionCounts:
    """A pool's counted owners, in all and per template, and the fleet's."""

    in_use: int = 0
    by_template: dict[str, int] = field(default_factory=dict)
    fleet: int = 0


def read_counts(client: DynamoDBClient, table_name: str, pool: str | None) -> DisruptionCounts:
    """The pool's counts and the fleet's, strongly consistent, in one BatchGetItem."""
    wanted = [counts_key(pool), FLEET_KEY]
    response = with_backoff(
        lambda: client.batch_get_item(
            RequestItems={table_name: {"Keys": [serialize(k) for k in wanted], "ConsistentRead": True}}
        ),
        name="BatchGetItem",
    )
    found = {
        (str(item["PK"]["S"]), str(item["SK"]["S"])): deserialize(item)
        for item in response["Responses"].get(table_name, [])
    }
    pool_item = found.get((counts_key(pool)["PK"], "COUNT"), {})
    fleet_item = found.get((FLEET_KEY["PK"], FLEET_KEY["SK"]), {})
    prefix = IN_USE + "#"
    return DisruptionCounts(
        in_use=int(pool_item.get(IN_USE, 0)),
        by_template={
            name.removeprefix(prefix): int(value)
            for name, value in pool_item.items()
            if name.startswith(prefix) and value
        },
        fleet=int(fleet_item.get(IN_USE, 0)),
    )


def count_updates(
    table_name: str, pool: str | None, template: str, delta: int, claim: Claim | None
) -> list[dict[str, Any]]:
    """The transaction items that move a worker's counted ownership by `delta` (+1 or -1): its pool's
    item and the fleet's, each conditioned on `claim` when it admits, and the pool's status and version
    checked. Nothing when `delta` is 0."""
    if not delta:
        return []
    admitting = claim if delta > 0 else None
    names = {"#n": IN_USE, "#t": template_attribute(template)}
    values: dict[str, Any] = {":d": serialize_value(delta)}
    conditions: list[str] = []
    if admitting is not None and admitting.pool_below is not None:
        values[":below"] = serialize_value(admitting.pool_below)
        conditions.append("(attribute_not_exists(#n) OR #n < :below)")
    if admitting is not None and admitting.template_owned is not None:
        values[":owned"] = serialize_value(admitting.template_owned)
        conditions.append(
            "(attribute_not_exists(#t) OR #t = :owned)" if admitting.template_owned == 0 else "#t = :owned"
        )
    pool_update: dict[str, Any] = {
        "TableName": table_name,
        "Key": serialize(counts_key(pool)),
        "UpdateExpression": "ADD #n :d, #t :d",
        "ExpressionAttributeNames": names,
        "ExpressionAttributeValues": values,
    }
    if conditions:
        pool_update["ConditionExpression"] = " AND ".join(conditions)
    fleet_update: dict[str, Any] = {
        "TableName": table_name,
        "Key": serialize(FLEET_KEY),
        "UpdateExpression": "ADD #n :d",
        "ExpressionAttributeNames": {"#n": IN_USE},
        "ExpressionAttributeValues": {":d": serialize_value(delta)},
    }
    if admitting is not None and admitting.fleet_below is not None:
        fleet_update["ConditionExpression"] = "attribute_not_exists(#n) OR #n < :below"
        fleet_update["ExpressionAttributeValues"][":below"] = serialize_value(admitting.fleet_below)
    items: list[dict[str, Any]] = [{"Update": pool_update}, {"Update": fleet_update}]
    if admitting is not None and admitting.pool is not None and admitting.pool_version is not None:
        items.append(
            {
                "ConditionCheck": {
                    "TableName": table_name,
                    "Key": serialize(keys.pool_key(admitting.pool)),
                    "ConditionExpression": "#s = :active AND #v = :v",
                    "ExpressionAttributeNames": {"#s": "status", "#v": "version"},
                    "ExpressionAttributeValues": {
                        ":active": serialize_value(str(PoolStatus.ACTIVE)),
                        ":v": serialize_value(admitting.pool_version),
                    },
                }
            }
        )
    return items


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
