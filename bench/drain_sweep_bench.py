"""The reconcile cycle's drain sweep with 2,000 concurrent drains on one shard.

2,000 DRAINING workers, each with a RUNNING drain waiting on its token and one instance still active,
are swept cycle after cycle (a cycle every 60 s of the sweep's clock). Each sweep gets the time a
reconcile invocation has left after its own work (`SWEEP_BUDGET_SECONDS`, counted down on the wall
clock from the sweep's start) and must end inside it; whatever does not fit is deferred to the next
cycle. Goal (issue figure): every sweep ends within its budget, and every drain is checked (its
execution described, its waiting task sent a heartbeat) within 2 cycles.

DynamoDB is DynamoDB Local (the worker reads and the sweep's marks are real calls). Step Functions is
answered by a botocore hook that waits `SFN_LATENCY_SECONDS` (a typical in-region DescribeExecution or
SendTaskHeartbeat) and says RUNNING / OK: moto cannot hold 2,000 executions waiting on their tokens.

Run: `python -m bench drain_sweep`.
"""

from __future__ import annotations

import os
import platform
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore import handlers

from bench.stack import bench_stack, use_table
from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainRecord, Worker, utcnow
from fleetkeeper.services import drains
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.drains.sweep import SWEEP_MARGIN_SECONDS, SWEEP_PARALLELISM
from fleetkeeper.settings import get_settings
from fleetkeeper.store import keys
from fleetkeeper.store.codec import record_attributes, serialize

DRAINS = 2000
CYCLES = 12
CYCLE = timedelta(seconds=60)
# What a reconcile invocation (55 s at a 1-minute period) has left for the sweep after its own work on a
# shard of 10,000 workers (about 23 s on this machine: the "Reconcile scaling and shards" section).
SWEEP_BUDGET_SECONDS = 30.0
SFN_LATENCY_SECONDS = 0.025
HEARTBEAT_SECONDS = 300
WATCHDOG_SECONDS = 300
STATE_MACHINE_ARN = "arn:aws:states:us-east-1:123456789012:stateMachine:fleetkeeper-drain"
ARN_PREFIX = "arn:aws:states:us-east-1:123456789012:execution:fleetkeeper-drain:"


class _Http:
    def __init__(self) -> None:
        self.status_code = 200
        self.headers: dict[str, str] = {}
        self.content = b""
        self.text = ""


@contextmanager
def step_functions_stub(calls: Counter[str]) -> Iterator[None]:
    """Step Functions answering DescribeExecution RUNNING and SendTaskHeartbeat OK, after a latency."""
    lock = threading.Lock()

    def answer(event_name: str, **_: Any) -> Any:
        operation = event_name.rsplit(".", 1)[-1]
        with lock:
            calls[operation] += 1
        if operation not in ("DescribeExecution", "SendTaskHeartbeat"):
            return None
        time.sleep(SFN_LATENCY_SECONDS)
        body = (
            {"status": "RUNNING", "executionArn": ARN_PREFIX + "x"}
            if operation == "DescribeExecution"
            else {}
        )
        return _Http(), {**body, "ResponseMetadata": {"HTTPStatusCode": 200}}

    def count(event_name: str, **_: Any) -> None:
        with lock:
            calls[event_name.rsplit(".", 1)[-1]] += 1

    specs = [("before-call.sfn", answer), ("before-call.dynamodb", count)]
    handlers.BUILTIN_HANDLERS.extend(specs)
    reset_clients()
    default_context.cache_clear()
    try:
        yield
    finally:
        for spec in specs:
            handlers.BUILTIN_HANDLERS.remove(spec)
        reset_clients()
        default_context.cache_clear()


def open_drains(ctx: Context, started: datetime) -> list[str]:
    """2,000 DRAINING workers with a RUNNING drain each, written as the store writes them."""
    ids = [f"w-{n:06d}" for n in range(DRAINS)]
    items = []
    for worker_id in ids:
        record = DrainRecord(
            generation=1,
            started_at=started,
            deadline=started + timedelta(hours=4),
            timeout_seconds=4 * 3600,
            requested_by="bench",
            execution_arn=f"{ARN_PREFIX}drain-{worker_id}-g1",
            task_token=f"token-{worker_id}-" + "x" * 600,  # tokens run to hundreds of characters
        )
        worker = Worker(
            id=worker_id,
            template="bench",
            region="us-east-1",
            status=WorkerStatus.DRAINING,
            ec2_instance_id=f"i-{int(worker_id[2:]):017x}",
            capacity=4,
            active_instances=1,
            drain=record,
            version=4,
        )
        items.append(
            {
                **keys.worker_key(worker.id),
                **keys.worker_index_attributes(worker),
                **record_attributes(worker),
            }
        )
    client = ctx.store._client
    for start in range(0, len(items), 25):
        pending: dict[str, Any] = {
            ctx.settings.table_name: [
                {"PutRequest": {"Item": serialize(i)}} for i in items[start : start + 25]
            ]
        }
        while pending:
            pending = client.batch_write_item(RequestItems=pending).get("UnprocessedItems") or {}
    return ids


@dataclass
class CycleRow:
    cycle: int
    seconds: float
    swept: dict[str, int]
    calls: dict[str, int]
    never_described: int
    never_heartbeat: int
    oldest_describe_cycles: float
    oldest_heartbeat_cycles: float


def budget_from(started: float) -> Callable[[], float]:
    """Seconds left of the sweep's budget, on the wall clock, as an invocation's time_left()."""
    return lambda: started + SWEEP_BUDGET_SECONDS - time.monotonic()


def sweep_cycles(ids: list[str]) -> list[CycleRow]:
    t0 = utcnow()
    rows: list[CycleRow] = []
    for n in range(CYCLES):
        now = t0 + n * CYCLE
        calls: Counter[str] = Counter()
        with step_functions_stub(calls):
            ctx = default_context()
            started = time.monotonic()
            swept = drains.sweep_waiting_drains(ctx, now=now, time_left=budget_from(started))
            seconds = time.monotonic() - started
        marks = ctx.store.drain_marks([("worker", i) for i in ids])
        described = [m.described_at for m in marks.values() if m.described_at]
        beaten = [m.heartbeat_at for m in marks.values() if m.heartbeat_at]
        rows.append(
            CycleRow(
                cycle=n + 1,
                seconds=seconds,
                swept=swept,
                calls=dict(calls),
                never_described=len(ids) - len(described),
                never_heartbeat=len(ids) - len(beaten),
                oldest_describe_cycles=(now - min(described)) / CYCLE if described else float("inf"),
                oldest_heartbeat_cycles=(now - min(beaten)) / CYCLE if beaten else float("inf"),
            )
        )
        row = rows[-1]
        print(
            f"cycle {row.cycle}: {seconds:.1f}s, {swept['running']} described, "
            f"{swept['heartbeats']} heartbeats, {swept['deferred']} deferred",
            flush=True,
        )
    return rows


SFN_OPERATIONS = ("DescribeExecution", "SendTaskHeartbeat")


def sfn_calls(row: CycleRow) -> int:
    return sum(row.calls.get(op, 0) for op in SFN_OPERATIONS)


def ddb_calls(row: CycleRow) -> int:
    return sum(v for k, v in row.calls.items() if k not in SFN_OPERATIONS)


def render(rows: list[CycleRow], load_before: float) -> str:
    within_budget = all(r.seconds <= SWEEP_BUDGET_SECONDS for r in rows)
    second = rows[1]
    checked_in_two = second.never_described == 0 and second.never_heartbeat == 0
    # In steady state no drain waits longer than the watchdog interval plus a cycle to be described, or
    # half the heartbeat plus a cycle for its heartbeat.
    steady = rows[2:]
    describe_bound = WATCHDOG_SECONDS / 60 + 1
    heartbeat_bound = HEARTBEAT_SECONDS / 2 / 60 + 1
    oldest_describe = max(r.oldest_describe_cycles for r in steady)
    oldest_heartbeat = max(r.oldest_heartbeat_cycles for r in steady)
    steady_ok = oldest_describe <= describe_bound and oldest_heartbeat <= heartbeat_bound
    met = within_budget and checked_in_two and steady_ok
    old_seconds = DRAINS * (2 * SFN_LATENCY_SECONDS + 2 * 0.005)
    now = datetime.now(UTC)
    setup = " ".join(
        [
            f"{DRAINS:,} DRAINING workers, each drain RUNNING, waiting on its token, with an instance still",
            "active; one sweep per cycle (60 s of the sweep's clock apart), each given",
            f"{SWEEP_BUDGET_SECONDS:.0f} s of invocation time (what a 55 s reconcile invocation has left",
            "after its own work on a 10,000-worker shard, about 23 s here: section",
            f'"Reconcile scaling and shards"), {SWEEP_PARALLELISM} threads, no drain started with less than',
            f"{SWEEP_MARGIN_SECONDS:.0f} s left. DynamoDB Local; Step Functions answered by a botocore hook",
            f"after {SFN_LATENCY_SECONDS * 1000:.0f} ms (moto cannot hold 2,000 waiting executions).",
            f"DRAIN_HEARTBEAT_SECONDS {HEARTBEAT_SECONDS},",
            f"DRAIN_WATCHDOG_INTERVAL_SECONDS {WATCHDOG_SECONDS}.",
            f"Measured {now:%Y-%m-%d %H:%M} UTC on {platform.system()} {platform.machine()},",
            f"{os.cpu_count()} cores, Python {platform.python_version()}, shared with other work (load",
            f"average {load_before:.0f} at the start, {os.getloadavg()[0]:.0f} at the end).",
        ]
    )
    verdict = " ".join(
        [
            f"Goal: every sweep ends within its {SWEEP_BUDGET_SECONDS:.0f} s budget, and every drain is",
            f"described and sent a heartbeat within 2 cycles. **{'Met' if met else 'Not met'}**: longest",
            f"sweep {max(r.seconds for r in rows):.1f} s; after cycle 2, {second.never_described} drains",
            f"never described and {second.never_heartbeat} never sent a heartbeat; from cycle 3 on, the",
            f"oldest description is {oldest_describe:.0f} cycles old at most (bound {describe_bound:.0f})",
            f"and the oldest heartbeat {oldest_heartbeat:.0f} (bound {heartbeat_bound:.1f}).",
        ]
    )
    cost = " ".join(
        [
            f"From cycle 3 on the sweep makes {sum(map(sfn_calls, steady)) / len(steady):,.0f} Step",
            f"Functions calls and {sum(map(ddb_calls, steady)) / len(steady):,.0f} DynamoDB calls per",
            "cycle on average. The sweep it replaces made, every cycle and one drain after another, a",
            "GetItem, a SendTaskHeartbeat, another GetItem and a DescribeExecution per drain:",
            f"{4 * DRAINS:,} calls, {2 * DRAINS:,} of them to Step Functions, about {old_seconds:.0f} s at",
            "these latencies, past the invocation's end.",
        ]
    )
    lines = [
        "## Drain sweep: 2,000 concurrent drains on one shard (bench/drain_sweep_bench.py)",
        "",
        setup,
        "",
        "| cycle | sweep | described | heartbeats | deferred | Step Functions calls | DynamoDB calls "
        "| never described | never heartbeat |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.cycle} | {r.seconds:.1f} s | {r.swept['running']} | {r.swept['heartbeats']} "
            f"| {r.swept['deferred']} | {sfn_calls(r)} | {ddb_calls(r)} | {r.never_described} "
            f"| {r.never_heartbeat} |"
        )
    lines += ["", verdict, "", cost]
    return "\n".join(lines)


def run() -> str:
    load_before = os.getloadavg()[0]
    with bench_stack(log_level="ERROR") as stack:
        use_table(stack)
        os.environ.update(
            {
                "DRAIN_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
                "DRAIN_WATCHDOG_INTERVAL_SECONDS": str(WATCHDOG_SECONDS),
                "DRAIN_STATE_MACHINE_ARN": STATE_MACHINE_ARN,
            }
        )
        get_settings.cache_clear()
        default_context.cache_clear()
        ctx = default_context()
        ids = open_drains(ctx, utcnow() - timedelta(minutes=5))
        # DynamoDB Local's JIT warms up on the first reads; a table on AWS needs no warm-up.
        for _ in range(2):
            listed = sum(1 for _ in ctx.store.iter_workers_by_status([WorkerStatus.DRAINING]))
            ctx.store.get_workers(ids[:100])
        print(f"{listed} drains listed", flush=True)
        rows = sweep_cycles(ids)
    return render(rows, load_before)


if __name__ == "__main__":
    print(run())
