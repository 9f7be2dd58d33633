"""A retirement wave of a tenth of a pool, repaired within the pool's budget for `repair`, against the same
wave imposed from the start (every retirement at once, the budget skipped), in the same run.

The pool: WORKERS RUNNING workers (template `bench`, capacity 4, a one-hour drain), each on its own
emulated machine, written straight to the table as bench/rollout_bench.py does, with a budget of
BUDGET for `repair`. RETIRING of them get an `instance-retirement` not before NOT_BEFORE from the start,
simulated on their machines (local/fleetkeeper_local/health.py) and found by one discovery sweep, and
each runs SESSIONS sessions that their users end at a random moment of the first SESSION_MINUTES.

The control plane is the local one: drains are executions of the drain state machine on moto's Step
Functions, replacements are launched by the reconciler on the emulated EC2. The clock is simulated:
cycle k runs at start + k minutes (the reconcile schedule's period), the sessions end by that clock, and
a drain's start and end are the minutes of the cycles that first see them; wall time is the bench's own.

Figures per wave: wall time, cycles (the simulated minutes), the most retiring workers disrupted at once
(admitted ahead of their drain, or draining to termination: the door's count of the pool's counted
owners), drains imposed (their owner `scheduled_event` when they started), sessions cut short (ended
by a drain rather than by their user, or whose end came after their drain's deadline), and the latest
drain end against NotBefore and its 30-minute margin.

Run: `python -m bench retirement_wave`.
"""

from __future__ import annotations

import os
import platform
import random
import sys
import time
import uuid
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Final
from unittest.mock import patch

import boto3
from botocore.config import Config

from bench.reconcile_bench import (
    launch_machines,
    speed_up_moto_instance_filters,
    speed_up_moto_tag_lookup,
    write_fleet,
)
from bench.stack import bench_stack
from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.admission import Imposed
from fleetkeeper.domain.disruption import DISRUPTING, Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.repair import EVENT_MARGIN, Brake, Health, RepairPlan, plan_repair
from fleetkeeper.observability import logger
from fleetkeeper.services import catalog, instances, placement
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.discovery import discover_and_collect
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper.services.reconcile import repair as reconcile_repair
from fleetkeeper.store.disruption import read_counts
from fleetkeeper_local.controlplane import provision, refresh_process_caches
from fleetkeeper_local.health import EVENT_TAG, event_tag
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack

# `RETIREMENT_WAVE_BENCH_WORKERS` sets the pool's size for a short run; a tenth of it retires.
WORKERS: Final = int(os.environ.get("RETIREMENT_WAVE_BENCH_WORKERS", "200"))
RETIRING: Final = max(1, WORKERS // 10)
BUDGET: Final = max(1, RETIRING // 4)
POOL: Final = "bench"
CAPACITY: Final = 4
DRAIN_TIMEOUT_HOURS: Final = 1.0
NOT_BEFORE: Final = timedelta(hours=4)
SESSIONS: Final = 2
# Sessions end within this, shorter than the drain timeout: a drain started in time cuts none short.
SESSION_MINUTES: Final = 55
CYCLE: Final = timedelta(minutes=1)
MAX_CYCLES: Final = 300
# A moment between cycles for the drain executions on moto to take their next step.
PAUSE_SECONDS: Final = 0.2
SEED: Final = 31
IMPOSED: Final = str(Imposed.SCHEDULED_EVENT)


@dataclass
class Wave:
    name: str
    seconds: float = 0.0
    cycles: int = 0
    done: bool = False
    max_disrupting: int = 0
    max_counted: int = 0
    imposed: int = 0
    sessions: int = 0
    cut_short: int = 0
    forced: int = 0
    drain_started: dict[str, datetime] = field(default_factory=dict)
    drain_ended: dict[str, datetime] = field(default_factory=dict)
    start: datetime = field(default_factory=utcnow)

    @property
    def not_before(self) -> datetime:
        return self.start + NOT_BEFORE

    @property
    def last_end(self) -> datetime | None:
        return max(self.drain_ended.values(), default=None)


def build_pool(ctx: Context, budget: int) -> list[Worker]:
    """WORKERS RUNNING workers of template bench in pool bench, each on its own emulated machine."""
    ec2 = boto3.client("ec2", config=Config(read_timeout=900, retries={"total_max_attempts": 1}))
    image = ec2.register_image(Name="bench-2026.01", RootDeviceName="/dev/sda1")["ImageId"]
    catalog.put_template(
        ctx.store,
        WorkerTemplate(
            name="bench",
            instance_type="m5.large",
            ami_name_filter="bench-*",
            capacity=CAPACITY,
            drain_timeout_hours=DRAIN_TIMEOUT_HOURS,
        ),
        actor="bench",
    )
    catalog.put_pool(
        ctx.store,
        POOL,
        actor="bench",
        disruption=DisruptionPolicy(budgets=[Budget(max=budget, reasons=[DisruptionReason.REPAIR])]),
    )
    machines = launch_machines(ec2, image, WORKERS)
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
        for n, raw in enumerate(machines)
    ]
    write_fleet(ctx, fleet)
    return fleet


def start_sessions(ctx: Context, retiring: list[Worker], start: datetime) -> dict[str, datetime]:
    """SESSIONS running sessions on each retiring worker; when each one's user ends it."""
    pick = random.Random(SEED)
    ends: dict[str, datetime] = {}
    for worker in retiring:
        for _ in range(SESSIONS):
            session = placement.place_instance(ctx.store, actor="bench", worker_id=worker.id)
            instances.change_instance_state(ctx, session.id, InstanceState.RUNNING, actor="user")
            ends[session.id] = start + timedelta(minutes=pick.uniform(5, SESSION_MINUTES))
    return ends


def schedule_retirements(retiring: list[Worker], not_before: datetime) -> None:
    ec2 = boto3.client("ec2")
    for worker in retiring:
        instance_id = worker.ec2_instance_id or ""
        value = event_tag(
            "instance-retirement", not_before, f"instance-event-{instance_id.removeprefix('i-')}"
        )
        ec2.create_tags(Resources=[instance_id], Tags=[{"Key": EVENT_TAG, "Value": value}])


def run_wave(stack: LocalStack, name: str) -> Wave:
    """One wave on a fresh control plane, to the termination of every retiring worker."""
    stack.reset_moto()
    resources = provision(stack, f"bench-wave-{uuid.uuid4().hex[:8]}")
    os.environ.update(resources.environment(300))
    refresh_process_caches()
    ctx = default_context()
    fleet = build_pool(ctx, BUDGET)
    retiring = fleet[:: WORKERS // RETIRING][:RETIRING]
    wave = Wave(name=name)
    schedule_retirements(retiring, wave.not_before)
    sessions = start_sessions(ctx, retiring, wave.start)
    wave.sessions = len(sessions)
    found = discover_and_collect(ctx, now=wave.start)
    print(f"{name}: {found.counters['health_changed']} retirements found by discovery", file=sys.stderr)
    ids = [w.id for w in retiring]
    open_sessions = dict(sessions)
    started = time.perf_counter()
    for cycle in range(MAX_CYCLES):
        now = wave.start + cycle * CYCLE
        for session_id, end in list(open_sessions.items()):
            if end <= now:
                instances.change_instance_state(ctx, session_id, InstanceState.COMPLETED, actor="user")
                del open_sessions[session_id]
        reconcile_fleet(ctx, now=now)
        wave.cycles += 1
        statuses = ctx.store.worker_statuses(ids)
        for worker_id, status in statuses.items():
            if status in DISRUPTING and worker_id not in wave.drain_started:
                wave.drain_started[worker_id] = now
                owner = ctx.store.get_worker(worker_id).owner
                wave.imposed += 1 if owner is not None and owner.reason == IMPOSED else 0
            if status in DISRUPTING - {WorkerStatus.DRAINING} or status == WorkerStatus.TERMINATED:
                wave.drain_started.setdefault(worker_id, now)
                wave.drain_ended.setdefault(worker_id, now)
        counted = read_counts(client("dynamodb"), ctx.settings.table_name, POOL).in_use
        disrupting = sum(1 for s in statuses.values() if s in DISRUPTING)
        wave.max_counted = max(wave.max_counted, counted)
        wave.max_disrupting = max(wave.max_disrupting, disrupting, counted)
        if all(s == WorkerStatus.TERMINATED for s in statuses.values()):
            wave.done = True
            break
        time.sleep(PAUSE_SECONDS)
    wave.seconds = time.perf_counter() - started
    _sessions_cut_short(ctx, wave, retiring, sessions)
    print(_line(wave), file=sys.stderr, flush=True)
    return wave


def _sessions_cut_short(ctx: Context, wave: Wave, retiring: list[Worker], ends: dict[str, datetime]) -> None:
    """Sessions a drain ended (not COMPLETED by their user), and those whose user's end came after their
    worker's drain deadline on the simulated clock."""
    deadlines: dict[str, datetime] = {}
    for worker in retiring:
        drain = ctx.store.get_worker(worker.id).drain
        if drain is None:
            continue
        wave.forced += drain.forced_instances
        begun = wave.drain_started.get(worker.id)
        if begun is not None:
            deadlines[worker.id] = begun + timedelta(seconds=drain.timeout_seconds)
    for session_id, end in ends.items():
        session = ctx.store.get_instance(session_id)
        late = session.worker_id in deadlines and end > deadlines[session.worker_id]
        if session.state != InstanceState.COMPLETED or late:
            wave.cut_short += 1


def imposed_at_once(health: Health, held: Brake, template_timeout_seconds: int, now: datetime) -> RepairPlan:
    """The earlier rule, the baseline: a scheduled event's repair imposed from the start."""
    plan = plan_repair(health, held, template_timeout_seconds, now)
    return replace(plan, imposed=True) if health.scheduled else plan


def _line(wave: Wave) -> str:
    return (
        f"{wave.name}: {'done' if wave.done else 'NOT DONE'} in {wave.seconds:.1f} s, {wave.cycles} cycles, "
        f"max disrupting {wave.max_disrupting} (counted {wave.max_counted}), imposed {wave.imposed}, "
        f"cut short {wave.cut_short} of {wave.sessions}, last drain end {_minutes(wave, wave.last_end)}"
    )


def _minutes(wave: Wave, at: datetime | None) -> str:
    return "-" if at is None else f"+{(at - wave.start) / timedelta(minutes=1):.0f} min"


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def section(paced: Wave, baseline: Wave) -> str:
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    when = datetime.now(UTC).strftime("%Y-%m-%d")
    margin_end = paced.not_before - EVENT_MARGIN
    last = paced.last_end
    in_time = paced.done and last is not None and last <= margin_end
    rows = []
    for wave in (paced, baseline):
        rows.append(
            f"| {wave.name} | {'all terminated' if wave.done else 'NOT DONE'} | {wave.seconds:.1f} s | "
            f"{wave.cycles} | {wave.max_disrupting} | {wave.imposed} | {wave.cut_short} of {wave.sessions} | "
            f"{_minutes(wave, wave.last_end)} |"
        )
    lines = [
        "## A retirement wave repaired within its budget (bench/retirement_wave_bench.py)",
        "",
        f"A pool of {WORKERS} RUNNING workers with a budget of {BUDGET} for `repair`; {RETIRING} of them "
        f"({RETIRING / WORKERS:.0%}) get an `instance-retirement` {NOT_BEFORE / timedelta(hours=1):.0f} h "
        f"ahead, found by one discovery sweep, and each runs {SESSIONS} sessions that their users end within "
        f"{SESSION_MINUTES} min; the template drains for {DRAIN_TIMEOUT_HOURS:.0f} h, so each retirement's "
        f"latest start is NotBefore - 30 min - 1 h. The local control plane (drains on moto's Step "
        f"Functions, replacements launched on the emulated EC2), one reconcile cycle per simulated minute; "
        f"{machine}, {when}. The baseline is the same wave with every retirement imposed from the start, "
        "as the rule was before a scheduled event waited for the budgets until its latest start.",
        "",
        "| wave | outcome | wall time | cycles (simulated minutes) | most disrupted at once | drains imposed "
        "| sessions cut short | last drain ended |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
        *rows,
        "",
        "| goal | figure | result |",
        "|---|---|---|",
        f"| at most the budget ({BUDGET}) disrupted at once | {paced.max_disrupting} "
        f"(baseline {baseline.max_disrupting}) | {_met(paced.max_disrupting <= BUDGET)} |",
        f"| no session cut short | {paced.cut_short} of {paced.sessions} | {_met(paced.cut_short == 0)} |",
        f"| every drain ended before NotBefore less its 30 min margin "
        f"({_minutes(paced, margin_end)}) | last at {_minutes(paced, last)} | {_met(in_time)} |",
        f"| none imposed while time allowed | {paced.imposed} | {_met(paced.imposed == 0)} |",
        "",
        f"Pacing costs {paced.cycles / max(baseline.cycles, 1):.2f}x the baseline's cycles "
        f"({paced.cycles} against {baseline.cycles}) and {paced.seconds / max(baseline.seconds, 1e-9):.2f}x "
        "its wall time, for at most the budget out of service at once instead of the whole wave. "
        "A drain's start and end are the minutes of the cycles that saw them, so the figures are whole "
        "minutes, at most one late; the emulated machines boot at once, so a real replacement adds its "
        "boot time to each slot of the budget.",
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    # moto answers tag and instance-id filters by scanning every resource for each instance.
    speed_up_moto_tag_lookup()
    speed_up_moto_instance_filters()
    level = logger.log_level
    logger.setLevel("WARNING")
    try:
        with bench_stack() as stack:
            paced = run_wave(stack, "within the budget")
            with patch.object(reconcile_repair, "plan_repair", imposed_at_once):
                baseline = run_wave(stack, "imposed from the start (baseline)")
    finally:
        logger.setLevel(level)
    return section(paced, baseline)


if __name__ == "__main__":
    print(run())
