"""The hottest partition key of a placement-heavy run, and what it takes at 5,000 placements a second.

A fleet of WORKERS RUNNING workers (two templates; two pools and workers in none) takes PLACEMENTS
placements through the service (by pool, by template), one after another. Every write's partition keys
are recorded with their write units, for the table and for each index:

- the table: each item written, at 1 unit per KB of the item (2 in a transaction), and each
  ConditionCheck of a transaction, which DynamoDB bills as a write of the item it checks;
- each index: an entry is written when the item enters or leaves the index, when its index key changes
  (a delete in the old partition and a put in the new one), or when a projected attribute changes;
  at 1 unit per KB of the entry (2 in a transaction, as DynamoDB Local counts them).

The item images before and after each write are read with a client the hooks do not see, so the
counting is exact for a run with one writer. By the arithmetic the issue asks for, a key's rate at
RATE placements a second is its share of the run's units times RATE times the units of a placement;
the goal is that no key exceeds LIMIT units a second (DynamoDB's per-partition write throughput).

The same run is made twice: on a table in the bucket layout, and on one being migrated (every write
carries both layouts' index attributes, and the earlier release's fleet-wide keys take their writes as
they did before the migration), to show the keys the bucket layout split.

Run: `python -m bench hot_keys`.
"""

from __future__ import annotations

import math
import os
import platform
import random
import time
from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import boto3

from bench.reconcile_bench import context, write_fleet
from bench.stack import bench_stack, use_table
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Pool, Worker, WorkerTemplate
from fleetkeeper.services import catalog, placement
from fleetkeeper.services.context import Context
from fleetkeeper.store import schema
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.layout import LAYOUT_KEY
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack

WORKERS = 1_000
CAPACITY = 6
PLACEMENTS = 3_000
RATE = 5_000
LIMIT = 1_000.0
SEED = 11
TOP = 8
_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems"})
_KEY = (schema.PARTITION_KEY, schema.SORT_KEY)


def attribute_size(value: Mapping[str, Any]) -> int:
    """The bytes DynamoDB counts for one attribute value (its item size rules, approximately for
    numbers)."""
    kind, raw = next(iter(value.items()))
    if kind == "S":
        return len(str(raw).encode())
    if kind == "N":
        digits = Decimal(str(raw)).normalize().as_tuple().digits
        return 1 + math.ceil(len(digits) / 2)
    if kind == "B":
        return len(raw)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(len(str(v).encode()) for v in raw)
    if kind == "NS":
        return sum(1 + math.ceil(len(str(v)) / 2) for v in raw)
    if kind == "L":
        return 3 + sum(1 + attribute_size(v) for v in raw)
    if kind == "M":
        return 3 + sum(1 + len(k.encode()) + attribute_size(v) for k, v in raw.items())
    return len(str(raw))


def item_size(item: Mapping[str, Any], names: set[str] | None = None) -> int:
    return sum(len(k.encode()) + attribute_size(v) for k, v in item.items() if names is None or k in names)


def units(size: int, transactional: bool) -> float:
    return max(1, math.ceil(size / 1024)) * (2 if transactional else 1)


class WriteLedger:
    """Write units per partition key (`table:<PK>` or `<index>:<key>`), from every write of one client."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self.table_name = table_name
        self.units: defaultdict[str, float] = defaultdict(float)
        self._raw = boto3.client("dynamodb")  # not hooked: its reads are not counted
        self._indexes = {
            index["IndexName"]: (
                [k["AttributeName"] for k in index["KeySchema"]],
                index["Projection"],
            )
            for index in schema.global_secondary_indexes()
        }
        # Each ledger keeps its own entry in the call's context and removes its hooks when closed: the
        # clients are cached per process, so the next run's ledger is on the same client.
        self._slot = f"hot_keys_{id(self)}"
        self._events = dynamodb.meta.events
        self._events.register(
            "provide-client-params.dynamodb.*", self._before, unique_id=f"{self._slot}-before"
        )
        self._events.register("after-call.dynamodb.*", self._after, unique_id=f"{self._slot}-after")

    def close(self) -> None:
        self._events.unregister("provide-client-params.dynamodb.*", unique_id=f"{self._slot}-before")
        self._events.unregister("after-call.dynamodb.*", unique_id=f"{self._slot}-after")

    def _targets(self, operation: str, params: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """(action, key) of each item the write touches."""
        if operation == "TransactWriteItems":
            found = []
            for entry in params["TransactItems"]:
                (action, spec), *_ = entry.items()
                key = spec["Item"] if action == "Put" else spec["Key"]
                found.append((action, {k: key[k] for k in _KEY}))
            return found
        key = params["Item"] if operation == "PutItem" else params["Key"]
        return [(operation.removesuffix("Item"), {k: key[k] for k in _KEY})]

    def _image(self, key: Mapping[str, Any]) -> dict[str, Any] | None:
        item = self._raw.get_item(TableName=self.table_name, Key=key, ConsistentRead=True).get("Item")
        return dict(item) if item else None

    def _before(self, params: dict[str, Any], model: Any, context: dict[str, Any], **_: Any) -> None:
        if model.name not in _WRITES:
            return
        targets = self._targets(model.name, params)
        context[self._slot] = (model.name, targets, [self._image(key) for _, key in targets])

    def _after(self, http_response: Any, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        recorded = context.pop(self._slot, None)
        if recorded is None or http_response.status_code >= 300 or "Error" in parsed:
            return
        operation, targets, before = recorded
        transactional = operation == "TransactWriteItems"
        for (action, key), old in zip(targets, before, strict=True):
            new = self._image(key) if action != "ConditionCheck" else old
            self._count(action, key, old, new, transactional)

    def _count(
        self,
        action: str,
        key: Mapping[str, Any],
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any] | None,
        transactional: bool,
    ) -> None:
        self.units[f"table:{key['PK']['S']}"] += units(item_size(new or old or key), transactional)
        if action == "ConditionCheck":
            return
        for name, (key_names, projection) in self._indexes.items():
            old_key = _index_key(old, key_names)
            new_key = _index_key(new, key_names)
            if old_key is None and new_key is None:
                continue
            kept = _projected(projection, key_names)
            if old_key is not None and old_key == new_key and old is not None and new is not None:
                changed = old != new if kept is None else any(old.get(a) != new.get(a) for a in kept)
                if changed:
                    self.units[f"{name}:{new_key[0]}"] += units(item_size(new, kept), transactional)
                continue
            if old_key is not None and old is not None:
                self.units[f"{name}:{old_key[0]}"] += units(item_size(old, kept), transactional)
            if new_key is not None and new is not None:
                self.units[f"{name}:{new_key[0]}"] += units(item_size(new, kept), transactional)


def _index_key(item: Mapping[str, Any] | None, names: list[str]) -> tuple[str, ...] | None:
    if item is None or any(n not in item for n in names):
        return None
    return tuple(str(next(iter(item[n].values()))) for n in names)


def _projected(projection: Mapping[str, Any], key_names: list[str]) -> set[str] | None:
    """The attributes an index entry holds (None: all of them)."""
    kind = projection["ProjectionType"]
    if kind == "ALL":
        return None
    kept = {*_KEY, *key_names}
    if kind == "INCLUDE":
        kept |= set(projection["NonKeyAttributes"])
    return kept


def build(stack: LocalStack, *, migrating: bool) -> tuple[Context, dict[str, list[str]]]:
    """The fleet, its templates and pools; `migrating`: a table whose migration has not finished."""
    use_table(stack, "hot")
    ctx = context()
    if migrating:
        ctx.store._client.delete_item(TableName=ctx.settings.table_name, Key=serialize(LAYOUT_KEY))
        ctx = context()
    for name in ("lab", "gpu"):
        template = WorkerTemplate(
            name=name, instance_type="m5.large", ami_name_filter="x-*", capacity=CAPACITY
        )
        catalog.put_template(ctx.store, template, actor="bench")
    for name in ("labs", "batch"):
        ctx.store.create_pool(Pool(name=name), actor="bench")
    fleet = [
        Worker(
            id=f"w-{n:016x}",
            template="lab" if n % 5 < 3 else "gpu",
            region=LOCAL_REGION,
            pool="labs" if n % 5 < 2 else "batch" if n % 5 == 3 else None,
            status=WorkerStatus.RUNNING,
            ec2_instance_id=f"i-{n:017x}",
            capacity=CAPACITY,
            version=3,
        )
        for n in range(WORKERS)
    ]
    write_fleet(ctx, fleet, legacy=migrating)
    return ctx, {"pools": ["labs", "labs", "batch"], "templates": ["lab", "gpu"]}


def run_placements(ctx: Context, choices: dict[str, list[str]]) -> tuple[WriteLedger, float]:
    ledger = WriteLedger(ctx.store._client, ctx.settings.table_name)
    rolls = random.Random(SEED)
    started = time.perf_counter()
    try:
        for _ in range(PLACEMENTS):
            if rolls.random() < 0.6:
                placement.place_instance(ctx.store, actor="bench", pool=rolls.choice(choices["pools"]))
            else:
                placement.place_instance(
                    ctx.store, actor="bench", template=rolls.choice(choices["templates"])
                )
    finally:
        ledger.close()
    return ledger, time.perf_counter() - started


def summary(ledger: WriteLedger) -> dict[str, Any]:
    total = sum(ledger.units.values())
    per_placement = total / PLACEMENTS
    top = sorted(ledger.units.items(), key=lambda kv: -kv[1])[:TOP]
    rows = [
        {"key": key, "units": value, "share": value / total, "at_rate": value / total * per_placement * RATE}
        for key, value in top
    ]
    return {"total": total, "per_placement": per_placement, "top": rows}


def section(results: dict[str, dict[str, Any]], seconds: dict[str, float]) -> str:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    lines = [
        "## Hottest partition key (bench/hot_keys_bench.py)",
        "",
        f"{PLACEMENTS:,} placements, one after another, on {WORKERS:,} RUNNING workers (capacity {CAPACITY},",
        "two templates, pools `labs` and `batch` and workers in none; 60% placed by pool, 40% by template);",
        "every write's partition keys and write units recorded, for the table and each index (how: the",
        f"module's docstring). At {RATE:,} placements a second, a key takes its share of the run's units",
        f"times {RATE:,} times the units of one placement. Goal: no key above {LIMIT:,.0f} write units a",
        f"second. {machine}, {when}.",
        "",
    ]
    for name, title in (
        ("bucket", "Bucket layout"),
        (
            "migrating",
            "While a table is migrated (both layouts written: the earlier release's keys as they were)",
        ),
    ):
        result = results[name]
        hottest = result["top"][0]
        met = "met" if hottest["at_rate"] <= LIMIT else "not met"
        lines += [
            f"### {title}",
            "",
            f"{result['per_placement']:.1f} write units per placement; run took {seconds[name]:.0f} s.",
            "",
            "| partition key | units in the run | share | units/s at 5,000 placements/s |",
            "|---|--:|--:|--:|",
        ]
        lines += [
            f"| `{row['key']}` | {row['units']:,.0f} | {row['share']:.2%} | {row['at_rate']:,.0f} |"
            for row in result["top"]
        ]
        lines += ["", f"Hottest key `{hottest['key']}`: **{hottest['at_rate']:,.0f} units/s, {met}**.", ""]
    lines += [
        "In the bucket layout every key a whole fleet shares is split into 16 write shards by the worker's",
        "bucket (a status or state of the worker and instance indexes, a pool, and the pool's status that",
        "placements check, kept in 16 gate items), and the worker indexes project only what their queries",
        "read, so a placement rewrites one small entry per index instead of the whole worker item.",
        "",
        "While a table is migrated, the earlier release's keys are written as they were, and every",
        "placement still writes the fleet-wide keys it wrote before (one status, one kind, one pool): the",
        "migrating run shows what the bucket layout removes, and why a stage should finish its migration",
        '(docs/data-model.md, "Migrating a table") before it takes a fleet\'s full placement rate. Its',
        "extra write units per placement are the two layouts written side by side until the migration ends.",
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    results: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    with bench_stack() as stack:
        for name, migrating in (("bucket", False), ("migrating", True)):
            ctx, choices = build(stack, migrating=migrating)
            if ctx.store.layout().done is migrating:
                raise RuntimeError(f"the table is not in the layout the run is about: {name}")
            ledger, took = run_placements(ctx, choices)
            results[name] = summary(ledger)
            seconds[name] = took
            print(name, results[name], flush=True)
    return section(results, seconds)


if __name__ == "__main__":
    print(run())
