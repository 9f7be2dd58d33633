"""Operational counters and a run lease, one small item each, beside the entities in the one table.

Every call goes through `cloud/retry.with_backoff` (the conditional writes through
`store.table.conditional_write`), the one retry layer of the DynamoDB client.

Counters are added atomically (UpdateItem ADD), so concurrent Lambdas never lose an increment, and a
whole cycle's counters cost one write. Items: PK `STATS#<scope>` / SK `STATS`, listed through
by_kind (`KIND#STATS`); the lease is PK `LEASE#<name>` / SK `LEASE`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.store import keys
from fleetkeeper.store.codec import deserialize
from fleetkeeper.store.schema import BY_KIND
from fleetkeeper.store.table import conditional_write

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

_COUNTER = "c_"
_GAUGE = "g_"
_TIME = "t_"
_NOTE = "n_"


def stats_key(scope: str) -> dict[str, dict[str, str]]:
    return {"PK": {"S": f"STATS#{scope}"}, "SK": {"S": "STATS"}}


def lease_key(name: str) -> dict[str, dict[str, str]]:
    return {"PK": {"S": f"LEASE#{name}"}, "SK": {"S": "LEASE"}}


@dataclass(frozen=True)
class ScopeStats:
    """One scope's figures: running totals, last-cycle values, named timestamps (UTC ISO strings) and
    last-cycle notes (small maps of words, e.g. the pools whose repair brake held)."""

    scope: str
    counters: dict[str, int] = field(default_factory=dict)
    gauges: dict[str, int] = field(default_factory=dict)
    timestamps: dict[str, str] = field(default_factory=dict)
    notes: dict[str, dict[str, str]] = field(default_factory=dict)


def _from_item(item: Mapping[str, Any]) -> ScopeStats:
    plain = deserialize(item)
    scope = str(plain.get("scope", str(plain.get("PK", "")).removeprefix("STATS#")))
    stats = ScopeStats(scope=scope)
    for name, value in plain.items():
        if name.startswith(_COUNTER):
            stats.counters[name.removeprefix(_COUNTER)] = int(value)
        elif name.startswith(_GAUGE):
            stats.gauges[name.removeprefix(_GAUGE)] = int(value)
        elif name.startswith(_TIME):
            stats.timestamps[name.removeprefix(_TIME)] = str(value)
        elif name.startswith(_NOTE) and isinstance(value, Mapping):
            stats.notes[name.removeprefix(_NOTE)] = {str(k): str(v) for k, v in value.items()}
    return stats


class StatsStore:
    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self.table_name = table_name

    def record(
        self,
        scope: str,
        *,
        counters: Mapping[str, int] | None = None,
        gauges: Mapping[str, int] | None = None,
        timestamps: Mapping[str, datetime] | None = None,
        notes: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Add counters, set gauges, timestamps and notes (each replaced whole) of one scope in a single
        atomic write."""
        names: dict[str, str] = {"#scope": "scope", "#k": "GSI3PK", "#ks": "GSI3SK"}
        values: dict[str, Any] = {
            ":scope": {"S": scope},
            ":k": {"S": keys.kind_partition("STATS")},
        }
        sets = ["#scope = :scope", "#k = :k", "#ks = :scope"]
        adds: list[str] = []
        for index, (name, amount) in enumerate(sorted((counters or {}).items())):
            if amount:
                names[f"#c{index}"] = f"{_COUNTER}{name}"
                values[f":c{index}"] = {"N": str(int(amount))}
                adds.append(f"#c{index} :c{index}")
        for index, (name, value) in enumerate(sorted((gauges or {}).items())):
            names[f"#g{index}"] = f"{_GAUGE}{name}"
            values[f":g{index}"] = {"N": str(int(value))}
            sets.append(f"#g{index} = :g{index}")
        for index, (name, at) in enumerate(sorted((timestamps or {}).items())):
            names[f"#t{index}"] = f"{_TIME}{name}"
            values[f":t{index}"] = {"S": at.isoformat()}
            sets.append(f"#t{index} = :t{index}")
        for index, (name, note) in enumerate(sorted((notes or {}).items())):
            names[f"#n{index}"] = f"{_NOTE}{name}"
            values[f":n{index}"] = {"M": {key: {"S": text} for key, text in note.items()}}
            sets.append(f"#n{index} = :n{index}")
        expression = "SET " + ", ".join(sets)
        if adds:
            expression += " ADD " + ", ".join(adds)
        with_backoff(
            lambda: self._client.update_item(
                TableName=self.table_name,
                Key=stats_key(scope),
                UpdateExpression=expression,
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
            ),
            name="UpdateItem",
        )

    def claim_timestamp(self, scope: str, name: str, *, now: datetime, free_before: datetime) -> bool:
        """Set the scope's timestamp `name` to `now` if it is unset or before `free_before`; False when
        someone set it since then. The condition makes a once-per-interval decision exact across
        concurrent writers (the reconcile shards' scale-down cooldown). A claim whose answer was lost
        reads as not claimed: the interval is skipped, never spent twice."""
        attribute = f"{_TIME}{name}"
        refused = conditional_write(
            lambda: self._client.update_item(
                TableName=self.table_name,
                Key=stats_key(scope),
                UpdateExpression="SET #t = :now, #scope = :scope, #k = :k, #ks = :scope",
                ConditionExpression="attribute_not_exists(#t) OR #t < :free_before",
                ExpressionAttributeNames={
                    "#t": attribute,
                    "#scope": "scope",
                    "#k": "GSI3PK",
                    "#ks": "GSI3SK",
                },
                ExpressionAttributeValues={
                    ":now": {"S": now.isoformat()},
                    ":free_before": {"S": free_before.isoformat()},
                    ":scope": {"S": scope},
                    ":k": {"S": keys.kind_partition("STATS")},
                },
            ),
            name="UpdateItem",
        )
        return refused is None

    def read(self, scope: str) -> ScopeStats:
        """One scope's figures; an unknown scope reads as all zero."""
        response = with_backoff(
            lambda: self._client.get_item(
                TableName=self.table_name, Key=stats_key(scope), ConsistentRead=True
            ),
            name="GetItem",
        )
        item = response.get("Item")
        return _from_item(item) if item else ScopeStats(scope=scope)

    def read_all(self) -> dict[str, ScopeStats]:
        """Every scope that has recorded anything, by scope name."""
        found: dict[str, ScopeStats] = {}
        start: Any = None
        while True:
            request: dict[str, Any] = {
                "TableName": self.table_name,
                "IndexName": BY_KIND,
                "KeyConditionExpression": "GSI3PK = :k",
                "ExpressionAttributeValues": {":k": {"S": keys.kind_partition("STATS")}},
            }
            if start:
                request["ExclusiveStartKey"] = start
            response = with_backoff(lambda request=request: self._client.query(**request), name="Query")  # type: ignore[misc]
            for item in response.get("Items", []):
                stats = _from_item(item)
                found[stats.scope] = stats
            start = response.get("LastEvaluatedKey")
            if not start:
                return found

    def counters_by_scope(self) -> dict[str, dict[str, int | float | str]]:
        """Every scope's figures flattened for GET /api/v1/stats: counters and gauges by name,
        timestamps as ISO strings; e.g. {"reconcile": {"provisioned_count": 3, "last_run_at": "..."}}."""
        flat: dict[str, dict[str, int | float | str]] = {}
        for scope, stats in sorted(self.read_all().items()):
            flat[scope] = {**stats.counters, **stats.gauges, **stats.timestamps}
        return flat

    # ---- lease -------------------------------------------------------------------------------

    def acquire_lease(self, name: str, owner: str, *, now: datetime, until: datetime) -> bool:
        """Take the named lease until `until`, unless another owner holds an unexpired one. A retry after
        a lost answer takes it again: the condition lets its owner in."""
        refused = conditional_write(
            lambda: self._client.put_item(
                TableName=self.table_name,
                Item={
                    **lease_key(name),
                    "owner": {"S": owner},
                    "acquired_at": {"S": now.isoformat()},
                    "expires_at": {"S": until.isoformat()},
                },
                ConditionExpression="attribute_not_exists(PK) OR expires_at < :now OR #o = :owner",
                ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={":now": {"S": now.isoformat()}, ":owner": {"S": owner}},
            ),
            name="PutItem",
        )
        return refused is None

    def release_lease(self, name: str, owner: str, *, now: datetime) -> None:
        """Give the lease back (let it expire now), if this owner still holds it; another owner's lease
        (ours expired and was taken) is left alone."""
        conditional_write(
            lambda: self._client.update_item(
                TableName=self.table_name,
                Key=lease_key(name),
                UpdateExpression="SET expires_at = :now",
                ConditionExpression="#o = :owner",
                ExpressionAttributeNames={"#o": "owner"},
                ExpressionAttributeValues={":owner": {"S": owner}, ":now": {"S": now.isoformat()}},
            ),
            name="UpdateItem",
        )
