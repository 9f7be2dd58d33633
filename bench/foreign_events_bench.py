"""1,000 EC2 events about machines fleetkeeper does not manage, through the ec2_events handler.

In an account with autoscaling groups or EKS, most EC2 state changes are about other machines. Each is
delivered to the ec2_events function (in-process, as one Lambda invocation each) on the local stack,
beside a fleet of managed workers, and every AWS call it makes is counted through a botocore hook.
Goal (issue figure): 0 DescribeInstances and 0 table writes for the 1,000 foreign events.

Run: `python -m bench foreign_events`.
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import boto3
from botocore import handlers

from bench.stack import bench_stack, use_table
from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import WorkerTemplate, utcnow
from fleetkeeper.services import catalog, workers
from fleetkeeper.services.context import default_context
from fleetkeeper.services.discovery import discover_and_collect
from fleetkeeper.store.machine_keys import MIGRATION_SETTLE
from fleetkeeper_local.event_shapes import state_change_event
from fleetkeeper_local.images import stock_image
from fleetkeeper_local.invocation import invoke
from fleetkeeper_local.stack import LOCAL_REGION

FOREIGN = 1000
MANAGED = 50
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"})


@contextmanager
def counted() -> Iterator[Counter[str]]:
    """Every AWS call made through clients created inside the block, by `<service>:<Operation>`."""
    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def record(event_name: str, **_: Any) -> None:
        parts = event_name.split(".")
        with lock:
            calls[f"{parts[1]}:{parts[-1]}"] += 1

    spec = ("before-call", record)
    handlers.BUILTIN_HANDLERS.append(spec)
    reset_clients()
    default_context.cache_clear()
    try:
        yield calls
    finally:
        handlers.BUILTIN_HANDLERS.remove(spec)
        reset_clients()
        default_context.cache_clear()


def managed_fleet() -> list[str]:
    """MANAGED RUNNING workers on emulated machines, recorded as the reconciler records them."""
    ctx = default_context()
    catalog.put_template(
        ctx.store,
        WorkerTemplate(name="bench", instance_type="m5.large", ami_name_filter="bench-*", capacity=4),
        actor="bench",
    )
    ec2 = boto3.client("ec2", region_name=LOCAL_REGION)
    image = stock_image(ec2)
    machines: list[str] = []
    for _ in range(MANAGED):
        worker = workers.create_worker(ctx.store, template="bench", region=LOCAL_REGION, actor="bench")
        machine = ec2.run_instances(ImageId=image, InstanceType="m5.large", MinCount=1, MaxCount=1)
        instance_id = str(machine["Instances"][0]["InstanceId"])
        worker = ctx.store.transition_worker(
            worker,
            WorkerStatus.PROVISIONING,
            cause=Cause.CONTROL,
            actor="bench",
            changes={"ec2_instance_id": instance_id},
        )
        ctx.store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="bench")
        machines.append(instance_id)
    # Discovery has run in the region since the upgrade (store/machine_keys.py): the backfill is done.
    t0 = utcnow()
    discover_and_collect(ctx, regions=[LOCAL_REGION], now=t0)
    discover_and_collect(ctx, regions=[LOCAL_REGION], now=t0 + MIGRATION_SETTLE)
    return machines


def deliver_all(events: list[dict[str, Any]]) -> tuple[Counter[str], Counter[str], list[float]]:
    outcomes: Counter[str] = Counter()
    seconds: list[float] = []
    with counted() as calls:
        for event in events:
            started = time.perf_counter()
            outcomes[invoke("ec2_events", event)["outcome"]] += 1
            seconds.append(time.perf_counter() - started)
    return calls, outcomes, seconds


def render(
    foreign: tuple[Counter[str], Counter[str], list[float]],
    ours: tuple[Counter[str], Counter[str], list[float]],
    load_before: float,
) -> str:
    calls, outcomes, seconds = foreign
    own_calls, own_outcomes, own_seconds = ours
    describes = calls["ec2:DescribeInstances"]
    writes = sum(calls[f"dynamodb:{op}"] for op in WRITES)
    met = describes == 0 and writes == 0 and outcomes == Counter({"foreign": FOREIGN})

    def row(name: str, n: int, counts: Counter[str], times: list[float]) -> str:
        by_call = ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"
        return (
            f"| {name} | {n} | {counts['ec2:DescribeInstances']} "
            f"| {sum(counts[f'dynamodb:{op}'] for op in WRITES)} | {by_call} "
            f"| {statistics.median(times) * 1000:.1f} ms |"
        )

    now = datetime.now(UTC)
    setup = " ".join(
        [
            f"{FOREIGN:,} `EC2 Instance State-change Notification` events for instance ids no worker",
            f"recorded, then one for each of {MANAGED} managed workers' machines, each through the",
            "ec2_events handler as one invocation (in-process), on DynamoDB Local and moto; every AWS call",
            "counted through a botocore hook. The region's machine keys are backfilled (discovery ran).",
            f"Measured {now:%Y-%m-%d %H:%M} UTC on {platform.system()} {platform.machine()},",
            f"{os.cpu_count()} cores, Python {platform.python_version()}, shared with other work (load",
            f"average {load_before:.0f}).",
        ]
    )
    verdict = " ".join(
        [
            f"Goal: {FOREIGN:,} foreign events cost 0 DescribeInstances and 0 table writes.",
            f"**{'Met' if met else 'Not met'}**: {describes} DescribeInstances, {writes} table writes,",
            f"{calls['dynamodb:GetItem']:,} GetItem: one per event, plus one read of the region's migration",
            "marker per process. Outcomes are EMF metrics (`Ec2Events.events_<outcome>`), not an item.",
        ]
    )
    before = " ".join(
        [
            "Before, each foreign event cost a Query of the by_ec2_instance index, a DescribeInstances",
            "(for the worker-id tag) and an UpdateItem of the one `STATS#ec2-events` item: for",
            f"{FOREIGN:,} events, {FOREIGN:,} calls against the region's DescribeInstances bucket (100,",
            f"refilled at 20 a second) and {FOREIGN:,} writes to a single partition key.",
        ]
    )
    return "\n".join(
        [
            "## Foreign EC2 events: 1,000 events about unmanaged machines (bench/foreign_events_bench.py)",
            "",
            setup,
            "",
            "| events | count | DescribeInstances | table writes | AWS calls | median per event |",
            "|---|---|---|---|---|---|",
            row("foreign", FOREIGN, calls, seconds),
            row(f"ours ({', '.join(sorted(own_outcomes))})", MANAGED, own_calls, own_seconds),
            "",
            verdict,
            "",
            before,
        ]
    )


def run() -> str:
    load_before = os.getloadavg()[0]
    with bench_stack(log_level="ERROR") as stack:
        use_table(stack)
        machines = managed_fleet()
        at = utcnow() + timedelta(seconds=1)
        foreign = deliver_all(
            [state_change_event(f"i-{n:017x}", "running", region=LOCAL_REGION, at=at) for n in range(FOREIGN)]
        )
        ours = deliver_all([state_change_event(m, "running", region=LOCAL_REGION, at=at) for m in machines])
    return render(foreign, ours, load_before)


if __name__ == "__main__":
    print(run())
