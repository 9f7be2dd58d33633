"""A rollout of a pool of RUNNING workers, surge against drain_first, advanced by reconcile cycles.

The fleet is written straight to the table, each worker on its own emulated EC2 instance (as
bench/reconcile_bench.py `build_fleet` does), in one pool whose budget lets `max_unavailable` of it be
disrupted by rollouts. The control plane is the local one (fleetkeeper_local.controlplane): drains run
as executions of the drain state machine on moto's Step Functions, replacements are launched by the
reconciler on the emulated EC2 and become RUNNING as the reconciler sees their machines run.

Per wave: wall time, reconcile cycles, AWS calls by service and operation (every call made in this
process, counted through a botocore hook: the reconciler's and the drain function's), the drain
executions' Step Functions transitions (their history events), and the pool's free placement capacity
(RUNNING workers x capacity) over the wave.

`ROLLOUT_BENCH_WORKERS` sets the fleet's size (default 100; the rollout cap is 10,000),
`ROLLOUT_BENCH_STRATEGIES` the strategies measured (default `surge,drain_first`).
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore import handlers
from botocore.config import Config

from bench.reconcile_bench import (
    launch_machines,
    speed_up_moto_instance_filters,
    speed_up_moto_tag_lookup,
    write_fleet,
)
from bench.stack import bench_stack
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.rollouts import (
    RolloutRequest,
    RolloutStatus,
    RolloutStrategy,
    plan_waves,
    replacement_id,
)
from fleetkeeper.observability import logger
from fleetkeeper.services import catalog, rollouts
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper_local.controlplane import provision, refresh_process_caches
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack

DEFAULT_WORKERS = 100
MAX_UNAVAILABLE = "10%"
POOL = "bench"
CAPACITY = 4
# Cycles a rollout may take before the bench gives up on it.
MAX_CYCLES_PER_WAVE = 60
PAUSE_SECONDS = 0.2


def workers_wanted() -> int:
    return int(os.environ.get("ROLLOUT_BENCH_WORKERS", DEFAULT_WORKERS))


# The bench's own reads (its samples of the fleet between cycles) are not the product's calls.
_not_counted = threading.local()


@contextmanager
def uncounted() -> Iterator[None]:
    """Calls this thread makes inside the block are left out of `counting`."""
    _not_counted.active = True
    try:
        yield
    finally:
        _not_counted.active = False


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """Every AWS call made through a client created inside the block, by `<service>:<Operation>`,
    but the bench's own (`uncounted`)."""
    seen: Counter[str] = Counter()

    def record(event_name: str, **_: Any) -> None:
        if getattr(_not_counted, "active", False):
            return
        parts = event_name.split(".")
        seen[f"{parts[1]}:{parts[-1]}"] += 1

    spec = ("before-call", record)
    handlers.BUILTIN_HANDLERS.append(spec)
    refresh_process_caches()
    try:
        yield seen
    finally:
        handlers.BUILTIN_HANDLERS.remove(spec)
        refresh_process_caches()


def build_pool(ctx: Context, size: int) -> list[Worker]:
    """`size` RUNNING workers of template bench in pool bench, each on its own emulated instance."""
    ec2 = boto3.client("ec2", config=Config(read_timeout=900, retries={"total_max_attempts": 1}))
    image = ec2.register_image(Name="bench-2026.01", RootDeviceName="/dev/sda1")["ImageId"]
    catalog.put_template(
        ctx.store,
        WorkerTemplate(name="bench", instance_type="m5.large", ami_name_filter="bench-*", capacity=CAPACITY),
        actor="bench",
    )
    catalog.put_pool(
        ctx.store,
        POOL,
        actor="bench",
        disruption=DisruptionPolicy(
            budgets=[Budget(max=MAX_UNAVAILABLE, reasons=[DisruptionReason.ROLLOUT])]
        ),
    )
    instances = launch_machines(ec2, image, size)
    now = utcnow()
    fleet = [
        Worker(
            id=f"w-{n:016x}",
            template="bench",
            pool=POOL,
            region=LOCAL_REGION,
            status=WorkerStatus.RUNNING,
            ec2_instance_id=raw["InstanceId"],
            private_ip=raw.get("PrivateIpAddress"),
            capacity=CAPACITY,
            ec2_state="running",
            ec2_observed_at=now,
            image_id=image,
            instance_type="m5.large",
            launched_at=now,
            version=3,
        )
        for n, raw in enumerate(instances)
    ]
    write_fleet(ctx, fleet)
    return fleet


@dataclass
class Wave:
    index: int
    workers: int
    seconds: float = 0.0
    cycles: int = 0
    calls: Counter[str] = field(default_factory=Counter)
    free_min: int = 0
    free_max: int = 0
    out_max: int = 0
    transitions: int = 0
    executions: int = 0


@dataclass
class Run:
    strategy: RolloutStrategy
    size: int
    max_unavailable: int = 0
    status: str = ""
    start_running: int = 0
    min_running: int = 0
    waves: list[Wave] = field(default_factory=list)
    seconds: float = 0.0


def _running(ctx: Context, ids: list[str]) -> int:
    with uncounted():
        statuses = ctx.store.worker_statuses(ids)
    return sum(1 for s in statuses.values() if s == WorkerStatus.RUNNING)


def _transitions(resources: Any, wave_of: dict[str, int], run: Run) -> None:
    """Each drain execution's history events, added to the wave of the worker it drained."""
    sfn = boto3.client("stepfunctions")
    pages = sfn.get_paginator("list_executions").paginate(stateMachineArn=resources.state_machine_arn)
    for page in pages:
        for execution in page["executions"]:
            worker = next((w for w in wave_of if w in execution["name"]), None)
            if worker is None:
                continue
            history = sfn.get_paginator("get_execution_history").paginate(
                executionArn=execution["executionArn"]
            )
            wave = run.waves[wave_of[worker]]
            wave.executions += 1
            wave.transitions += sum(len(h["events"]) for h in history)


def _close(run: Run, wave: Wave) -> None:
    """The wave ended: kept, and its figures printed at once (a long run can be followed, and read
    should it be cut short)."""
    run.waves.append(wave)
    dynamodb, ec2 = _service(wave.calls, "dynamodb"), _service(wave.calls, "ec2")
    print(
        f"{run.strategy} {run.size}: wave {wave.index} ({wave.workers} workers) {wave.seconds:.1f} s, "
        f"{wave.cycles} cycles, DynamoDB {dynamodb}, EC2 {ec2}, "
        f"free {wave.free_min}-{wave.free_max}, out of placement max {wave.out_max}",
        file=sys.stderr,
        flush=True,
    )


def measure(stack: LocalStack, strategy: RolloutStrategy, size: int) -> Run:
    stack.reset_moto()
    resources = provision(stack, f"bench-rollout-{uuid.uuid4().hex[:8]}")
    os.environ.update(resources.environment(300))
    refresh_process_caches()
    run = Run(strategy=strategy, size=size)
    with counting() as calls:
        ctx = default_context()
        fleet = build_pool(ctx, size)
        old = [w.id for w in fleet]
        rollout = rollouts.start(
            ctx,
            RolloutRequest(template="bench", pool=POOL, max_unavailable=MAX_UNAVAILABLE, strategy=strategy),
            actor="bench",
        )
        run.max_unavailable = rollout.max_unavailable
        waves = plan_waves(old, rollout.max_unavailable)
        wave_of = {w: n for n, members in enumerate(waves) for w in members}
        ids = old + [replacement_id(rollout.id, w) for w in old]
        run.start_running = run.min_running = _running(ctx, ids)
        calls.clear()
        started = time.perf_counter()
        current = Wave(index=0, workers=len(waves[0]), free_min=size * CAPACITY, free_max=size * CAPACITY)
        wave_started = started
        while True:
            reconcile_fleet(ctx)
            current.cycles += 1
            running = _running(ctx, ids)
            run.min_running = min(run.min_running, running)
            free = running * CAPACITY
            current.free_min = min(current.free_min, free)
            current.free_max = max(current.free_max, free)
            current.out_max = max(current.out_max, size - running)
            with uncounted():
                now = ctx.rollouts.find(rollout.id)
            assert now is not None
            if now.wave != current.index or now.status != RolloutStatus.RUNNING:
                current.seconds = time.perf_counter() - wave_started
                current.calls = Counter(calls)
                calls.clear()
                _close(run, current)
                if now.status != RolloutStatus.RUNNING:
                    run.status = str(now.status)
                    break
                wave_started = time.perf_counter()
                current = Wave(index=now.wave, workers=len(waves[now.wave]), free_min=free, free_max=free)
            elif current.cycles > MAX_CYCLES_PER_WAVE:
                run.status = f"stuck in wave {current.index}: {now.blocked}"
                current.seconds = time.perf_counter() - wave_started
                current.calls = Counter(calls)
                _close(run, current)
                break
            time.sleep(PAUSE_SECONDS)
        run.seconds = time.perf_counter() - started
        _transitions(resources, wave_of, run)
    return run


def _service(calls: Counter[str], service: str) -> int:
    return sum(n for name, n in calls.items() if name.startswith(f"{service}:"))


def _per_worker_spread(run: Run, service: str) -> tuple[float, float]:
    per = [_service(w.calls, service) / w.workers for w in run.waves if w.workers]
    return (min(per), max(per)) if per else (0.0, 0.0)


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def section(runs: list[Run]) -> str:
    size = runs[0].size
    lines = [
        "## Rollout: surge against drain_first",
        "",
        f"A rollout of {size} RUNNING workers (one pool, template `bench`, capacity {CAPACITY} each) with "
        f"`max_unavailable` {MAX_UNAVAILABLE} and a pool budget of {MAX_UNAVAILABLE} for `rollout`, advanced "
        "by reconcile cycles (one every "
        f"{PAUSE_SECONDS} s plus the cycle's own time) on the local control plane: drains are executions of "
        "the drain state machine on moto's Step Functions, replacements are launched on the emulated EC2. "
        "Calls are every AWS call made in the process (the reconciler's and the drain function's), by "
        "botocore hook. Free capacity is RUNNING workers of the scope and its replacements x capacity.",
        "",
    ]
    if size < 1000:
        lines += [
            f"**Measured at {size} workers, not 1,000**: on this shared 2-core machine a 1,000-worker run "
            "does not finish in the time the benchmark was given. Run the full size with "
            "`ROLLOUT_BENCH_WORKERS=1000 python -m bench rollout`.",
            "",
        ]
    for run in runs:
        lines += [
            f"### {run.strategy} ({run.status}, {run.seconds:.1f} s, max_unavailable {run.max_unavailable})",
            "",
            "| wave | workers | wall s | cycles | DynamoDB calls | EC2 calls | SFN executions "
            "| SFN transitions | free capacity min-max | out of placement max | calls by operation |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for w in run.waves:
            top = ", ".join(f"{name} {n}" for name, n in w.calls.most_common(6))
            lines.append(
                f"| {w.index} | {w.workers} | {w.seconds:.1f} | {w.cycles} | {_service(w.calls, 'dynamodb')} "
                f"| {_service(w.calls, 'ec2')} | {w.executions} | {w.transitions} "
                f"| {w.free_min}-{w.free_max} | {max(w.out_max, 0)} | {top} |"
            )
        lines.append("")
    lines += ["### Goals", "", "| goal | figure | result |", "|---|---|---|"]
    for run in runs:
        done = run.status == "SUCCEEDED"
        lines.append(f"| {run.strategy}: the rollout succeeds | {run.status} | {_met(done)} |")
        if run.strategy == RolloutStrategy.SURGE:
            lines.append(
                f"| surge: RUNNING never below the start ({run.start_running}) | min {run.min_running} "
                f"| {_met(run.min_running >= run.start_running)} |"
            )
        else:
            out = max((w.out_max for w in run.waves), default=0)
            lines.append(
                f"| drain_first: never more than max_unavailable ({run.max_unavailable}) out of placement "
                f"| max {out} | {_met(out <= run.max_unavailable)} |"
            )
        for service in ("dynamodb", "ec2"):
            low, high = _per_worker_spread(run, service)
            lines.append(
                f"| {run.strategy}: {service} calls per wave linear in wave size (per worker within 2x "
                f"across waves) | {low:.1f}-{high:.1f} per worker | {_met(high <= 2 * max(low, 1e-9))} |"
            )
    return "\n".join(lines) + "\n"


def strategies_wanted() -> list[RolloutStrategy]:
    names = os.environ.get("ROLLOUT_BENCH_STRATEGIES", "surge,drain_first")
    return [RolloutStrategy(name.strip()) for name in names.split(",") if name.strip()]


def run() -> str:
    size = workers_wanted()
    # moto answers tag and instance-id filters by scanning every resource for each instance: at 1,000
    # workers that emulator artefact, not the product's calls, would set the cycles' pace.
    speed_up_moto_tag_lookup()
    speed_up_moto_instance_filters()
    # The logger is made at import, before bench_stack sets the level: a line per worker moved would
    # only slow the cycles timed here.
    level = logger.log_level
    logger.setLevel("WARNING")
    runs: list[Run] = []
    try:
        with bench_stack() as stack:
            for strategy in strategies_wanted():
                runs.append(measure(stack, strategy, size))
                # What is measured so far, should a later strategy not finish.
                print(section(runs), flush=True)
    finally:
        logger.setLevel(level)
    return section(runs)


if __name__ == "__main__":
    print(run())
