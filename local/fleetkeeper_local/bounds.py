"""The largest records fleetkeeper writes, built on the local stack, and the largest items of a table.

The tests and `bench/item_size_bench.py` build a worker at the capacity ceiling with every field at its
largest, and measure every item of the table with DynamoDB's own formula (store/item_size.py).
Seeding a full worker one placement at a time would take a transaction per slot; `fill_worker` writes
the same items (the store's own instance items and slot items) in batches instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final

from botocore.exceptions import ClientError

from fleetkeeper.domain.lifecycle import InstanceState
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, DrainThen, Instance, Worker, new_id
from fleetkeeper.domain.operations import MAX_SYSTEM_INFO_BYTES
from fleetkeeper.store import keys
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.item_size import MAX_ITEM_BYTES, item_size
from fleetkeeper.store.repository import FleetStore
from fleetkeeper.store.slots import slot_key
from fleetkeeper.store.table import write_batches

# Free text the code writes without a declared bound (error texts, reasons) is taken at this size,
# four times the 500 characters the code cuts it to, so the bound holds with room to spare.
FREE_TEXT = 2000
# An IAM principal's ARN, the longest actor: ARNs are at most 2048 characters.
LONGEST_ARN = "arn:aws:sts::123456789012:assumed-role/" + "r" * (2048 - 39)


def batch_write(client: Any, table_name: str, items: Iterable[Mapping[str, Any]]) -> int:
    """Put plain items (store/codec.serialize form) with BatchWriteItem; returns how many."""
    requests = [{"PutRequest": {"Item": serialize(i)}} for i in items]
    write_batches(client, table_name, requests)
    return len(requests)


def largest_worker_changes(now: datetime) -> dict[str, Any]:
    """Changes that bring a worker's every field to the largest value the code writes into it."""
    info_text = "x" * (MAX_SYSTEM_INFO_BYTES - len('{"inventory": ""}'))
    drain = DrainRecord(
        generation=1,
        started_at=now - timedelta(hours=2),
        deadline=now + timedelta(days=360),
        timeout_seconds=360 * 24 * 3600,
        reason="r" * 500,
        requested_by=LONGEST_ARN,
        then=DrainThen.TERMINATE,
        execution_arn="arn:aws:states:eu-west-1:123456789012:execution:" + "s" * 80 + ":" + "e" * 80,
        task_token="t" * 1024,
        outcome=DrainOutcome.CANCELLED,
        forced_instances=10_000,
        timed_out_at=now,
        finished_at=now,
        cancelled_by=LONGEST_ARN,
        cancel_reason="c" * 500,
        error="e" * FREE_TEXT,
        restarts=1000,
        moved_instances=10_000,
    )
    return {
        "drain": drain,
        "do_not_disrupt_until": now + timedelta(days=366),
        "status_reason": "s" * FREE_TEXT,
        "terminated_by": LONGEST_ARN,
        "terminated_reason": "t" * FREE_TEXT,
        "ec2_state": "shutting-down",
        "ec2_observed_at": now,
        "private_ip": "255.255.255.255",
        "public_ip": "255.255.255.255",
        "reconcile_attempts": 1000,
        "next_reconcile_at": now,
        "last_reconcile_error": "l" * 500,
        "launch_claimed_at": now,
        "idle_since": now,
        "metrics": {
            "cpu_utilization": 99.123456789,
            "memory_utilization": 99.123456789,
            "disk_utilization": 99.123456789,
            "collected_at": now,
        },
        "system_info": {"inventory": info_text},
        "system_info_at": now,
    }


def fill_worker(store: FleetStore, worker: Worker) -> int:
    """Give a RUNNING worker active instances up to its capacity: the same instance and slot items a
    placement writes, in batches, and the counter set to match. Returns how many were added."""
    free = worker.capacity - worker.active_instances
    placed = [
        Instance(id=new_id("i"), worker_id=worker.id, template=worker.template, pool=worker.pool, version=1)
        for _ in range(free)
    ]

    def items() -> Iterable[Mapping[str, Any]]:
        for instance in placed:
            yield store._instance_item(instance.model_copy(update={"state": InstanceState.RUNNING}))
            yield {**slot_key(worker.id, instance.id), "instance_id": instance.id}

    client = store._client
    batch_write(client, store.table_name, items())
    client.update_item(
        TableName=store.table_name,
        Key=serialize(keys.worker_key(worker.id)),
        UpdateExpression="SET active_instances = :n, #v = #v + :one",
        ExpressionAttributeNames={"#v": "version"},
        ExpressionAttributeValues={":n": {"N": str(worker.capacity)}, ":one": {"N": "1"}},
    )
    return free


def seed_workers(store: FleetStore, workers: Iterable[Worker]) -> int:
    """Store workers as `create_worker` writes their items, in batches (no audit items): a fleet of
    tens of thousands in seconds, for the tests and benchmarks that need one."""
    return batch_write(store._client, store.table_name, (store._worker_item(w) for w in workers))


def largest_items(client: Any, table_name: str, *, top: int = 5) -> list[tuple[int, str, str]]:
    """The `top` largest items of the table as (bytes, PK, SK), largest first: the whole table is read."""
    sizes: list[tuple[int, str, str]] = []
    request: dict[str, Any] = {"TableName": table_name}
    while True:
        page = client.scan(**request)
        sizes.extend((item_size(i), str(i["PK"]["S"]), str(i["SK"]["S"])) for i in page.get("Items", []))
        sizes = sorted(sizes, reverse=True)[:top]
        if not page.get("LastEvaluatedKey"):
            return sizes
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


# The attribute that pads a copy of an item to a chosen size (no item fleetkeeper writes has it).
_PAD: Final = "size_probe_pad"


@dataclass(frozen=True)
class LimitCheck:
    """What DynamoDB did with copies of one item padded to its limit and one byte past it."""

    size: int  # the item's own size by the formula
    accepted_at_limit: bool
    refused_above: bool

    @property
    def agrees(self) -> bool:
        """DynamoDB's own count of the item equals the formula's (to the byte)."""
        return self.accepted_at_limit and self.refused_above


def check_against_limit(client: Any, table_name: str, item: Mapping[str, Any]) -> LimitCheck:
    """Put a copy of `item` (wire form, its own key) into `table_name`, a scratch table with the fleet
    table's key schema, padded so the formula gives exactly DynamoDB's limit, then one byte more.

    DynamoDB accepts the first and refuses the second only if it counts the item's names and values
    exactly as store/item_size.py does: the size reported for the item is then DynamoDB's own.
    """
    size = item_size(item)
    pad = MAX_ITEM_BYTES - size - len(_PAD.encode())
    if pad < 0:
        raise ValueError(f"the item is {size} bytes: no room to pad it to the limit")

    def accepted(extra: int) -> bool:
        try:
            client.put_item(TableName=table_name, Item={**item, _PAD: {"S": "p" * (pad + extra)}})
        except ClientError as error:
            if error.response["Error"]["Code"] != "ValidationException":
                raise
            return False
        return True

    return LimitCheck(size=size, accepted_at_limit=accepted(0), refused_above=not accepted(1))
