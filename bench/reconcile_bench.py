"""Reconcile and discovery cost at fleet scale, against seed 003's per-worker design.

Figures: AWS API calls per reconcile cycle (by service and operation, counted with botocore's
before-call hooks) at 100 / 1,000 / 10,000 steady RUNNING workers, worker writes per cycle, cycle wall
time, discovery + GC at 10,000, and orphan detection latency by event vs by sweep.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta
from typing import Any

import boto3
from botocore.config import Config

from bench.stack import bench_stack, use_table
from fleetkeeper.cloud.clients import client, reset_clients
from fleetkeeper.cloud.ec2 import DESCRIBE_PAGE_SIZE
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.scale_down import scope_of
from fleetkeeper.domain.sharding import Shard
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE, TEMPLATE_TAG
from fleetkeeper.services import catalog
from fleetkeeper.services.context import Context, build_context, default_context
from fleetkeeper.services.discovery import discover_and_collect
from fleetkeeper.services.reconcile import cycle, reconcile_fleet
from fleetkeeper.settings import Settings, get_settings
from fleetkeeper.store import keys
from fleetkeeper.store.codec import record_attributes, serialize
from fleetkeeper.store.counters import COUNTED_AS, counter_key, status_attribute
from fleetkeeper.store.machine_keys import machine_key_item
from fleetkeeper_local.scheduler import Ec2EventPump
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack

SIZES = (100, 1_000, 10_000)
PER_WORKER_SIZES = (100, 1_000)
ORPHANS_AT_SCALE = 10
LATENCY_SAMPLES = 5
DISCOVERY_INTERVAL_SECONDS = 300  # seed 001


class CallCounter:
    """Counts every AWS API call made through the clients it is attached to."""

    def __init__(self) -> None:
        self.calls: Counter[str] = Counter()
        self.aws_describe_pages = 0

    def attach(self, *clients: Any) -> None:
        for attached in clients:
            events = attached.meta.events
            events.register("before-call.*.*", self._count, unique_id="bench-call-counter")
            events.register(
                "after-call.ec2.DescribeInstances", self._describe_pages, unique_id="bench-describe-pages"
            )

    def _count(self, model: Any, **_: Any) -> None:
        self.calls[f"{model.service_model.service_name}:{model.name}"] += 1

    def _describe_pages(self, parsed: Any, **_: Any) -> None:
        # moto pages DescribeInstances by reservation (a 1,000-instance launch is one reservation);
        # AWS pages by instance, at most 1,000 a page. Count the pages AWS would have served.
        returned = sum(len(r.get("Instances", [])) for r in parsed.get("Reservations", []))
        self.aws_describe_pages += max(1, math.ceil(returned / DESCRIBE_PAGE_SIZE))

    def take(self) -> Counter[str]:
        taken, self.calls = self.calls, Counter()
        if self.aws_describe_pages:
            taken["ec2:DescribeInstances (AWS pages)"] = self.aws_describe_pages
        self.aws_describe_pages = 0
        return taken


def speed_up_moto_tag_lookup() -> None:
    """Make moto's per-resource tag lookup a dict lookup (same result, in this process's moto server).

    moto answers a tag filter by scanning every tag of every resource for each instance, so one
    DescribeInstances page over 10,000 tagged instances costs 10,000 x 20,000 regex matches, and a
    10,000-worker cycle would measure that emulator artefact for half an hour. AWS filters by tag
    server-side; the call count, which is what this benchmark is about, does not change.
    """
    from moto.ec2.models.core import TaggedEC2Resource
    from moto.ec2.utils import EC2_PREFIX_TO_RESOURCE, get_prefix

    def get_tags(self: Any) -> list[dict[str, str]]:
        if not self.id:
            return []
        kind = EC2_PREFIX_TO_RESOURCE.get(get_prefix(self.id), "")
        return [
            {"resource_id": self.id, "key": key, "value": value, "resource_type": kind}
            for key, value in self.ec2_backend.tags.get(self.id, {}).items()
        ]

    TaggedEC2Resource.get_tags = get_tags  # type: ignore[method-assign]


def speed_up_moto_instance_filters() -> None:
    """Make moto's instance-id and literal tag filters set and dict lookups (same result, in this
    process's moto server).

    moto answers DescribeInstances by testing every instance in the region against every filter, on
    every page: an instance-id filter against its list of up to 200 ids, a tag filter through the
    resource's tag list. A reconcile shard reading its 10,000 instances by id in a 30,000-instance
    region would measure 50 x 30,000 x 200 comparisons of the emulator's. AWS indexes both; the
    answers, and the calls counted, do not change.
    """
    import copy

    from moto.ec2.models.instances import InstanceBackend
    from moto.ec2.utils import filter_reservations

    def all_reservations(self: Any, filters: Any = None) -> list[Any]:
        if not filters:
            return [copy.copy(r) for r in self.reservations.copy().values()]
        ids = set(filters["instance-id"]) if "instance-id" in filters else None
        tags = {
            name.removeprefix("tag:"): set(values)
            for name, values in filters.items()
            if name.startswith("tag:") and not any(mark in value for value in values for mark in "*?")
        }
        rest = {
            name: values
            for name, values in filters.items()
            if name != "instance-id" and name.removeprefix("tag:") not in tags
        }

        def wanted(instance: Any) -> bool:
            if ids is not None and instance.id not in ids:
                return False
            own = self.tags.get(instance.id, {})
            return all(own.get(key) in values for key, values in tags.items())

        found = []
        for reservation in self.reservations.copy().values():
            matching = [i for i in reservation.instances if wanted(i)]
            if matching:
                narrowed = copy.copy(reservation)
                narrowed.instances = matching
                found.append(narrowed)
        return filter_reservations(found, rest) if rest else found

    InstanceBackend.all_reservations = all_reservations  # type: ignore[method-assign]


def speed_up_moto_launches() -> None:
    """Make moto's launch of one instance cost the same whatever the region holds (same result, in this
    process's moto server).

    moto gives every launched instance a root volume, and on the way looks the new instance up by
    scanning every instance of the region (`get_instance`) and the new volume up by scanning every
    volume (`describe_volumes` with its one id): building a 100,000-machine fleet, 1,000 a RunInstances,
    would cost 5 x 10^9 comparisons of the emulator's. The instance lookup here scans the newest
    reservations first (a launch's instance is in the last one) and the one-id volume lookup is a dict
    lookup; every answer, error included, is the one moto gives.
    """
    from moto.ec2.exceptions import InvalidInstanceIdError, InvalidVolumeIdError
    from moto.ec2.models.elastic_block_store import EBSBackend
    from moto.ec2.models.instances import InstanceBackend
    from moto.ec2.utils import generic_filter

    def get_instance(self: Any, instance_id: str) -> Any:
        for reservation in reversed(list(self.reservations.values())):
            for instance in reservation.instances:
                if instance.id == instance_id:
                    return instance
        raise InvalidInstanceIdError(instance_id)

    scan_volumes = EBSBackend.describe_volumes

    def describe_volumes(self: Any, volume_ids: list[str] | None = None, filters: Any = None) -> list[Any]:
        if volume_ids is None or len(volume_ids) != 1:
            return scan_volumes(self, volume_ids, filters)
        volume = self.volumes.get(volume_ids[0])
        if volume is None:
            raise InvalidVolumeIdError(set(volume_ids))
        return generic_filter(filters, [volume]) if filters else [volume]

    InstanceBackend.get_instance = get_instance  # type: ignore[method-assign]
    EBSBackend.describe_volumes = describe_volumes  # type: ignore[method-assign]


def page_moto_instances_like_aws() -> None:
    """Make moto page DescribeInstances by instance, as AWS does, instead of by reservation.

    The benchmark launches its fleet 1,000 instances a reservation, and moto's MaxResults counts
    reservations: a 30,000-instance region comes back in one page, whose answer takes the emulator
    longer than the client's 30 s read timeout. AWS serves at most MaxResults instances a page; so
    does this, keeping whole reservations (a page may hold fewer).
    """
    from moto.ec2.responses.instances import ActionResult, InstanceResponse  # type: ignore[attr-defined]

    def describe_instances(self: Any) -> Any:
        self.error_on_dryrun()
        filters = self._filters_from_querystring()
        instance_ids = self._get_param("InstanceIds", [])
        if instance_ids:
            reservations = self.ec2_backend.get_reservations_by_instance_ids(instance_ids, filters=filters)
        else:
            reservations = self.ec2_backend.describe_instances(filters=filters)
        token = self._get_param("NextToken")
        start = [r.id for r in reservations].index(token) + 1 if token else 0
        limit = int(self._get_param("MaxResults", 1000))
        page: list[Any] = []
        held = 0
        for reservation in reservations[start:]:
            if page and held + len(reservation.instances) > limit:
                break
            page.append(reservation)
            held += len(reservation.instances)
        more = start + len(page) < len(reservations)
        return ActionResult({"Reservations": page, "NextToken": page[-1].id if more else None})

    InstanceResponse.describe_instances = describe_instances  # type: ignore[method-assign]


@contextmanager
def fleet_stack() -> Iterator[LocalStack]:
    """The local stack for a benchmark of large steady fleets: `bench_stack` with moto's region-wide
    scans (tag lookup, instance filters, launches) swapped for lookups and DescribeInstances paged by
    instance, as AWS pages it. The patches stay for the process: the answers do not change."""
    speed_up_moto_tag_lookup()
    speed_up_moto_instance_filters()
    speed_up_moto_launches()
    page_moto_instances_like_aws()
    with bench_stack() as stack:
        yield stack


# A cycle that hit any of these did not do the steady fleet's work (an emulator answer timed out, say):
# its time is not a figure, and the workers it backed off would skew the next cycles.
NOT_STEADY = ("worker_errors", "region_unavailable", "backoff_waiting", "deferred", "conflicts")


def steady(report: cycle.CycleReport) -> None:
    """Stop the benchmark when a cycle did not do what a steady cycle does."""
    if not (report.lease_acquired and report.completed) or any(report.counters[n] for n in NOT_STEADY):
        raise RuntimeError(f"not a steady cycle, so not a figure: {report.as_dict()}")


def warmed_up(ctx: Context, shard: Shard) -> Context:
    """`ctx` on a stage configured for the shard's split, after one steady warm-up cycle of the shard
    (first touches, cold client pools): the context to time the shard's cycles with."""
    ctx = replace(ctx, settings=ctx.settings.model_copy(update={"reconcile_shards": shard.count}))
    steady(reconcile_fleet(ctx, shard=shard))
    return ctx


def context(**overrides: str) -> Context:
    return build_context(Settings.from_environ({**os.environ, **overrides}))


def launch_machines(ec2: Any, image: str, size: int, template: str = "bench") -> list[dict[str, Any]]:
    """`size` emulated machines tagged as the reconciler tags its launches, 1,000 a RunInstances."""
    instances: list[dict[str, Any]] = []
    while len(instances) < size:
        count = min(1000, size - len(instances))
        instances += ec2.run_instances(
            ImageId=image,
            InstanceType="m5.large",
            MinCount=count,
            MaxCount=count,
            TagSpecifications=[
                {
                    "ResourceType": "instance",
                    "Tags": [
                        {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
                        {"Key": TEMPLATE_TAG, "Value": template},
                    ],
                }
            ],
        )["Instances"]
    return instances


def build_fleet(stack: LocalStack, size: int) -> tuple[Context, list[Worker]]:
    """`size` RUNNING workers, each on its own emulated EC2 instance, written straight to the table."""
    stack.reset_moto()
    use_table(stack, f"bench-{size}")
    ctx = context()
    # A launch of 1,000 emulated instances can outlast botocore's 60 s read timeout on a busy machine,
    # and a retried RunInstances would launch them twice: wait for the answer instead.
    ec2 = boto3.client("ec2", config=Config(read_timeout=900, retries={"total_max_attempts": 1}))
    image = ec2.register_image(Name="bench-2026.01", RootDeviceName="/dev/sda1")["ImageId"]
    catalog.put_template(
        ctx.store,
        WorkerTemplate(name="bench", instance_type="m5.large", ami_name_filter="bench-*", capacity=4),
        actor="bench",
    )
    instances = launch_machines(ec2, image, size)
    now = utcnow()
    fleet = [
        Worker(
            id=f"w-{n:016x}",
            template="bench",
            region=LOCAL_REGION,
            status=WorkerStatus.RUNNING,
            ec2_instance_id=raw["InstanceId"],
            private_ip=raw.get("PrivateIpAddress"),
            capacity=4,
            ec2_state="running",
            ec2_observed_at=now,
            version=3,
        )
        for n, raw in enumerate(instances)
    ]
    write_fleet(ctx, fleet)
    return ctx, fleet


def write_fleet(ctx: Context, fleet: list[Worker], *, legacy: bool = False) -> None:
    """Store workers as the store's own writes leave them (index attributes, counted in their cell, with
    their machine's key item) and their counter items, with BatchWriteItem: far faster than one
    transaction each. `legacy`: with the legacy index attributes too, as writes leave them while a table
    is migrated."""
    items = [
        {
            **keys.worker_key(w.id),
            **keys.worker_index_attributes(w, legacy=legacy),
            **record_attributes(w),
            COUNTED_AS: keys.counted_cell(w),
        }
        for w in fleet
    ]
    counts: defaultdict[tuple[str, str], Counter[WorkerStatus]] = defaultdict(Counter)
    scopes: dict[tuple[str, str], str] = {}
    for worker in fleet:
        key = counter_key(scope_of(worker), worker.id)
        slot = (key["PK"]["S"], key["SK"]["S"])
        counts[slot][worker.status] += 1
        scopes[slot] = scope_of(worker)
    items += [
        {
            "PK": pk,
            "SK": sk,
            "scope": scopes[(pk, sk)],
            **{status_attribute(status): n for status, n in by_status.items()},
        }
        for (pk, sk), by_status in counts.items()
    ]
    # Each machine's key item, as the store writes it beside the worker (store/machine_keys.py).
    items += [item for item in map(machine_key_item, fleet) if item is not None]
    dynamodb = ctx.store._client
    for start in range(0, len(items), 25):
        requests = [{"PutRequest": {"Item": serialize(item)}} for item in items[start : start + 25]]
        pending: dict[str, Any] = {ctx.settings.table_name: requests}
        while pending:
            pending = dynamodb.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}


def counted_clients() -> list[Any]:
    return [
        client("dynamodb"),
        client("ec2", LOCAL_REGION),
        client("cloudwatch", LOCAL_REGION),
        client("events"),
    ]


def worker_versions(ctx: Context) -> dict[str, int]:
    return {w.id: w.version for w in ctx.store.iter_workers_by_status([WorkerStatus.RUNNING])}


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def per_worker_cycle(ctx: Context, fleet: list[Worker]) -> None:
    """Seed 003's shape: per RUNNING worker, read its EC2 state, read its metrics, report them."""
    ec2 = ctx.ec2(LOCAL_REGION)
    cloudwatch = client("cloudwatch", LOCAL_REGION)
    now = utcnow()
    for worker in fleet:
        ec2.describe([worker.ec2_instance_id or ""])
        cloudwatch.get_metric_data(
            MetricDataQueries=[
                {
                    "Id": f"m{n}",
                    "MetricStat": {
                        "Metric": {
                            "Namespace": namespace,
                            "MetricName": metric,
                            "Dimensions": [{"Name": "InstanceId", "Value": worker.ec2_instance_id}],
                        },
                        "Period": 60,
                        "Stat": "Maximum",
                    },
                }
                for n, (namespace, metric) in enumerate(
                    [
                        ("AWS/EC2", "CPUUtilization"),
                        ("CWAgent", "mem_used_percent"),
                        ("CWAgent", "disk_used_percent"),
                    ]
                )
            ],
            StartTime=now - timedelta(minutes=5),
            EndTime=now,
        )
        current = ctx.store.get_worker(worker.id)
        ctx.store.update_worker(
            current, {"private_ip": current.private_ip}, actor="seed-003", action="MetricsReported"
        )


def fmt_calls(calls: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(calls.items()))


def aws_calls(calls: Counter[str]) -> int:
    """Calls as AWS would count them: DescribeInstances by its AWS pages, everything else as made."""
    made = sum(count for name, count in calls.items() if name != "ec2:DescribeInstances (AWS pages)")
    if "ec2:DescribeInstances (AWS pages)" in calls:
        made += calls["ec2:DescribeInstances (AWS pages)"] - calls["ec2:DescribeInstances"]
    return made


def service_total(calls: Counter[str], service: str) -> int:
    return sum(count for name, count in calls.items() if name.startswith(f"{service}:"))


def worker_writes(before: dict[str, int], after: dict[str, int]) -> int:
    return sum(1 for worker_id, version in after.items() if before.get(worker_id) != version)


def measure_reconcile(
    stack: LocalStack, counter: CallCounter
) -> tuple[list[dict[str, Any]], tuple[Context, list[Worker]]]:
    rows: list[dict[str, Any]] = []
    ctx, fleet = build_fleet(stack, 0)
    for size in SIZES:
        ctx, fleet = build_fleet(stack, size)
        counter.attach(*counted_clients())
        reconcile_fleet(ctx)  # warm-up: first touches, cold client pools
        counter.take()
        before = worker_versions(ctx)
        report, seconds = timed(lambda ctx=ctx: reconcile_fleet(ctx))  # type: ignore[misc]
        calls = counter.take()
        after = worker_versions(ctx)
        row: dict[str, Any] = {
            "size": size,
            "calls": calls,
            "seconds": seconds,
            "writes": worker_writes(before, after),
            "outcomes": report.counters["outcome_success"],
        }
        if size in PER_WORKER_SIZES:
            _, per_worker_seconds = timed(lambda ctx=ctx, fleet=fleet: per_worker_cycle(ctx, fleet))  # type: ignore[misc]
            row["per_worker_calls"] = counter.take()
            row["per_worker_seconds"] = per_worker_seconds
        rows.append(row)
        print(
            f"reconcile {size:>6} workers: {seconds:6.2f}s, {aws_calls(calls)} calls on AWS "
            f"({fmt_calls(calls)}), "
            f"{row['writes']} worker writes",
            flush=True,
        )
    return rows, (ctx, fleet)


def measure_discovery(ctx: Context, fleet: list[Worker], counter: CallCounter) -> dict[str, Any]:
    """Discovery + GC over the largest steady fleet, with a few of its machines gone."""
    ec2 = boto3.client("ec2")
    ec2.terminate_instances(InstanceIds=[w.ec2_instance_id or "" for w in fleet[:ORPHANS_AT_SCALE]])
    counter.take()
    report, seconds = timed(lambda: discover_and_collect(ctx))
    calls = counter.take()
    print(f"discovery {len(fleet)} workers: {seconds:.2f}s, {fmt_calls(calls)}", flush=True)
    return {
        "size": len(fleet),
        "seconds": seconds,
        "calls": calls,
        "orphans": report.counters["orphans_terminated"],
    }


def measure_event_latency(stack: LocalStack) -> list[float]:
    """Seconds from TerminateInstances to a TERMINATED worker, through the EC2 event pump."""
    ctx, fleet = build_fleet(stack, 20)
    get_settings.cache_clear()
    default_context.cache_clear()
    reset_clients()
    pump = Ec2EventPump(boto3.client("ec2"))
    pump.poll_once()  # baseline
    pump.start()
    ec2 = boto3.client("ec2")
    samples: list[float] = []
    try:
        for worker in fleet[:LATENCY_SAMPLES]:
            started = time.perf_counter()
            ec2.terminate_instances(InstanceIds=[worker.ec2_instance_id or ""])
            while ctx.store.get_worker(worker.id).status != WorkerStatus.TERMINATED:
                if time.perf_counter() - started > 30:
                    raise RuntimeError(f"worker {worker.id} not TERMINATED within 30s")
                time.sleep(0.02)
            samples.append(time.perf_counter() - started)
    finally:
        pump.stop()
    print(f"event path latency: {', '.join(f'{s:.2f}s' for s in samples)}", flush=True)
    return samples


def section(rows: list[dict[str, Any]], discovery: dict[str, Any], latency: list[float]) -> str:
    lines = [
        "## Reconcile and discovery (bench/reconcile_bench.py)",
        "",
        "Steady fleet: every worker RUNNING on a running instance, nothing to change. Metrics are read for",
        "each worker once per `METRICS_INTERVAL_SECONDS` (300 s, spread over the five 1-minute cycles), so a",
        "cycle reads a fifth of the fleet's metrics. Calls are counted with botocore `before-call` hooks on",
        "the clients the services use; the cycle also takes and releases its lease and stores its counters",
        "(1 PutItem + 2 UpdateItem, whatever the fleet size). moto's tag filter is quadratic in the number",
        "of tagged resources; the benchmark swaps its tag lookup for a dict lookup (same answers) so that",
        "wall times show fleetkeeper's cost, not the emulator's.",
        "",
        "### AWS API calls per reconcile cycle",
        "",
        "| workers | EC2 DescribeInstances on AWS (moto) | goal ceil(N/1000)+1 | CloudWatch GetMetricData "
        "| DynamoDB | worker writes | wall time |",
        "|--------:|------------------:|------:|------:|------:|------:|------:|",
    ]
    for row in rows:
        calls = row["calls"]
        lines.append(
            f"| {row['size']:,} | {calls['ec2:DescribeInstances (AWS pages)']} "
            f"({calls['ec2:DescribeInstances']}) | {math.ceil(row['size'] / 1000) + 1} | "
            f"{service_total(calls, 'cloudwatch')} | {service_total(calls, 'dynamodb')} | {row['writes']} | "
            f"{row['seconds']:.2f} s |"
        )
    lines += [
        "",
        "By operation (`ec2:DescribeInstances` is what moto answered; `(AWS pages)` what AWS would serve at",
        "1,000 instances a page, which is the figure in the table):",
        "",
    ]
    for row in rows:
        lines.append(f"- {row['size']:,} workers: {fmt_calls(row['calls'])}")
    lines += [
        "",
        "### Beside seed 003's per-worker design",
        "",
        "Seed 003 reconciles one worker at a time: per RUNNING worker one DescribeInstances, one metrics",
        "read and one metrics report (a read and a conditional write), every cycle. The same loop, run",
        "here on the same fleet (calls counted as AWS would serve them):",
        "",
        "| workers | per-worker calls | per-worker wall time | fleetkeeper calls | fleetkeeper wall time |",
        "|--------:|-----------------:|---------------------:|------------------:|----------------------:|",
    ]
    for row in rows:
        ours = aws_calls(row["calls"])
        if "per_worker_calls" in row:
            theirs = f"{aws_calls(row['per_worker_calls']):,}"
            theirs_time = f"{row['per_worker_seconds']:.2f} s"
        else:
            theirs = f"{4 * row['size']:,} (4 per worker as measured, not run)"
            theirs_time = "not run (linear: ~10x the 1,000 row)"
        lines.append(f"| {row['size']:,} | {theirs} | {theirs_time} | {ours:,} | {row['seconds']:.2f} s |")
    discovery_calls = discovery["calls"]
    median = statistics.median(latency)
    lines += [
        "",
        "### Discovery + orphan GC",
        "",
        f"{discovery['size']:,} workers, {ORPHANS_AT_SCALE} of their machines terminated: "
        f"{discovery['orphans']} orphans terminated in {discovery['seconds']:.2f} s with "
        f"{fmt_calls(discovery_calls)}.",
        "",
        "### Orphan detection latency",
        "",
        "| path | latency |",
        "|------|---------|",
        f"| EC2 state-change event (local pump polls every 1 s) | median {median:.2f} s, "
        f"max {max(latency):.2f} s "
        f"over {len(latency)} terminations |",
        f"| discovery sweep (seed 001, every {DISCOVERY_INTERVAL_SECONDS // 60} min) | up to "
        f"{DISCOVERY_INTERVAL_SECONDS} s + {discovery['seconds']:.0f} s run, "
        f"{DISCOVERY_INTERVAL_SECONDS // 2} s on "
        "average |",
        "",
        "On AWS the event path has no poll: EventBridge delivers the state change to the ec2_events",
        "function, typically within seconds. The sweep stays as the safety net for lost events.",
        "",
        "### Reading the figures",
        "",
        "- EC2: up to 200 ids are read with one instance-id filter; beyond that the managed-by tag lists",
        "  1,000 instances a page, and only ids it missed are read by id. Seed 003 makes one call per",
        "  worker.",
        "- DynamoDB reads are Query pages of the status index (one per status, ~1 MB a page); a steady",
        "  worker costs no write. Seed 003 reports metrics with a write per worker per cycle.",
        "- One invocation handles 10,000 workers inside the 1-minute rate; past the largest fleet one cycle",
        '  serves (section "Reconcile scaling and shards") the cycle shards by a hash of the worker id. The',
        "  lease makes an overrunning cycle skip the next tick instead of running twice. Work that",
        "  changes workers runs on 16 threads and stops 10 s before the invocation's deadline (the rest is",
        "  requeued), so a burst of launches degrades into more cycles, never into a timeout.",
    ]
    return "\n".join(lines)


def run() -> str:
    speed_up_moto_tag_lookup()
    with bench_stack() as stack:
        counter = CallCounter()
        rows, (largest_ctx, largest_fleet) = measure_reconcile(stack, counter)
        discovery = measure_discovery(largest_ctx, largest_fleet, counter)
        latency = measure_event_latency(stack)
    return section(rows, discovery, latency)
