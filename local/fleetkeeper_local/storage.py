"""How fast a steady fleet fills the table: the items one simulated hour of reconcile cycles creates.

A steady fleet is RUNNING workers on running machines, nothing placed or drained: what remains is the
reconciler's own bookkeeping and the hourly collect-system-info operation of every worker (its machine
answering with a JSON object, as a worker image does). `steady_hour` runs the real reconcile cycle once
a minute of simulated time and classifies every item that did not exist before, so the test and
`bench/item_size_bench.py` give the same figure: items per worker per day, and which of them expire.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fleetkeeper.services.context import Context, build_context
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper.store.schema import TTL_ATTRIBUTE
from fleetkeeper_local import faults

CYCLE = timedelta(minutes=1)
SYSTEM_INFO = {"cpus": 4, "memory_mib": 16384, "kernel": "6.1.0", "image": "lab-2026.02"}


@dataclass
class Growth:
    """The items a run created, by kind, and how many of them carry the table's TTL."""

    workers: int
    hours: float
    created: Counter[str] = field(default_factory=Counter)
    expiring: Counter[str] = field(default_factory=Counter)

    @property
    def per_worker_day(self) -> float:
        return sum(self.created.values()) / self.workers / self.hours * 24

    @property
    def kept_forever(self) -> int:
        return sum(self.created.values()) - sum(self.expiring.values())


def _items(ctx: Context) -> Iterator[dict[str, Any]]:
    client = ctx.store._client
    request: dict[str, Any] = {"TableName": ctx.settings.table_name}
    while True:
        page = client.scan(**request)
        yield from page.get("Items", [])
        if not page.get("LastEvaluatedKey"):
            return
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _key(item: dict[str, Any]) -> tuple[str, str]:
    return str(item["PK"]["S"]), str(item["SK"]["S"])


def kind(item: dict[str, Any]) -> str:
    """What an item is: `audit <action>`, `operation <name>`, or its partition key's prefix."""
    pk, sk = _key(item)
    if pk.startswith("AUDIT#"):
        return f"audit {item['action']['S']}"
    if sk.startswith("OPERATION#"):
        return f"operation {item['name']['S']}"
    return pk.split("#", 1)[0].lower()


def steady_hour(ctx: Context, workers: int, *, start: datetime, cycles: int = 60) -> Growth:
    """Run `cycles` reconcile cycles a simulated minute apart and count the items they created.

    A cycle before them creates the fleet-wide items a first cycle writes (the lease, the stats), and
    one after them finishes the operations the last cycles sent; neither asks for system information.
    """
    quiet = build_context(ctx.settings.model_copy(update={"system_info_interval_seconds": 0}))
    answer = faults.ssm_command_result("Success", stdout=json.dumps(SYSTEM_INFO))
    with faults.FaultPlan(faults=[answer]).installed():
        reconcile_fleet(quiet, now=start - CYCLE)
        before = {_key(i) for i in _items(ctx)}
        for n in range(cycles):
            reconcile_fleet(ctx, now=start + n * CYCLE)
        reconcile_fleet(quiet, now=start + cycles * CYCLE)
    growth = Growth(workers=workers, hours=cycles * CYCLE / timedelta(hours=1))
    for item in _items(ctx):
        if _key(item) in before:
            continue
        growth.created[kind(item)] += 1
        if TTL_ATTRIBUTE in item:
            growth.expiring[kind(item)] += 1
    return growth
