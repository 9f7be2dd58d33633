"""What the control plane costs to run, at list prices, beside the seeds' polling designs.

Every figure is built from operations counted in this run on the local stack, priced with bench/prices.py:
- DynamoDB read and write units: DynamoDB Local's own ConsumedCapacity, asked for on every call;
- Step Functions transitions: `*StateEntered` events in each drain's execution history;
- Lambda requests and duration: each task invocation timed in-process, billed at the function's memory
  (infra/functions.py), Arm prices;
- EventBridge events, SNS messages, GetMetricData metrics: counted with botocore hooks;
- CloudWatch alarms: counted in the synthesized dev stack; custom metrics: distinct names emitted.

The seeds' designs are priced the same way: a drain checker that polls every 10 s (Wait → Task → Choice,
one consistent worker read per poll) and a reconciler that makes per-worker calls every 30 s (one worker
read, one GetMetricData of three metrics and one worker write per worker), with their per-call costs
measured here too. A 10,000-worker cycle is extrapolated linearly from the 100 and 1,000 runs (the cost
per worker is flat; bench/results/reconcile.md measures the 10,000 cycle itself).
"""

from __future__ import annotations

import math
import statistics
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import boto3

from bench import prices
from bench.drain_bench import running_worker, wait_for
from bench.reconcile_bench import build_fleet, per_worker_cycle, speed_up_moto_tag_lookup
from bench.stack import bench_stack
from fleetkeeper.cloud.clients import client, reset_clients
from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.observability import metrics
from fleetkeeper.services import catalog, drains, instances, placement
from fleetkeeper.services.context import default_context
from fleetkeeper.services.discovery import discover_and_collect
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper_local import lambdas
from fleetkeeper_local.controlplane import activate, provision
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack

DRAINS = 10
DRAIN_HOURS = 4
SEED_POLL_SECONDS = 10
SEED_RECONCILE_SECONDS = 30
RECONCILE_PERIOD_SECONDS = 60
DISCOVERY_PERIOD_SECONDS = 300
FLEETS = (100, 1_000)
EXTRAPOLATED = 10_000
# Memory of each function (infra/functions.py); Lambda bills duration by it.
MEMORY_MB = {"api": 512, "drain_tasks": 256, "reconcile": 1024, "discover": 512, "ec2_events": 256}
# The seeds' reconcilers ran in one function like ours; billed at the same memory.
SEED_MEMORY_MB = MEMORY_MB["reconcile"]


@dataclass
class Usage:
    """Billable operations, as counted."""

    read_units: float = 0.0
    write_units: float = 0.0
    transitions: float = 0
    lambda_requests: float = 0
    lambda_gb_seconds: float = 0.0
    events: float = 0
    sns_messages: float = 0
    metrics_read: float = 0
    api_requests: float = 0
    scheduler_invocations: float = 0
    calls: Counter[str] = field(default_factory=Counter)

    def scaled(self, factor: float) -> Usage:
        # Floats throughout: an extrapolation's per-worker slope is often a fraction of one operation.
        return Usage(
            self.read_units * factor,
            self.write_units * factor,
            self.transitions * factor,
            self.lambda_requests * factor,
            self.lambda_gb_seconds * factor,
            self.events * factor,
            self.sns_messages * factor,
            self.metrics_read * factor,
            self.api_requests * factor,
            self.scheduler_invocations * factor,
        )

    def plus(self, other: Usage) -> Usage:
        return Usage(
            self.read_units + other.read_units,
            self.write_units + other.write_units,
            self.transitions + other.transitions,
            self.lambda_requests + other.lambda_requests,
            self.lambda_gb_seconds + other.lambda_gb_seconds,
            self.events + other.events,
            self.sns_messages + other.sns_messages,
            self.metrics_read + other.metrics_read,
            self.api_requests + other.api_requests,
            self.scheduler_invocations + other.scheduler_invocations,
        )

    def dollars(self) -> dict[str, float]:
        return {
            "DynamoDB": self.read_units * prices.DDB_READ_UNIT + self.write_units * prices.DDB_WRITE_UNIT,
            "Step Functions": self.transitions * prices.SFN_TRANSITION,
            "Lambda": self.lambda_requests * prices.LAMBDA_REQUEST
            + self.lambda_gb_seconds * prices.LAMBDA_GB_SECOND_ARM,
            "EventBridge + Scheduler": self.events * prices.EVENTBRIDGE_EVENT
            + self.scheduler_invocations * prices.SCHEDULER_INVOCATION,
            "API Gateway": self.api_requests * prices.API_GATEWAY_REQUEST,
            "CloudWatch GetMetricData": self.metrics_read * prices.CW_GET_METRIC_DATA_METRIC,
            "SNS": self.sns_messages * prices.SNS_PUBLISH,
        }

    def total(self) -> float:
        return sum(self.dollars().values())


class Meter:
    """Counts billable work on the process's shared clients with botocore hooks."""

    def __init__(self) -> None:
        self.usage = Usage()

    def attach(self) -> None:
        dynamodb = client("dynamodb")
        dynamodb.meta.events.register(
            "provide-client-params.dynamodb.*", self._ask_capacity, unique_id="cost-ask-capacity"
        )
        dynamodb.meta.events.register("after-call.dynamodb.*", self._capacity, unique_id="cost-capacity")
        for service, region in (("events", None), ("sns", None), ("cloudwatch", LOCAL_REGION)):
            client(service, region).meta.events.register(
                "after-call.*.*", self._count, unique_id=f"cost-count-{service}"
            )

    @staticmethod
    def _ask_capacity(params: dict[str, Any], **_: Any) -> None:
        params.setdefault("ReturnConsumedCapacity", "TOTAL")

    def _capacity(self, parsed: dict[str, Any], model: Any, **_: Any) -> None:
        consumed = parsed.get("ConsumedCapacity")
        entries = consumed if isinstance(consumed, list) else [consumed] if consumed else []
        units = sum(float(entry.get("CapacityUnits", 0)) for entry in entries)
        if model.name in ("GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems"):
            self.usage.read_units += units
        else:
            self.usage.write_units += units
        self.usage.calls[f"dynamodb:{model.name}"] += 1

    def _count(self, model: Any, params: Any = None, **kwargs: Any) -> None:
        name = f"{model.service_model.service_name}:{model.name}"
        self.usage.calls[name] += 1

    def take(self) -> Usage:
        taken, self.usage = self.usage, Usage()
        taken.events = taken.calls["events:PutEvents"]
        taken.sns_messages = taken.calls["sns:Publish"]
        return taken


@contextmanager
def timed_tasks() -> Iterator[list[float]]:
    """Time each drain-task invocation the local Lambda dispatcher serves."""
    durations: list[float] = []
    dispatcher = lambdas.dispatcher
    original = dispatcher.invoke

    def invoke(function_name: str, body: Any, response_headers: dict[str, Any]) -> bytes:
        started = time.perf_counter()
        try:
            return original(function_name, body, response_headers)
        finally:
            durations.append(time.perf_counter() - started)

    dispatcher.invoke = invoke  # type: ignore[method-assign]
    try:
        yield durations
    finally:
        dispatcher.invoke = original  # type: ignore[method-assign]


def gb_seconds(seconds: float, memory_mb: int) -> float:
    # Lambda bills duration in 1 ms steps.
    return math.ceil(seconds * 1000) / 1000 * memory_mb / 1024


def transitions(execution_arn: str) -> int:
    history = boto3.client("stepfunctions").get_execution_history(executionArn=execution_arn, maxResults=1000)
    return sum(1 for event in history["events"] if event["type"].endswith("StateEntered"))


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


@dataclass
class DrainFigures:
    fleetkeeper: Usage
    polling: Usage
    poll_read_units: float
    poll_task_seconds: float


def measure_drains(stack: LocalStack, meter: Meter) -> DrainFigures:
    """DRAINS natural drains (one instance each), as an operator and a workload drive them."""
    resources = provision(stack, f"fk-cost-{uuid.uuid4().hex[:8]}")
    activate(resources, heartbeat_seconds=300)
    ctx = default_context()
    catalog.put_template(
        ctx.store,
        WorkerTemplate(name="bench", instance_type="m5.large", ami_name_filter="bench-*", capacity=4),
        actor="bench",
    )
    meter.attach()
    total = Usage()
    task_seconds: list[float] = []
    for _ in range(DRAINS):
        worker = running_worker(ctx)
        instance = placement.place_instance(ctx.store, actor="bench", worker_id=worker.id)
        meter.take()
        with timed_tasks() as durations:
            (_, start_seconds) = timed(partial(drains.start_worker_drain, ctx, worker.id, actor="bench"))
            wait_for(lambda w=worker: (d := ctx.store.get_worker(w.id).drain) is not None and d.task_token)
            (_, end_seconds) = timed(
                partial(
                    instances.change_instance_state, ctx, instance.id, InstanceState.COMPLETED, actor="bench"
                )
            )
            wait_for(lambda w=worker: ctx.store.get_worker(w.id).status is WorkerStatus.STOPPING)
            time.sleep(0.05)  # the last step's answer is on its way back to the interpreter
        used = meter.take()
        record = ctx.store.get_worker(worker.id).drain
        assert record is not None
        assert record.execution_arn
        used.transitions = transitions(record.execution_arn)
        used.lambda_requests = len(durations) + 2  # the task invocations, plus the two API calls
        used.api_requests = 2
        used.lambda_gb_seconds = sum(gb_seconds(s, MEMORY_MB["drain_tasks"]) for s in durations) + (
            gb_seconds(start_seconds, MEMORY_MB["api"]) + gb_seconds(end_seconds, MEMORY_MB["api"])
        )
        task_seconds.extend(durations)
        total = total.plus(used)
    per_drain = total.scaled(1 / DRAINS)

    # One poll of the seeds' checker: a consistent read of the worker, in a task of the same length.
    worker = running_worker(ctx)
    meter.take()
    ctx.store.get_worker(worker.id)
    poll_read = meter.take().read_units
    polls = DRAIN_HOURS * 3600 // SEED_POLL_SECONDS
    poll_seconds = statistics.median(task_seconds)
    polling = Usage(
        read_units=polls * poll_read,
        write_units=per_drain.write_units,  # it ends the drain with the same writes
        transitions=polls * 3,  # Wait -> Task -> Choice
        lambda_requests=polls + 2,
        lambda_gb_seconds=polls * gb_seconds(poll_seconds, MEMORY_MB["drain_tasks"]),
        events=per_drain.events,
        api_requests=2,
    )
    return DrainFigures(per_drain, polling, poll_read, poll_seconds)


@dataclass
class FleetFigures:
    size: int
    cycle: Usage
    cycle_seconds: float
    discovery: Usage
    seed_cycle: Usage
    seed_cycle_seconds: float
    extrapolated: bool = False


def measure_fleet(stack: LocalStack, meter: Meter, size: int) -> FleetFigures:
    ctx, fleet = build_fleet(stack, size)
    reset_clients()
    meter.attach()
    reconcile_fleet(ctx)  # warm-up
    meter.take()
    _, seconds = timed(lambda: reconcile_fleet(ctx))
    cycle = meter.take()
    cycle.metrics_read = cycle.calls.get("cloudwatch:GetMetricData", 0) and _metrics_requested(ctx, size)
    cycle.lambda_requests = 1
    cycle.scheduler_invocations = 1
    cycle.lambda_gb_seconds = gb_seconds(seconds, MEMORY_MB["reconcile"])
    _, discovery_seconds = timed(lambda: discover_and_collect(ctx))
    discovery = meter.take()
    discovery.lambda_requests = 1
    discovery.scheduler_invocations = 1
    discovery.lambda_gb_seconds = gb_seconds(discovery_seconds, MEMORY_MB["discover"])
    _, seed_seconds = timed(lambda: per_worker_cycle(ctx, fleet))
    seed = meter.take()
    seed.metrics_read = 3 * size
    seed.lambda_requests = 1
    seed.scheduler_invocations = 1
    seed.lambda_gb_seconds = gb_seconds(seed_seconds, SEED_MEMORY_MB)
    print(f"cost: {size} workers, cycle {seconds:.2f}s, seed-style cycle {seed_seconds:.2f}s", flush=True)
    return FleetFigures(size, cycle, seconds, discovery, seed, seed_seconds)


def _metrics_requested(ctx: Any, size: int) -> int:
    """Metrics one cycle asks GetMetricData for: three per worker whose metrics are due this cycle."""
    interval = ctx.settings.metrics_interval_seconds
    buckets = max(1, math.ceil(interval / RECONCILE_PERIOD_SECONDS)) if interval > 0 else 0
    return 3 * math.ceil(size / buckets) if buckets else 0


def extrapolate(small: FleetFigures, large: FleetFigures, size: int) -> FleetFigures:
    """The cost per worker between two measured fleets, carried to `size` (plus the fixed part)."""

    def line(a: Usage, b: Usage) -> Usage:
        slope = b.plus(a.scaled(-1)).scaled(1 / (large.size - small.size))
        return b.plus(slope.scaled(size - large.size))

    def seconds(a: float, b: float) -> float:
        return b + (b - a) / (large.size - small.size) * (size - large.size)

    return FleetFigures(
        size,
        line(small.cycle, large.cycle),
        seconds(small.cycle_seconds, large.cycle_seconds),
        line(small.discovery, large.discovery),
        line(small.seed_cycle, large.seed_cycle),
        seconds(small.seed_cycle_seconds, large.seed_cycle_seconds),
        extrapolated=True,
    )


def fixed_monthly() -> tuple[int, int, float]:
    """Alarms and SnapStart functions in the synthesized dev stack, custom metric names emitted; their
    monthly dollars."""
    import json
    from pathlib import Path

    from aws_cdk import App
    from aws_cdk.assertions import Template

    from infra.config import STAGE_KEY, load_stage_config
    from infra.stack import FleetkeeperStack

    context = json.loads((Path(__file__).parents[1] / "cdk.json").read_text())["context"]
    app = App(context={**context, STAGE_KEY: "dev"})
    stack = FleetkeeperStack(app, config=load_stage_config(app.node.try_get_context))
    template = Template.from_stack(stack)
    alarms = len(template.find_resources("AWS::CloudWatch::Alarm"))
    names = len(_emitted_metric_names)
    # One active published version per SnapStart function keeps a snapshot cached all month.
    snapshot_gb = sum(
        function["Properties"]["MemorySize"] / 1024
        for function in template.find_resources("AWS::Lambda::Function").values()
        if "SnapStart" in function["Properties"]
    )
    snapshots = snapshot_gb * prices.SECONDS_PER_MONTH * prices.SNAPSTART_CACHE_GB_SECOND
    return alarms, names, alarms * prices.CW_ALARM_MONTH + names * prices.CW_METRIC_MONTH + snapshots


_emitted_metric_names: set[str] = set()


def record_metric_names() -> None:
    original = metrics.add_metric

    def add_metric(name: str, *args: Any, **kwargs: Any) -> None:
        _emitted_metric_names.add(name)
        original(name, *args, **kwargs)

    metrics.add_metric = add_metric  # type: ignore[method-assign]


def monthly(figures: FleetFigures) -> tuple[Usage, Usage]:
    ours = figures.cycle.scaled(prices.SECONDS_PER_MONTH / RECONCILE_PERIOD_SECONDS).plus(
        figures.discovery.scaled(prices.SECONDS_PER_MONTH / DISCOVERY_PERIOD_SECONDS)
    )
    seeds = figures.seed_cycle.scaled(prices.SECONDS_PER_MONTH / SEED_RECONCILE_SECONDS).plus(
        figures.discovery.scaled(prices.SECONDS_PER_MONTH / DISCOVERY_PERIOD_SECONDS)
    )
    return ours, seeds


def money(value: float) -> str:
    if value >= 100:
        return f"${value:,.0f}"
    if value >= 1:
        return f"${value:,.2f}"
    return f"${value:.4f}"


def section(drain: DrainFigures, fleets: list[FleetFigures], fixed: tuple[int, int, float]) -> str:
    ours_1000 = drain.fleetkeeper.scaled(1000)
    seed_1000 = drain.polling.scaled(1000)
    lines = [
        "## Cost model at list prices (bench/cost_bench.py)",
        "",
        f"Prices: {prices.PRICES_AS_OF}, in bench/prices.py. Operations counted in this run on the local",
        "stack: DynamoDB units as DynamoDB Local reports them, Step Functions transitions from execution",
        "histories, Lambda invocations timed in-process and billed at the function's memory (Arm). Those",
        "wall times come from a shared 2-core machine, so the Lambda figures are an upper bound.",
        "",
        f"### $ per 1,000 drains of {DRAIN_HOURS} h",
        "",
        "| design | transitions / drain | Lambda requests / drain | DynamoDB RRU / WRU per drain "
        "| $ per 1,000 drains |",
        "|---|--:|--:|--:|--:|",
        f"| fleetkeeper: callback token | {drain.fleetkeeper.transitions:.0f} | "
        f"{drain.fleetkeeper.lambda_requests:.0f} | {drain.fleetkeeper.read_units:.1f} / "
        f"{drain.fleetkeeper.write_units:.1f} | {money(ours_1000.total())} |",
        f"| drain checker polling every {SEED_POLL_SECONDS} s | {drain.polling.transitions:,.0f} | "
        f"{drain.polling.lambda_requests:,.0f} | {drain.polling.read_units:,.0f} / "
        f"{drain.polling.write_units:.1f} | {money(seed_1000.total())} |",
        "",
        f"Goal: the callback design costs less than a tenth of the poller. Ratio this run: "
        f"{seed_1000.total() / max(ours_1000.total(), 1e-12):,.0f}x cheaper "
        f"({'met' if ours_1000.total() * 10 <= seed_1000.total() else 'not met'}). A drain's transitions do "
        "not grow with its length (the wait is one Task state; the reconciler's heartbeats are API calls, "
        "not transitions), so the callback figure holds for any drain length.",
        "",
        "By service, per 1,000 drains: "
        + ", ".join(f"{name} {money(value)}" for name, value in ours_1000.dollars().items() if value)
        + ".",
        "",
        "### $ per month to run the control plane",
        "",
        f"Reconcile every {RECONCILE_PERIOD_SECONDS} s, discovery every {DISCOVERY_PERIOD_SECONDS} s; the "
        f"seeds' design reconciles each worker every {SEED_RECONCILE_SECONDS} s with per-worker calls. "
        f"Fixed part: {fixed[0]} alarms, {fixed[1]} custom metric names and the api function's SnapStart "
        f"snapshot, {money(fixed[2])} a month, in "
        "both columns. Operator API traffic and drains come on top (priced above).",
        "",
        "| workers | cycle wall time | fleetkeeper $ / month | seeds' design $ / month | ratio | "
        "fleetkeeper by service |",
        "|--:|--:|--:|--:|--:|---|",
    ]
    for figures in fleets:
        ours, seeds = monthly(figures)
        ours_total = ours.total() + fixed[2]
        seeds_total = seeds.total() + fixed[2]
        by_service = ", ".join(f"{n} {money(v)}" for n, v in ours.dollars().items() if v >= 0.005)
        marker = " (extrapolated)" if figures.extrapolated else ""
        lines.append(
            f"| {figures.size:,}{marker} | {figures.cycle_seconds:.2f} s | {money(ours_total)} | "
            f"{money(seeds_total)} | {seeds_total / max(ours_total, 1e-12):.1f}x | {by_service} |"
        )
    lines += [
        "",
        "Most of the per-worker cost is CloudWatch GetMetricData ($0.01 per 1,000 metrics): fleetkeeper",
        "reads each worker's three metrics once per `METRICS_INTERVAL_SECONDS` (300 s by default), the",
        "seeds' design every 30 s. Setting the interval to 0 turns metric reads off (idle scale-down then",
        "has no CPU signal). A seeds'-design cycle over 10,000 workers cannot finish in its 30 s period",
        "from one process; its figure prices the calls, not a working schedule.",
    ]
    return "\n".join(lines) + "\n"


def run() -> str:
    speed_up_moto_tag_lookup()
    record_metric_names()
    with bench_stack(metrics=True) as stack:
        meter = Meter()
        drain = measure_drains(stack, meter)
        fleets = [measure_fleet(stack, meter, size) for size in FLEETS]
        fleets.append(extrapolate(fleets[0], fleets[1], EXTRAPOLATED))
    return section(drain, fleets, fixed_monthly())


if __name__ == "__main__":
    print(run())
