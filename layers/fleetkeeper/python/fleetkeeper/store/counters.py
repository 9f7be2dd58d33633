"""Exact worker counts per scope and status, kept by the same transactions that change a worker.

Every worker item names the cell it is counted in (`counted_as`, `<status>@<scope>`, see store/keys.py).
A write that moves a worker to another cell carries, in the same TransactWriteItems, the condition that
the item is still counted where the writer read it and the counter updates that move it: -1 on the old
cell, +1 on the new. Either all of it commits or none of it does, so a count is exact whatever the
concurrency; a lost answer or a cancelled transaction (TransactionConflict, throttling) changes nothing,
and the retry's version condition keeps a committed write from counting twice.

A cell also says whether the worker is unhealthy (store/keys.counted_cell): a health change moves the
worker to its status's other cell in the same way, so each status's unhealthy workers are counted
exactly beside all of them (`u_<status>` beside `n_<status>`), and the repair brake reads them here
instead of through a lagging index. A worker recorded unhealthy before cells said so is counted among
them by its next write (its item names the cell it was counted in, and the write moves it from there),
or by the one walk of its pool that precedes the brake's first read of it (store/workers.count_health).

Where the counts live: a scope's counts are split into COUNTER_ITEMS items (the worker's bucket picks
one), spread over COUNTER_PARTITIONS partition keys, `PK = COUNTS#<p>`, `SK = <scope>#<item>`, one
number attribute per status. Splitting keeps concurrent transitions of one scope from conflicting on
one item, and the write rate of a partition key at a small share of the fleet's transitions (each
counter update is 2 write units, transactional): under 1,000 write units a second up to about 4,000
status changes a second fleet-wide, far above what EC2's own rate limits let the fleet change. Reading
the counts is one strongly consistent Query per partition key.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.sharding import bucket_of
from fleetkeeper.store.codec import deserialize
from fleetkeeper.store.keys import COUNTER_ITEMS, COUNTER_PARTITIONS, UNHEALTHY_MARK

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# The worker attribute naming the cell it is counted in; absent on items not counted yet.
COUNTED_AS = "counted_as"
_STATUS_PREFIX = "n_"
_UNHEALTHY_PREFIX = "u_"


def status_attribute(status: WorkerStatus) -> str:
    """The counter item attribute that holds a status's count."""
    return _STATUS_PREFIX + status


def unhealthy_attribute(status: WorkerStatus) -> str:
    """The counter item attribute that holds how many of a status's workers are unhealthy."""
    return _UNHEALTHY_PREFIX + status


def split_cell(cell: str) -> tuple[str, WorkerStatus, bool]:
    """`RUNNING@lab#-` as (scope, status, unhealthy); `RUNNING!@lab#-` for an unhealthy worker."""
    status, _, scope = cell.partition("@")
    return scope, WorkerStatus(status.removesuffix(UNHEALTHY_MARK)), status.endswith(UNHEALTHY_MARK)


def counter_key(scope: str, worker_id: str) -> dict[str, dict[str, str]]:
    item = bucket_of(worker_id) % COUNTER_ITEMS
    return {"PK": {"S": f"COUNTS#{item % COUNTER_PARTITIONS}"}, "SK": {"S": f"{scope}#{item:02d}"}}


def counter_updates(table_name: str, worker_id: str, moves: Mapping[str, int]) -> list[dict[str, Any]]:
    """The transaction items that add `moves` (cell -> +1 or -1) to the worker's counter items."""
    by_scope: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for cell, delta in moves.items():
        scope, status, unhealthy = split_cell(cell)
        by_scope[scope][status_attribute(status)] += delta
        if unhealthy:
            by_scope[scope][unhealthy_attribute(status)] += delta
    items: list[dict[str, Any]] = []
    for scope, deltas in sorted(by_scope.items()):
        changes = {attribute: delta for attribute, delta in deltas.items() if delta}
        if not changes:
            continue
        names = {"#scope": "scope"}
        values: dict[str, Any] = {":scope": {"S": scope}}
        adds = []
        for n, (attribute, delta) in enumerate(sorted(changes.items())):
            names[f"#c{n}"] = attribute
            values[f":c{n}"] = {"N": str(delta)}
            adds.append(f"#c{n} :c{n}")
        items.append(
            {
                "Update": {
                    "TableName": table_name,
                    "Key": counter_key(scope, worker_id),
                    "UpdateExpression": "SET #scope = :scope ADD " + ", ".join(adds),
                    "ExpressionAttributeNames": names,
                    "ExpressionAttributeValues": values,
                }
            }
        )
    return items


def moves(counted_as: str | None, cell: str) -> dict[str, int]:
    """The counter moves that take a worker counted in `counted_as` (None: not counted) to `cell`."""
    if counted_as == cell:
        return {}
    changes = {cell: 1}
    if counted_as is not None:
        changes[counted_as] = -1
    return changes


def member_total(items: list[dict[str, Any]], not_members: frozenset[WorkerStatus]) -> int:
    """The workers counter items (plain, deserialized) count in every status but `not_members`."""
    total = 0
    for item in items:
        for name, value in item.items():
            if (
                name.startswith(_STATUS_PREFIX)
                and WorkerStatus(name.removeprefix(_STATUS_PREFIX)) not in not_members
            ):
                total += int(value)
    return total


def _counter_items(client: DynamoDBClient, table_name: str, **projection: Any) -> Iterator[dict[str, Any]]:
    """Every counter item, strongly consistent: one paged Query per counter partition key."""
    for partition in range(COUNTER_PARTITIONS):
        start: dict[str, Any] | None = None
        while True:
            extra = {"ExclusiveStartKey": start} if start else {}
            response = with_backoff(
                lambda extra=extra, partition=partition: client.query(  # type: ignore[misc]
                    TableName=table_name,
                    KeyConditionExpression="PK = :pk",
                    ExpressionAttributeValues={":pk": {"S": f"COUNTS#{partition}"}},
                    ConsistentRead=True,
                    **projection,
                    **extra,
                ),
                name="Query",
            )
            yield from response.get("Items", [])
            start = response.get("LastEvaluatedKey")
            if not start:
                break


def counter_keys(
    client: DynamoDBClient, table_name: str, keep: Callable[[str], bool]
) -> list[dict[str, Any]]:
    """The keys of the counter items whose scope `keep` wants: one Query per counter partition key."""
    found = _counter_items(
        client,
        table_name,
        ProjectionExpression="PK, SK, #scope",
        ExpressionAttributeNames={"#scope": "scope"},
    )
    return [
        {"PK": item["PK"], "SK": item["SK"]}
        for item in found
        if keep(str(item.get("scope", {}).get("S", "")))
    ]


def read_counts(client: DynamoDBClient, table_name: str) -> FleetCounts:
    """Every cell's count, and its unhealthy workers', strongly consistent: one Query per counter
    partition key."""
    counted: dict[str, dict[tuple[str, WorkerStatus], int]] = {
        _STATUS_PREFIX: defaultdict(int),
        _UNHEALTHY_PREFIX: defaultdict(int),
    }
    for item in _counter_items(client, table_name):
        plain = deserialize(item)
        scope = str(plain["scope"])
        for name, value in plain.items():
            prefix = name[:2]
            if prefix in counted and value:
                counted[prefix][(scope, WorkerStatus(name[2:]))] += int(value)
    return FleetCounts(dict(counted[_STATUS_PREFIX]), dict(counted[_UNHEALTHY_PREFIX]))
