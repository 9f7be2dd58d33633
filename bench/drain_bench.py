"""Drain benchmarks on the local stack (DynamoDB Local + moto Step Functions running our ASL file).

1. Completion latency: the worker's last instance ends → the worker is STOPPING. fleetkeeper's callback
   design against a polling checker (seed 004 polls every 10 s), both measured in this run on the same
   store. The polling baseline runs with a short interval to keep the run short; its latency scales with
   the interval (about half of it on average), which the table states for 10 s.
2. State transitions per drain, counted from the execution history: a drain that finishes in seconds and
   one that runs to its timeout, against a polling loop (Wait → Task → Choice every 10 s) for a 4 h drain.

Run: `make bench` (all benchmarks) or `python -m bench.drain_bench`.
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from bench.stack import bench_stack, drain_plane
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, Worker, utcnow
from fleetkeeper.services import drains, instances, placement, workers
from fleetkeeper.services.context import Context

RESULTS = Path(__file__).parent / "results" / "drain.md"
POLL_INTERVAL_BASELINE = 1.0
SEED_POLL_INTERVAL = 10.0
FOUR_HOURS = 4 * 3600
_ids = itertools.count()


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]


def running_worker(ctx: Context) -> Worker:
    worker = workers.create_worker(ctx.store, template="bench", region="us-east-1", actor="bench")
    worker = ctx.store.transition_worker(
        worker,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor="bench",
        changes={"ec2_instance_id": f"i-{next(_ids):017x}"},
    )
    return ctx.store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="bench")


def wait_for(predicate: Any, timeout: float = 30, interval: float = 0.002) -> float:
    """Seconds until predicate() holds (busy-polling the store, which the measurement needs)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if predicate():
            return time.perf_counter() - started
        time.sleep(interval)
    raise TimeoutError("condition not met")


@dataclass
class LatencyResult:
    name: str
    samples: list[float]

    def row(self) -> str:
        p50, p99 = percentile(self.samples, 0.5), percentile(self.samples, 0.99)
        return (
            f"| {self.name} | {len(self.samples)} | {p50 * 1000:.0f} ms | {p99 * 1000:.0f} ms | "
            f"{max(self.samples) * 1000:.0f} ms |"
        )


def callback_latency(ctx: Context, drains_to_run: int) -> LatencyResult:
    samples = []
    for _ in range(drains_to_run):
        worker = running_worker(ctx)
        instance = placement.place_instance(ctx.store, actor="bench", worker_id=worker.id)
        drains.start_worker_drain(ctx, worker.id, actor="bench")
        wait_for(lambda w=worker: (d := ctx.store.get_worker(w.id).drain) is not None and d.task_token)
        ended_at = time.perf_counter()
        instances.change_instance_state(ctx, instance.id, InstanceState.COMPLETED, actor="bench")
        wait_for(lambda w=worker: ctx.store.get_worker(w.id).status is WorkerStatus.STOPPING)
        samples.append(time.perf_counter() - ended_at)
    return LatencyResult("fleetkeeper: callback token", samples)


def polling_latency(ctx: Context, drains_to_run: int, interval: float) -> LatencyResult:
    """Seed 004's checker: every `interval`, look for draining workers with no active instance."""
    stop = threading.Event()

    def checker() -> None:
        while not stop.wait(interval):
            for worker in ctx.store.iter_workers_by_status([WorkerStatus.DRAINING]):
                current = ctx.store.get_worker(worker.id)
                if current.active_instances == 0 and current.drain and current.drain.requested_by == "poll":
                    ctx.store.transition_worker(
                        current, WorkerStatus.STOPPING, cause=Cause.CONTROL, actor="poller"
                    )

    thread = threading.Thread(target=checker, daemon=True)
    thread.start()
    samples = []
    try:
        for _ in range(drains_to_run):
            worker = running_worker(ctx)
            instance = placement.place_instance(ctx.store, actor="bench", worker_id=worker.id)
            record = DrainRecord(
                generation=1,
                started_at=utcnow(),
                deadline=utcnow(),
                timeout_seconds=3600,
                requested_by="poll",
            )
            worker = ctx.store.transition_worker(
                ctx.store.get_worker(worker.id),
                WorkerStatus.DRAINING,
                cause=Cause.CONTROL,
                actor="bench",
                changes={"drain": record},
            )
            ended_at = time.perf_counter()
            ctx.store.end_instance(instance, InstanceState.COMPLETED, actor="bench")
            wait_for(
                lambda w=worker: ctx.store.get_worker(w.id).status is WorkerStatus.STOPPING,
                timeout=interval * 3,
            )
            samples.append(time.perf_counter() - ended_at)
    finally:
        stop.set()
        thread.join()
    return LatencyResult(f"polling checker every {interval:.0f} s (baseline)", samples)


def drain_outcome(ctx: Context, worker_id: str) -> str:
    record = ctx.store.get_worker(worker_id).drain
    return record.outcome.value if record else "NOT_RUN"


def transitions(execution_arn: str) -> int:
    history = boto3.client("stepfunctions").get_execution_history(executionArn=execution_arn, maxResults=1000)
    return sum(1 for event in history["events"] if event["type"].endswith("StateEntered"))


def wait_for_execution(execution_arn: str, timeout: float = 60) -> None:
    sfn = boto3.client("stepfunctions")
    wait_for(lambda: sfn.describe_execution(executionArn=execution_arn)["status"] != "RUNNING", timeout, 0.05)


def transition_counts(ctx: Context) -> list[tuple[str, int, str]]:
    rows = []
    quick = running_worker(ctx)
    instance = placement.place_instance(ctx.store, actor="bench", worker_id=quick.id)
    started = drains.start_worker_drain(ctx, quick.id, actor="bench")
    wait_for(lambda: (d := ctx.store.get_worker(quick.id).drain) is not None and d.task_token)
    time.sleep(1)
    instances.change_instance_state(ctx, instance.id, InstanceState.COMPLETED, actor="bench")
    wait_for_execution(started.execution_arn or "")
    rows.append(("drain that completes after ~1 s", transitions(started.execution_arn or ""), "SUCCESS"))

    empty = running_worker(ctx)
    started = drains.start_worker_drain(ctx, empty.id, actor="bench")
    wait_for_execution(started.execution_arn or "")
    rows.append(("drain of an already empty worker", transitions(started.execution_arn or ""), "SUCCESS"))

    stuck = running_worker(ctx)
    placement.place_instance(ctx.store, actor="bench", worker_id=stuck.id)
    started = drains.start_worker_drain(ctx, stuck.id, actor="bench", timeout_seconds=8)
    # The reconciler's sweep heartbeats waiting drains every cycle; run it as the local scheduler would.
    deadline = time.monotonic() + 12
    while time.monotonic() < deadline and drain_outcome(ctx, stuck.id) == DrainOutcome.RUNNING.value:
        drains.sweep_waiting_drains(ctx)
        time.sleep(1)
    wait_for_execution(started.execution_arn or "")
    outcome = drain_outcome(ctx, stuck.id)
    rows.append(
        (
            "drain that runs to its 8 s timeout (swept every 1 s)",
            transitions(started.execution_arn or ""),
            outcome,
        )
    )
    return rows


def render(callback: LatencyResult, polling: LatencyResult, counts: list[tuple[str, int, str]]) -> str:
    ratio = statistics.mean(polling.samples) / statistics.mean(callback.samples)
    polling_4h = FOUR_HOURS / SEED_POLL_INTERVAL * 3
    lines = [
        "## Drain completion latency",
        "",
        "Last instance ends → worker STOPPING, on the local stack (DynamoDB Local, moto Step Functions",
        "running infra/statemachines/drain.asl.json, drain_tasks handler in-process).",
        "",
        "| design | drains | p50 | p99 | max |",
        "|---|---|---|---|---|",
        callback.row(),
        polling.row(),
        f"| polling checker every {SEED_POLL_INTERVAL:.0f} s (seed 004), by the same law | - | "
        f"~{SEED_POLL_INTERVAL / 2:.0f} s | ~{SEED_POLL_INTERVAL * 0.99:.1f} s | "
        f"{SEED_POLL_INTERVAL:.0f} s |",
        "",
        f"Goal p99 <= 1 s. Mean latency of the {POLL_INTERVAL_BASELINE:.0f} s poller is {ratio:.1f} times "
        "the callback's in this run; a poller's latency is uniform over its interval, so a 10 s poller "
        "averages 5 s.",
        "",
        "## Step Functions state transitions per drain",
        "",
        "Counted as `*StateEntered` events in each execution's history.",
        "",
        "| drain | transitions | outcome |",
        "|---|---|---|",
        *[f"| {name} | {count} | {outcome} |" for name, count, outcome in counts],
        f"| polling loop (Wait 10 s → Task → Choice) for a 4 h drain | {polling_4h:,.0f} | (computed) |",
        "",
        "The callback design costs the same small number of transitions whatever the drain's length: the",
        "wait is one Task state whose timeout is the deadline. The reconciler's sweep sends heartbeats",
        "(`SendTaskHeartbeat` is not a state transition); only if the sweep stops does the heartbeat",
        "re-check run, at 3 transitions per heartbeat period (300 s by default: 144 for a 4 h drain).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--drains", type=int, default=60, help="drains per latency series (>= 50)")
    args = parser.parse_args(argv)
    with bench_stack(log_level="ERROR") as stack:
        ctx = drain_plane(stack)
        callback = callback_latency(ctx, args.drains)
        polling = polling_latency(ctx, max(20, args.drains // 3), POLL_INTERVAL_BASELINE)
        counts = transition_counts(ctx)
    report = render(callback, polling, counts)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
