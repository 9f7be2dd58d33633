"""Bounded items and storage: the table's largest item at the capacity ceiling with orphan GC's breaker
holding back 50,000 workers, and the items a steady fleet adds per worker per day.

1. A worker at the capacity ceiling (10,000), full, with every field at its largest, and 50,000 workers
   with the longest ids there are (256 characters) vanished at once: a real discovery run holds them
   back, the set is read page by page and confirmed, and the next run retires a bounded share. Every
   item of the table is then measured with DynamoDB's formula (store/item_size.py). Goal: under 100 KB.
2. One simulated hour of reconcile cycles over a steady fleet (fleetkeeper_local/storage.py), the items
   created counted by kind, scaled to a day and to the stage retentions.
"""

from __future__ import annotations

import json
import os
import platform
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3

from bench.stack import bench_stack, use_table
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import MAX_WORKER_CAPACITY, Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper.observability import logger
from fleetkeeper.services import catalog, orphan_gc, workers
from fleetkeeper.services.context import Context, build_context
from fleetkeeper.services.discovery import discover_and_collect
from fleetkeeper.settings import Settings
from fleetkeeper.store.item_size import ITEM_BUDGET_BYTES, MAX_ITEM_BYTES, item_size
from fleetkeeper_local.bounds import (
    LimitCheck,
    check_against_limit,
    fill_worker,
    largest_worker_changes,
    seed_workers,
)
from fleetkeeper_local.controlplane import ensure_worker_profile
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack
from fleetkeeper_local.storage import steady_hour

HELD_BACK = 50_000
ALIVE = 20
LONGEST_ID = 256
RETIRE_PER_RUN = 200
STEADY_WORKERS = 100
CATALOGUE = {
    "collect-system-info": {"document": "bench-CollectSystemInfo", "max_attempts": 1, "timeout_seconds": 60}
}
# Retentions of the shipped stages (cdk.json): operations, audit.
STAGES = {"dev": (14, 30), "prod": (90, 400)}


def context(**overrides: str) -> Context:
    return build_context(Settings.from_environ({**os.environ, **overrides}))


def machine(worker_id: str, template: str) -> str:
    """A running (emulated) machine tagged as the worker's, launched with the workers' instance profile
    as the reconciler launches it (its emulated SSM agent answers Run Command only then)."""
    ec2: Any = boto3.client("ec2")
    images = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": ["lab-2026.02"]}])
    image = (
        images["Images"][0]["ImageId"]
        if images["Images"]
        else ec2.register_image(Name="lab-2026.02", RootDeviceName="/dev/sda1")["ImageId"]
    )
    tags = [
        {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
        {"Key": WORKER_ID_TAG, "Value": worker_id},
        {"Key": TEMPLATE_TAG, "Value": template},
    ]
    return str(
        ec2.run_instances(
            ImageId=image,
            InstanceType="m5.large",
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            IamInstanceProfile={"Name": ensure_worker_profile()},
        )["Instances"][0]["InstanceId"]
    )


def running(ctx: Context, template: str, pool: str | None = None) -> Worker:
    """A worker moved PENDING -> PROVISIONING -> RUNNING onto its own running machine."""
    worker = workers.create_worker(
        ctx.store, template=template, region=LOCAL_REGION, pool=pool, actor="bench"
    )
    worker = ctx.store.transition_worker(
        worker,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor="bench",
        changes={"ec2_instance_id": machine(worker.id, template)},
    )
    return ctx.store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="bench")


def launch_alive(ctx: Context, count: int) -> None:
    """Workers on running machines, so the vanished ones are a share of a live region."""
    for _ in range(count):
        running(ctx, "lab")


def widest_worker(ctx: Context) -> Worker:
    """A RUNNING worker at the capacity ceiling, full, with every field at its largest."""
    catalog.put_template(
        ctx.store,
        WorkerTemplate(
            name="wide", instance_type="m5.large", ami_name_filter="wide-*", capacity=MAX_WORKER_CAPACITY
        ),
        actor="bench",
    )
    catalog.ensure_pool(ctx.store, "p" * 64, actor="bench")
    worker = running(ctx, "wide", pool="p" * 64)
    worker = ctx.store.update_worker(
        worker, largest_worker_changes(utcnow()), actor="bench", action="Enlarged"
    )
    fill_worker(ctx.store, worker)
    return ctx.store.get_worker(worker.id)


@dataclass
class TableSizes:
    """Every item of a table measured with DynamoDB's formula."""

    items: int = 0
    # Item kind -> (how many, the largest's bytes, the largest item itself in wire form).
    kinds: dict[str, tuple[int, int, dict[str, Any]]] = field(default_factory=dict)

    def largest(self) -> tuple[str, int, dict[str, Any]]:
        kind, (_, size, item) = max(self.kinds.items(), key=lambda kv: kv[1][1])
        return kind, size, item


def table_sizes(ctx: Context) -> TableSizes:
    """Read the whole table (consistently) and measure every item."""
    client = ctx.store._client
    request: dict[str, Any] = {"TableName": ctx.settings.table_name, "ConsistentRead": True}
    sizes = TableSizes()
    while True:
        page = client.scan(**request)
        for item in page.get("Items", []):
            size = item_size(item)
            sizes.items += 1
            kind = _kind(str(item["PK"]["S"]), str(item["SK"]["S"]))
            count, biggest, widest = sizes.kinds.get(kind, (0, -1, {}))
            sizes.kinds[kind] = (
                (count + 1, size, dict(item)) if size > biggest else (count + 1, biggest, widest)
            )
        if not page.get("LastEvaluatedKey"):
            return sizes
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def cross_check(stack: LocalStack, ctx: Context, items: dict[str, dict[str, Any]]) -> dict[str, LimitCheck]:
    """Each item put again, padded to DynamoDB's limit by the formula and one byte past it, into a
    scratch table of the same schema: DynamoDB Local's verdicts tell whether it counts the item as the
    formula does."""
    scratch = f"bench-limit-{uuid.uuid4().hex[:6]}"
    stack.create_table(scratch)
    try:
        return {kind: check_against_limit(ctx.store._client, scratch, item) for kind, item in items.items()}
    finally:
        stack.delete_table(scratch)


def _kind(pk: str, sk: str) -> str:
    if pk.startswith("BREAKER#"):
        return "breaker head" if sk == "BREAKER" else "breaker id page"
    if pk.startswith("WORKER#"):
        return {"WORKER": "worker"}.get(sk, sk.split("#", 1)[0].lower())
    return pk.split("#", 1)[0].lower()


def measure_largest(stack: LocalStack) -> dict[str, Any]:
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = [os.getloadavg()[0]]
    use_table(stack, "bench-items")
    stack.reset_moto()
    ctx = context(ORPHAN_GC_MAX_SHARE_PERCENT="20", ORPHAN_GC_MAX_RETIRE_PER_RUN=str(RETIRE_PER_RUN))
    catalog.put_template(
        ctx.store,
        WorkerTemplate(name="lab", instance_type="m5.large", ami_name_filter="lab-*", capacity=4),
        actor="bench",
    )
    started = time.monotonic()
    wide = widest_worker(ctx)
    launch_alive(ctx, ALIVE)
    vanished = [
        Worker(
            id=f"w-{n:08d}-".ljust(LONGEST_ID, "x"),
            template="lab",
            region=LOCAL_REGION,
            status=WorkerStatus.RUNNING,
            ec2_instance_id=f"i-{n:017x}",
            capacity=4,
            version=1,
        )
        for n in range(HELD_BACK)
    ]
    seed_workers(ctx.store, vanished)
    seeded = time.monotonic()
    holding = discover_and_collect(ctx)
    held_at = time.monotonic()
    [summary] = orphan_gc.breakers(ctx)
    assert summary.breaker.held is not None, "discovery held nothing back"
    fingerprint = summary.breaker.held.fingerprint
    pages, shown, token = 0, 0, None
    while True:
        page = orphan_gc.held_back_page(ctx, LOCAL_REGION, next_token=token, expected_set=fingerprint)
        pages += 1
        shown += len(page.page.items)
        token = page.page.next_token
        if not token:
            break
    confirmed = orphan_gc.confirm(ctx, LOCAL_REGION, actor="bench", expected_set=fingerprint)
    retiring = discover_and_collect(ctx, now=utcnow() + timedelta(minutes=5))
    done = time.monotonic()
    sizes = table_sizes(ctx)
    top_kind, _, _ = sizes.largest()
    load.append(os.getloadavg()[0])
    checked = cross_check(
        stack, ctx, {kind: sizes.kinds[kind][2] for kind in {top_kind, "worker", "breaker head"}}
    )
    return {
        "wide": wide,
        "held_back": holding.counters["orphans_held_back"],
        "breaker": holding.regions[0].breaker,
        "pages_read": pages,
        "ids_shown": shown,
        "confirmed": confirmed.breaker.confirmed.count if confirmed.breaker.confirmed else 0,
        "retired": retiring.counters["orphans_terminated"],
        "deferred": retiring.counters["orphans_deferred"],
        "retiring_decision": retiring.regions[0].breaker,
        "when": when,
        "load": load,
        "sizes": sizes,
        "checked": checked,
        "seconds": {"seed": seeded - started, "hold": held_at - seeded, "rest": done - held_at},
    }


def measure_growth(stack: LocalStack) -> Any:
    use_table(stack, "bench-items")
    stack.reset_moto()
    ctx = context(
        OPERATIONS_CATALOGUE=json.dumps(CATALOGUE),
        SYSTEM_INFO_INTERVAL_SECONDS="3600",
        METRICS_INTERVAL_SECONDS="300",
        OPERATION_RETENTION_DAYS="14",
        AUDIT_RETENTION_DAYS="30",
    )
    catalog.put_template(
        ctx.store,
        WorkerTemplate(name="lab", instance_type="m5.large", ami_name_filter="lab-*", capacity=4),
        actor="bench",
    )
    launch_alive(ctx, STEADY_WORKERS)
    return steady_hour(ctx, STEADY_WORKERS, start=utcnow())


def kib(size: int) -> str:
    return f"{size / 1024:.1f} KB"


def _verdict(check: LimitCheck) -> str:
    if check.agrees:
        return "accepted at 400 KB, refused at 400 KB + 1 byte: DynamoDB's count equals the formula's"
    return (
        f"{'accepted' if check.accepted_at_limit else 'refused'} at 400 KB, "
        f"{'refused' if check.refused_above else 'accepted'} at 400 KB + 1 byte: the counts differ"
    )


def section(largest: dict[str, Any], growth: Any) -> str:
    sizes: TableSizes = largest["sizes"]
    checked: dict[str, LimitCheck] = largest["checked"]
    top_kind, top_size, top_item = sizes.largest()
    top_pk, top_sk = str(top_item["PK"]["S"]), str(top_item["SK"]["S"])
    agrees = all(check.agrees for check in checked.values())
    met = top_size < ITEM_BUDGET_BYTES and agrees
    load = ", ".join(f"{v:.0f}" for v in largest["load"])
    lines = [
        "## Bounded items and storage (bench/item_size_bench.py)",
        "",
        "### Largest item at the capacity ceiling, with the breaker holding back 50,000 workers",
        "",
        f"One worker at the capacity ceiling ({MAX_WORKER_CAPACITY:,}), full ({MAX_WORKER_CAPACITY:,} "
        "instance and slot items), every field at its largest (16 KB of system information, a drain record "
        "with a 1,024-character task token, 2,048-character ARNs, reasons and errors of 2,000 characters); "
        f"{ALIVE} live workers and {HELD_BACK:,} vanished ones with {LONGEST_ID}-character ids (the longest "
        f"an EC2 tag allows). A real discovery run decided **{largest['breaker']}** and held back "
        f"{largest['held_back']:,}; the set was read back through the service in {largest['pages_read']} "
        f"pages ({largest['ids_shown']:,} ids), confirmed by its fingerprint ({largest['confirmed']:,} "
        f"workers), and the next run ({largest['retiring_decision']}) retired {largest['retired']} "
        f"(ORPHAN_GC_MAX_RETIRE_PER_RUN={RETIRE_PER_RUN}), leaving {largest['deferred']:,} for the "
        f"following runs. Then all {sizes.items:,} items of the table were read back from DynamoDB Local "
        "and measured with DynamoDB's formula (store/item_size.py). Measured "
        f"{largest['when']} on {platform.system()} {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, shared with other work (load average {load}).",
        "",
        "| item kind | items | largest |",
        "|---|--:|--:|",
        *[
            f"| {kind} | {count:,} | {kib(size)} ({size:,} bytes) |"
            for kind, (count, size, _) in sorted(sizes.kinds.items(), key=lambda kv: -kv[1][1])
        ],
        "",
        "Cross-check with DynamoDB Local: each item below was put again into a scratch table of the same "
        "schema with one padding attribute that brings it, by the formula, to exactly DynamoDB's 400 KB "
        "limit, then to one byte more.",
        "",
        "| item | by the formula | DynamoDB Local |",
        "|---|--:|---|",
        *[
            f"| {kind} | {check.size:,} bytes | {_verdict(check)} |"
            for kind, check in sorted(checked.items())
        ],
        "",
        f"Goal: the largest item under {ITEM_BUDGET_BYTES // 1024} KB. **{'Met' if met else 'Not met'}**: "
        f"the largest is a {top_kind} (`{top_pk[:40]}{'…' if len(top_pk) > 40 else ''}` / "
        f"`{top_sk[:40]}`), {kib(top_size)} ({top_size:,} bytes), "
        + ("as DynamoDB Local counts it too" if agrees else "but DynamoDB Local counts differently")
        + f"; DynamoDB's limit is {MAX_ITEM_BYTES // 1024} KB. The worker at the ceiling is "
        f"{kib(sizes.kinds['worker'][1])} however many instances it holds (their ids are slot items), and "
        f"the breaker's head {kib(sizes.kinds['breaker head'][1])} however many workers it holds back "
        "(their ids are pages of at most 1,000 ids and 64 KB).",
        "",
        f"Seeding took {largest['seconds']['seed']:.0f} s, the holding discovery run "
        f"{largest['seconds']['hold']:.0f} s, paging, confirming and the retiring run "
        f"{largest['seconds']['rest']:.0f} s.",
        "",
        "### Items a steady fleet adds per worker per day",
        "",
        f"{growth.workers} RUNNING workers on running machines, one simulated hour of reconcile cycles "
        "(one a minute), collect-system-info every hour (the shipped interval), metrics every 5 minutes.",
        "",
        "| item | per worker per hour | expires |",
        "|---|--:|---|",
        *[
            f"| {kind} | {count / growth.workers / growth.hours:g} | "
            f"{'yes' if growth.expiring[kind] == count else f'{growth.expiring[kind]} of {count}'} |"
            for kind, count in sorted(growth.created.items())
        ],
        "",
        f"**{growth.per_worker_day:g} items per worker per day**, {growth.kept_forever} kept forever. At the "
        "shipped retentions a worker's operation history settles at "
        + ", ".join(
            f"{stage} {growth.per_worker_day * min(op, audit):,.0f} items ({op} days)"
            for stage, (op, audit) in STAGES.items()
        )
        + "; without a TTL it would grow by that much every day, for ever.",
    ]
    return "\n".join(lines) + "\n"


def run() -> str:
    # The discovery run names 100 held-back ids of 256 characters in its log line: not worth printing.
    logger.setLevel("ERROR")
    with bench_stack(log_level="ERROR") as stack:
        largest = measure_largest(stack)
        growth = measure_growth(stack)
    return section(largest, growth)
