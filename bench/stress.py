"""`make stress`: a torture run of the local control plane, with AWS faults on, then an invariant check.

What it does, in order:

1. starts DynamoDB Local and moto, provisions the table, the drain state machine and the rest
   (`fleetkeeper_local.controlplane.provision`), seeds templates, pools and RUNNING workers backed by
   emulated EC2 machines (`--expiring` of them launched long enough ago that expiry replaces them), and
   serves the API from several instance processes (`ApiServer`), each with the same fault plan
   (`FLEETKEEPER_LOCAL_FAULTS`) and AWS's limits (`FLEETKEEPER_AWS_RULES`, `--aws-rules`); this process
   installs both too, for the drain tasks moto runs here and the reconcile and discovery ticks (the
   harness's own clients, made before, see neither);
2. runs `--threads` clients doing `--ops` random operations in total, each client drawing from its own
   `random.Random(seed, client)`: placements (by pool and by worker), instance state reports, drains
   with short and long deadlines, double drains, cancels, pool drains and cancels, changes of pools'
   disruption budgets, desired statuses, new workers, rollouts (started, paused, resumed, cancelled,
   rolled back), EC2 stops and terminations from outside (boto3 against moto), reconcile and discovery
   ticks, and reads that sample worker versions; meanwhile the RUNNING rollouts and their workers are
   sampled from the table;
3. quiesces: faults off, reconcile ticks until the fleet settles or `--quiesce-seconds` pass;
4. checks every invariant (bench/stress_check.py), prints the summary and, unless `--no-report`,
   writes its section of bench/results.md. Exit status 1 on any violation.

A fixed seed fixes every client's sequence of choices and the fault draws; thread interleaving still
varies, so a run is reproduced in kind (same operations, same fault rates), not instant for instant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
import requests
from botocore.exceptions import ClientError

from bench.stress_check import Call, CommitSpans, Observations, Report, check, sample_rollouts
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE, POOL_TAG, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper.observability import logger
from fleetkeeper.services import catalog, workers
from fleetkeeper.services.context import default_context
from fleetkeeper_local import aws_rules, faults
from fleetkeeper_local.controlplane import (
    FAULTS_ENVIRONMENT,
    LOCAL_WORKER_PROFILE,
    ApiServer,
    activate,
    provision,
    refresh_process_caches,
)
from fleetkeeper_local.ec2_time import Delays
from fleetkeeper_local.event_shapes import schedule_input
from fleetkeeper_local.images import register_template_images
from fleetkeeper_local.invocation import invoke
from fleetkeeper_local.scheduler import Ec2EventPump
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack, LocalStackError, free_port

HERE = Path(__file__).resolve().parent
SECTION = HERE / "results" / "stress.md"
ACCOUNT = "123456789012"
# Errors only: the API instances' "unhandled error" lines (in the run's log file) explain each 500.
QUIET = {"POWERTOOLS_LOG_LEVEL": "ERROR", "POWERTOOLS_METRICS_DISABLED": "true"}

BEFORE_STOP_OPERATION = "deregister-license"
# What a client asks a worker to run (the dev catalogue's, with their parameters' defaults).
OPERATIONS = ["collect-system-info", "register-license", BEFORE_STOP_OPERATION]
TEMPLATES = [
    WorkerTemplate(
        name="stress-small", instance_type="m5.large", ami_name_filter="stress-small-*", capacity=3
    ),
    # Its drains run a cleanup operation on the machine before stopping it.
    WorkerTemplate(
        name="stress-large",
        instance_type="m5.xlarge",
        ami_name_filter="stress-large-*",
        capacity=5,
        before_stop=[BEFORE_STOP_OPERATION],
    ),
]
POOLS = ["alpha", "beta", "gamma"]
# Workers that have outlived their template when the run starts (seeded as launched long ago): the
# reconciler's expiry replaces them through the door while the clients go on. Not among the clients'
# templates, so what they create does not add to it.
AGING = WorkerTemplate(
    name="stress-aging",
    instance_type="m5.large",
    ami_name_filter="stress-aging-*",
    capacity=3,
    max_lifetime_hours=1,
)
# Budgets the clients set on a pool (`change_budgets`): counts, percentages, reasons, and windows of a few
# minutes on the local clocks of zones whose offsets differ by whole and half hours, so that windows open
# and close during a run of minutes.
BUDGET_ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]
BUDGET_REASONS: list[list[str] | None] = [None, None, ["rollout"], ["scale_down", "expired"], ["expired"]]


@dataclass(frozen=True)
class Options:
    seed: int = 1
    ops: int = 5000
    threads: int = 8
    api_instances: int = 2
    workers: int = 12
    fault_rate: float = 0.03
    index_lag_seconds: float = 0.2
    quiesce_seconds: float = 60.0
    report: bool = True
    log_path: str | None = None  # the API instances' log; None: a temporary file
    note: str = ""
    # AWS's limits (fleetkeeper_local.aws_rules) in every process: on, off, or a scale such as 0.1.
    aws_rules: str = "on"
    # Reconcile shards, every one's cycle started at once on each tick (their doors meet on each pool's
    # disruption count).
    shards: int = 3
    # Seeded workers of AGING, past their lifetime from the start.
    expiring: int = 6


# Scale-down on, with windows a run of minutes goes through: a worker whose machine reports idle CPU for
# IDLE_WINDOW is stopped (or drained, if it holds work), one per scope (template and pool) per COOLDOWN
# across every shard, never below one RUNNING worker of its scope.
SCALE_DOWN_COOLDOWN_SECONDS = 30
IDLE_WINDOW_SECONDS = 10
# The stage default: what bounds the voluntary disruptions of a pool none of whose budgets applies.
MAX_CONCURRENT_DRAINS = "10%"


def system_settings(options: Options) -> dict[str, str]:
    """The stage's settings every process of the run shares (the API instances inherit them)."""
    return {
        "RECONCILE_SHARDS": str(options.shards),
        "SCALE_DOWN_ENABLED": "true",
        "SCALE_DOWN_COOLDOWN_SECONDS": str(SCALE_DOWN_COOLDOWN_SECONDS),
        "IDLE_WINDOW_SECONDS": str(IDLE_WINDOW_SECONDS),
        # Every worker's CPU read on every cycle (0 would turn the readings, and so scale-down, off).
        "METRICS_INTERVAL_SECONDS": "60",
        "MIN_WORKERS": "1",
        "MAX_CONCURRENT_DRAINS": MAX_CONCURRENT_DRAINS,
    }


def fault_spec(options: Options) -> dict[str, Any]:
    """The fault plan, as FLEETKEEPER_LOCAL_FAULTS carries it to the API instances: AWS's error answers
    and lost answers (the write landed, the caller heard a 500). No crash: API Gateway answers a crashed
    invocation with a 502 the client sees, which says nothing about our code."""
    rate = options.fault_rate
    kinds = [
        "dynamodb_conflicts",
        "dynamodb_throttling",
        "dynamodb_lost_answers",
        "ec2_throttling",
        "ec2_server_error",
        "ec2_lost_answers",
        "sfn_throttling",
        "sfn_task_does_not_exist",
        "sfn_lost_answers",
    ]
    return {
        "seed": options.seed,
        "faults": [{"kind": kind, "rate": rate} for kind in kinds],
        "index_lag_seconds": options.index_lag_seconds,
    }


def local_fault_plan(options: Options) -> faults.FaultPlan:
    """This process's plan: the API's, and crashes between two writes of the invocations it runs (the
    reconcile shards, discovery, EC2 events and the drain workflow's tasks)."""
    rate = options.fault_rate
    return faults.FaultPlan(
        # Offset from the API instances' seeds (seed + index), so this process draws its own sequence.
        options.seed + 1000,
        [
            faults.dynamodb_conflicts(rate),
            faults.dynamodb_throttling(rate),
            faults.dynamodb_lost_answers(rate),
            # Per worker write, so a third of the rest: most cycles make several.
            faults.crashes_between_writes(rate / 3, when=faults.is_worker_write),
            faults.ec2_throttling(rate),
            faults.ec2_server_error(rate),
            faults.ec2_lost_answers(rate),
            faults.sfn_throttling(rate),
            faults.sfn_task_does_not_exist(rate),
            faults.sfn_lost_answers(rate),
        ],
        index_lag_seconds=options.index_lag_seconds,
    )


def now() -> datetime:
    return datetime.now(UTC)


# ---- what the clients know and saw ----------------------------------------------------------------


@dataclass
class KnownWorker:
    id: str
    pool: str | None
    template: str
    status: str | None = None  # as last answered; None: not read yet


@dataclass
class Fleet:
    """The clients' shared, approximate view: what to aim at. Correctness is judged from the table."""

    workers: dict[str, KnownWorker] = field(default_factory=dict)
    active: dict[str, str] = field(default_factory=dict)  # instance id -> worker id
    # Workers and pools something just happened to (a drain, a stop): where races are. Clients aim
    # part of their reports and cancels there, as a busy fleet's workloads keep reporting through it.
    hot_workers: dict[str, float] = field(default_factory=dict)  # worker id -> when it became hot
    hot_pools: dict[str, float] = field(default_factory=dict)
    rollouts: list[str] = field(default_factory=list)  # ids of the rollouts started, oldest first
    lock: threading.Lock = field(default_factory=threading.Lock)

    def heat(self, worker_id: str | None = None, pool: str | None = None) -> None:
        with self.lock:
            if worker_id:
                self.hot_workers[worker_id] = time.monotonic()
            if pool:
                self.hot_pools[pool] = time.monotonic()

    def hot_instances(self, within: float = 15.0) -> list[str]:
        cutoff = time.monotonic() - within
        with self.lock:
            hot = {w for w, t in self.hot_workers.items() if t > cutoff}
            return sorted(i for i, w in self.active.items() if w in hot)

    def hot_pool_names(self, within: float = 15.0) -> list[str]:
        cutoff = time.monotonic() - within
        with self.lock:
            return sorted(p for p, t in self.hot_pools.items() if t > cutoff)

    def worker_ids(self) -> list[str]:
        with self.lock:
            return sorted(self.workers)

    def instance_ids(self) -> list[str]:
        with self.lock:
            return sorted(self.active)


# Lambda retries an asynchronous invocation (an EventBridge delivery) twice when it fails.
ASYNC_RETRIES = 2
# The scheduled functions' timeout in this run (300 s on AWS). A crashed cycle holds its shard's lease
# until the timeout it was given has passed, as on AWS; a run of minutes must see that more than once.
SCHEDULED_TIMEOUT_SECONDS = 30


class Functions:
    """The scheduled and event-driven handlers, each one invocation at a time, as one Lambda instance.

    An invocation the fault plan kills (`InvocationCrashed`) is what Lambda sees as a runtime exit: a
    schedule's next tick runs again, an event delivery is retried as Lambda retries it.
    """

    def __init__(self, shards: int = 1) -> None:
        self.shards = shards
        names = ["discover", "ec2_events", *(f"reconcile#{shard}" for shard in range(shards))]
        self._locks: dict[str, threading.Lock] = {name: threading.Lock() for name in names}
        self.crashed: Counter[str] = Counter()

    def _run(self, name: str, function: str, event: dict[str, Any], retries: int = 0) -> Any:
        with self._locks[name]:
            for _ in range(retries + 1):
                try:
                    return invoke(function, event, timeout_seconds=SCHEDULED_TIMEOUT_SECONDS)
                except faults.InvocationCrashed:
                    self.crashed[name.split("#", maxsplit=1)[0]] += 1
        return None

    def reconcile(self) -> None:
        """Every shard's cycle at once, each on its own thread, as their schedules fire together."""
        failed: list[Exception] = []

        def shard(index: int) -> None:
            event: dict[str, Any] = {**schedule_input("reconcile"), "shard": index, "shards": self.shards}
            try:
                self._run(f"reconcile#{index}", "reconcile", event)
            except Exception as exc:  # a failed cycle is the tick's failure, once the others are done
                failed.append(exc)

        threads = [threading.Thread(target=shard, args=(i,)) for i in range(self.shards)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failed:
            raise failed[0]

    def discover(self) -> Any:
        return self._run("discover", "discover", schedule_input("discover", region=LOCAL_REGION))

    def ec2_event(self, event: dict[str, Any]) -> Any:
        return self._run("ec2_events", "ec2_events", event, retries=ASYNC_RETRIES)

    def spot_warning(self, machine: str, action: str, warned_at: datetime) -> Any:
        return self.ec2_event(spot_warning_event(machine, action, warned_at))


# EC2 warns a spot instance two minutes before it interrupts it.
SPOT_NOTICE_SECONDS = 120


def spot_warning_event(machine: str, action: str, warned_at: datetime) -> dict[str, Any]:
    """An `EC2 Spot Instance Interruption Warning` as EventBridge delivers it (events/ has a sample)."""
    return {
        "version": "0",
        "id": str(uuid.uuid4()),
        "detail-type": "EC2 Spot Instance Interruption Warning",
        "source": "aws.ec2",
        "account": ACCOUNT,
        "time": warned_at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": LOCAL_REGION,
        "resources": [f"arn:aws:ec2:{LOCAL_REGION}:{ACCOUNT}:instance/{machine}"],
        "detail": {"instance-id": machine, "instance-action": action},
    }


# ---- the clients -----------------------------------------------------------------------------------


class Client:
    """One client thread: an HTTP session, a caller identity and its own seeded random choices."""

    def __init__(
        self,
        index: int,
        options: Options,
        *,
        api: str,
        fleet: Fleet,
        seen: Observations,
        aws: tuple[Any, Any],
        functions: Functions,
    ) -> None:
        self.index = index
        self.random = random.Random(f"{options.seed}/{index}")
        self.api = api
        self.fleet = fleet
        self.seen = seen
        # The harness's own EC2 and CloudWatch clients: an operator outside, and the machines' metrics.
        self.ec2, self.cloudwatch = aws
        self.functions = functions
        self.session = requests.Session()
        self.caller = f"arn:aws:iam::{ACCOUNT}:user/stress-{index:02d}"
        self.operations: list[tuple[Callable[[], None], float]] = [
            (self.place_in_pool, 14),
            (self.place_on_worker, 10),
            (self.report_state, 24),
            (self.drain_short, 2),
            (self.spot_warning, 2),
            (self.drain_long, 2),
            (self.double_drain, 1.5),
            (self.cancel_drain, 5),
            (self.drain_pool, 1),
            (self.cancel_pool_drain, 1.5),
            (self.double_cancel, 1),
            (self.desired_status, 3),
            (self.create_worker, 3),
            (self.reopen_pool, 1.5),
            (self.change_budgets, 1),
            (self.ec2_stop, 1),
            (self.ec2_terminate, 0.6),
            (self.reconcile, 2.5),
            (self.discover, 0.7),
            (self.read_worker, 6),
            (self.read_drain, 2),
            (self.refresh, 1),
            (self.report_cpu, 4),
            (self.request_operation, 3),
            (self.read_operations, 1),
            # Rollouts: a modest share, most of them refused (409) while another covers the workers.
            (self.start_rollout, 1.2),
            (self.pause_rollout, 0.2),
            (self.resume_rollout, 0.4),
            (self.cancel_rollout, 0.12),
            (self.rollback_rollout, 0.12),
            (self.read_rollout, 0.4),
        ]

    # -- plumbing --

    def call(
        self, op: str, method: str, path: str, body: Any = None, *, session: requests.Session | None = None
    ) -> tuple[int, Any, datetime, datetime]:
        sent = now()
        try:
            response = (session or self.session).request(
                method,
                f"{self.api}{path}",
                json=body,
                headers={"X-Fleetkeeper-Caller": self.caller},
                timeout=120,
            )
        except requests.RequestException as exc:
            received = now()
            self.seen.record_call(Call(op, method, path, 599, {"transport": repr(exc)}, sent, received))
            return 599, None, sent, received
        received = now()
        try:
            payload = response.json() if response.content else None
        except ValueError:
            payload = {"raw": response.text[:500]}
        self.seen.record_call(Call(op, method, path, response.status_code, payload, sent, received))
        return response.status_code, payload, sent, received

    def pick_worker(self) -> str | None:
        """Mostly a worker last seen RUNNING (work goes there), sometimes any worker at all."""
        with self.fleet.lock:
            every = sorted(self.fleet.workers)
            running = [w for w in every if self.fleet.workers[w].status in ("RUNNING", None)]
        if running and self.random.random() < 0.8:
            return self.random.choice(running)
        return self.random.choice(every) if every else None

    def pick_hot_worker(self) -> str | None:
        """Mostly a worker something just happened to (cancels aim at drains that may still run)."""
        cutoff = time.monotonic() - 15.0
        with self.fleet.lock:
            hot = sorted(w for w, t in self.fleet.hot_workers.items() if t > cutoff)
        if hot and self.random.random() < 0.7:
            return self.random.choice(hot)
        return self.pick_worker()

    def pick_instance(self) -> str | None:
        hot = self.fleet.hot_instances()
        if hot and self.random.random() < 0.5:
            return self.random.choice(hot)
        ids = self.fleet.instance_ids()
        return self.random.choice(ids) if ids else None

    def pick_pool(self) -> str:
        hot = self.fleet.hot_pool_names()
        if hot and self.random.random() < 0.6:
            return self.random.choice(hot)
        return self.random.choice(POOLS)

    def _sample(self, payload: Any, sent: datetime, received: datetime) -> None:
        if isinstance(payload, dict) and "version" in payload and "capacity" in payload:
            self.seen.record_worker_sample(payload, sent, received)
            with self.fleet.lock:
                known = self.fleet.workers.get(payload["id"])
                if known is not None:
                    known.status = payload["status"]

    def _placed(
        self, status: int, payload: Any, sent: datetime, received: datetime, asked: dict[str, Any]
    ) -> None:
        if status != 201 or not isinstance(payload, dict):
            return
        self.seen.record_placement(payload, self.caller, asked, sent, received)
        with self.fleet.lock:
            self.fleet.active[payload["id"]] = payload["worker_id"]

    # -- operations --

    def run(self, count: int) -> None:
        operations, weights = zip(*self.operations, strict=True)
        for _ in range(count):
            operation = self.random.choices(operations, weights)[0]
            self.seen.count(operation.__name__)
            operation()

    def place_in_pool(self) -> None:
        asked: dict[str, Any] = {"pool": self.random.choice(POOLS)}
        if self.random.random() < 0.5:
            asked["template"] = self.random.choice(TEMPLATES).name
        if self.random.random() < 0.3:
            asked["strategy"] = "spread"
        status, payload, sent, received = self.call("place_pool", "POST", "/api/v1/instances", asked)
        self._placed(status, payload, sent, received, asked)

    def place_on_worker(self) -> None:
        worker_id = self.pick_worker()
        if worker_id is None:
            return
        asked = {"worker_id": worker_id}
        status, payload, sent, received = self.call("place_worker", "POST", "/api/v1/instances", asked)
        self._placed(status, payload, sent, received, asked)

    def report_state(self) -> None:
        instance_id = self.pick_instance()
        if instance_id is None:
            return
        state = self.random.choices(["INSTANTIATING", "RUNNING", "COMPLETED", "FAILED"], [3, 4, 3, 1])[0]
        status, payload, sent, received = self.call(
            "report_state", "POST", f"/api/v1/instances/{instance_id}/state", {"state": state}
        )
        # A FAILED report on a draining worker may be retried in place (the answer says INSTANTIATING):
        # what was acknowledged is the state in the answer.
        answered = payload.get("state") if isinstance(payload, dict) else None
        if status == 200 and answered in ("COMPLETED", "FAILED", "TERMINATED"):
            self.seen.record_end(instance_id, str(answered), sent, received)
        if status in (200, 409) and isinstance(payload, dict):
            ended = payload.get("state") in ("COMPLETED", "FAILED", "TERMINATED") or status == 409
            if ended:
                with self.fleet.lock:
                    self.fleet.active.pop(instance_id, None)

    def _drain(
        self, op: str, worker_id: str, timeout_seconds: int, session: requests.Session | None = None
    ) -> None:
        self._send_drain(op, worker_id, timeout_seconds, self._then(), session)

    def _then(self) -> str:
        return "terminate" if self.random.random() < 0.1 else "stop"

    def _send_drain(
        self,
        op: str,
        worker_id: str,
        timeout_seconds: int,
        then: str,
        session: requests.Session | None = None,
    ) -> None:
        body = {"timeout_seconds": timeout_seconds, "reason": f"stress {op}", "then": then}
        status, payload, sent, received = self.call(
            op, "POST", f"/api/v1/workers/{worker_id}/drain", body, session=session
        )
        self.fleet.heat(worker_id=worker_id)
        if status == 202 and isinstance(payload, dict):
            self.seen.record_drain_ack(worker_id, payload.get("generation"), sent, received)

    def drain_short(self) -> None:
        # The shortest drain the API accepts (a deadline under a minute is refused as a typo); drains with
        # only seconds left come from late spot warnings (spot_warning).
        worker_id = self.pick_worker()
        if worker_id is not None:
            self._drain("drain_short", worker_id, self.random.randint(60, 90))

    def spot_warning(self) -> None:
        """A spot interruption warning delivered late: its drain has seconds left and is forced at once.

        The ec2_events handler takes it as EventBridge would hand it over, one invocation at a time in
        this process, while the API instances keep serving the other clients.
        """
        machine = self._machine()
        if machine is None:
            return
        seconds_left = self.random.randint(2, 8)
        warned_at = now() - timedelta(seconds=SPOT_NOTICE_SECONDS - seconds_left)
        action = "stop" if self.random.random() < 0.7 else "terminate"
        self.seen.record_tick("spot_warning", lambda: self.functions.spot_warning(machine, action, warned_at))

    def drain_long(self) -> None:
        worker_id = self.pick_worker()
        if worker_id is not None:
            self._drain("drain_long", worker_id, self.random.randint(600, 7200))

    def double_drain(self) -> None:
        """Two drains of one worker at once: at most one may be acknowledged."""
        worker_id = self.pick_worker()
        if worker_id is None:
            return
        timeout = self.random.randint(60, 120)
        # `then` is drawn here, not in the threads, so the client's sequence of choices stays fixed.
        thens = [self._then(), self._then()]
        threads = [
            threading.Thread(
                target=self._send_drain, args=("double_drain", worker_id, timeout, then, requests.Session())
            )
            for then in thens
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def cancel_drain(self) -> None:
        worker_id = self.pick_hot_worker()
        if worker_id is None:
            return
        status, payload, sent, received = self.call(
            "cancel_drain", "POST", f"/api/v1/workers/{worker_id}/cancel-drain"
        )
        if status == 200:
            self.seen.record_cancel(worker_id, sent, received)
            self._sample(payload, sent, received)

    def double_cancel(self) -> None:
        record: Callable[[str, datetime, datetime], None]
        """Two cancels of one drain at once (a worker's or a pool's): at most one may be acknowledged."""
        if self.random.random() < 0.5:
            target = self.pick_pool()
            path, op, record = (
                f"/api/v1/pools/{target}/cancel-drain",
                "double_cancel_pool",
                self.seen.record_pool_cancel,
            )
        else:
            picked = self.pick_hot_worker()
            if picked is None:
                return
            target = picked
            path, op, record = (
                f"/api/v1/workers/{target}/cancel-drain",
                "double_cancel",
                self.seen.record_cancel,
            )

        def cancel() -> None:
            status, _, sent, received = self.call(op, "POST", path, session=requests.Session())
            if status == 200:
                record(target, sent, received)

        threads = [threading.Thread(target=cancel) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def drain_pool(self) -> None:
        pool = self.random.choice(POOLS)
        self.fleet.heat(pool=pool)
        with self.fleet.lock:
            members = [w.id for w in self.fleet.workers.values() if w.pool == pool]
        for member in members:
            self.fleet.heat(worker_id=member)
        body = {
            "timeout_seconds": self.random.choice([60, 75, 90]),
            "then": self.random.choices(["none", "stop"], [4, 1])[0],
        }
        status, _, sent, received = self.call("drain_pool", "POST", f"/api/v1/pools/{pool}/drain", body)
        if status == 202:
            self.seen.record_pool_drain_ack(pool, sent, received)

    def cancel_pool_drain(self) -> None:
        pool = self.pick_pool()
        status, _, sent, received = self.call("cancel_pool", "POST", f"/api/v1/pools/{pool}/cancel-drain")
        if status == 200:
            self.seen.record_pool_cancel(pool, sent, received)

    def reopen_pool(self) -> None:
        """A pool whose drain finished is inactive and takes no work until an operator reopens it."""
        self.call("reopen_pool", "PUT", f"/api/v1/pools/{self.random.choice(POOLS)}", {"status": "active"})

    def change_budgets(self) -> None:
        """An operator sets a pool's disruption budgets (replacing them whole), or takes them all away."""
        budgets = [self._budget() for _ in range(self.random.choices([0, 1, 2], [1, 3, 2])[0])]
        self.call(
            "change_budgets",
            "PUT",
            f"/api/v1/pools/{self.random.choice(POOLS)}",
            {"disruption": {"budgets": budgets}},
        )

    def _budget(self) -> dict[str, Any]:
        budget: dict[str, Any] = {
            "max": self.random.randint(0, 3)
            if self.random.random() < 0.7
            else self.random.choice(["0%", "20%", "34%", "50%"])
        }
        reasons = self.random.choice(BUDGET_REASONS)
        if reasons is not None:
            budget["reasons"] = reasons
        if self.random.random() < 0.4:
            every = self.random.choice([2, 3, 5])
            budget["schedule"] = f"*/{every} * * * *"
            budget["duration"] = f"{self.random.randint(1, every)}m"
            budget["timezone"] = self.random.choice(BUDGET_ZONES)
        return budget

    def desired_status(self) -> None:
        # Mostly RUNNING, so that stopped workers come back and the fleet keeps room for work.
        desired = self.random.choices(["RUNNING", "STOPPED", "TERMINATED"], [8, 2, 0.3])[0]
        worker_id = self.pick_stopped_worker() if desired == "RUNNING" else self.pick_worker()
        if worker_id is None:
            return
        status, payload, sent, received = self.call(
            "desired_status",
            "PUT",
            f"/api/v1/workers/{worker_id}/desired-status",
            {"desired_status": desired},
        )
        if status == 200:
            self._sample(payload, sent, received)

    def pick_stopped_worker(self) -> str | None:
        """Mostly a worker last seen STOPPED: an operator asks for RUNNING where it changes something."""
        with self.fleet.lock:
            stopped = sorted(w.id for w in self.fleet.workers.values() if w.status == "STOPPED")
        if stopped and self.random.random() < 0.7:
            return self.random.choice(stopped)
        return self.pick_worker()

    def create_worker(self) -> None:
        with self.fleet.lock:
            if len(self.fleet.workers) >= 60:
                return
        template = self.random.choice(TEMPLATES).name
        pool = self.random.choice(POOLS)
        status, payload, sent, received = self.call(
            "create_worker", "POST", "/api/v1/workers", {"template": template, "pool": pool}
        )
        if status == 201 and isinstance(payload, dict):
            with self.fleet.lock:
                self.fleet.workers[payload["id"]] = KnownWorker(payload["id"], pool, template)
            self._sample(payload, sent, received)

    def _machine(self) -> str | None:
        worker_id = self.pick_worker()
        if worker_id is None:
            return None
        status, payload, sent, received = self.call("read_worker", "GET", f"/api/v1/workers/{worker_id}")
        if status != 200 or not isinstance(payload, dict):
            return None
        self._sample(payload, sent, received)
        machine = payload.get("ec2_instance_id")
        if machine:
            self.fleet.heat(worker_id=worker_id)
        return str(machine) if machine else None

    def ec2_stop(self) -> None:
        machine = self._machine()
        if machine is not None:
            self.seen.record_external("stop", machine)
            with contextlib.suppress(ClientError):  # already stopped or gone: nothing to do
                self.ec2.stop_instances(InstanceIds=[machine])

    def ec2_terminate(self) -> None:
        machine = self._machine()
        if machine is not None:
            self.seen.record_external("terminate", machine)
            with contextlib.suppress(ClientError):
                self.ec2.terminate_instances(InstanceIds=[machine])

    def reconcile(self) -> None:
        self.seen.record_tick("reconcile", self.functions.reconcile)

    def discover(self) -> None:
        self.seen.record_tick("discover", self.functions.discover)

    def read_worker(self) -> None:
        worker_id = self.pick_worker()
        if worker_id is None:
            return
        status, payload, sent, received = self.call("read_worker", "GET", f"/api/v1/workers/{worker_id}")
        if status == 200:
            self._sample(payload, sent, received)

    def report_cpu(self) -> None:
        """A machine's CPU reading, as CloudWatch gets it: mostly idle, so that scale-down has candidates
        in every shard, sometimes busy, which resets the worker's idle clock."""
        machine = self._machine()
        if machine is None:
            return
        busy = self.random.random() < 0.1
        value = self.random.uniform(40, 90) if busy else self.random.uniform(0, 3)
        self.cloudwatch.put_metric_data(
            Namespace="AWS/EC2",
            MetricData=[
                {
                    "MetricName": "CPUUtilization",
                    "Dimensions": [{"Name": "InstanceId", "Value": machine}],
                    "Value": value,
                    "Timestamp": now(),
                }
            ],
        )

    def request_operation(self) -> None:
        """An operation on a worker: one at a time per worker, so concurrent requests race for its lock."""
        worker_id = self.pick_hot_worker() if self.random.random() < 0.3 else self.pick_worker()
        if worker_id is None:
            return
        body = {"name": self.random.choice(OPERATIONS)}
        self.call("request_operation", "POST", f"/api/v1/workers/{worker_id}/operations", body)

    def read_operations(self) -> None:
        worker_id = self.pick_worker()
        if worker_id is not None:
            self.call("read_operations", "GET", f"/api/v1/workers/{worker_id}/operations")

    def read_drain(self) -> None:
        worker_id = self.pick_worker()
        if worker_id is not None:
            self.call("read_drain", "GET", f"/api/v1/workers/{worker_id}/drain")

    def start_rollout(self) -> None:
        """A rollout of a template (maybe in one pool) or of a few workers, with random settings: short
        drains and bakes, so its waves move within a run."""
        body: dict[str, Any] = {}
        if self.random.random() < 0.6:
            body["template"] = self.random.choice(TEMPLATES).name
            if self.random.random() < 0.6:
                body["pool"] = self.random.choice(POOLS)
        else:
            picked = {w for _ in range(self.random.randint(1, 3)) if (w := self.pick_worker())}
            if not picked:
                return
            body["worker_ids"] = sorted(picked)
        body["max_unavailable"] = (
            self.random.randint(1, 3) if self.random.random() < 0.6 else self.random.choice(["25%", "50%"])
        )
        body["strategy"] = self.random.choice(["surge", "drain_first"])
        if self.random.random() < 0.2:
            body["replace"] = False
        if self.random.random() < 0.3:
            body["checkpoints"] = [50]
            body["checkpoint_delay_seconds"] = self.random.choice([None, 5])
        body["bake_seconds"] = self.random.choice([0, 2, 5])
        body["drain_timeout_seconds"] = self.random.randint(60, 90)
        body["reason"] = "stress rollout"
        status, payload, _, _ = self.call("start_rollout", "POST", "/api/v1/rollouts", body)
        if status == 202 and isinstance(payload, dict):
            with self.fleet.lock:
                self.fleet.rollouts.append(str(payload["id"]))
            for worker_id in body.get("worker_ids", []):
                self.fleet.heat(worker_id=worker_id)

    def pick_rollout(self) -> str | None:
        """Mostly one of the latest rollouts (those still moving), sometimes any, now and then one
        that does not exist (404); none before the first has started."""
        with self.fleet.lock:
            known = list(self.fleet.rollouts)
        if not known:
            return None
        if self.random.random() < 0.05:
            return "ro-" + "0" * 16
        if self.random.random() < 0.7:
            return self.random.choice(known[-4:])
        return self.random.choice(known)

    def _move_rollout(self, move: str, body: Any = None) -> None:
        rollout_id = self.pick_rollout()
        if rollout_id is not None:
            self.call(f"{move}_rollout", "POST", f"/api/v1/rollouts/{rollout_id}/{move}", body)

    def pause_rollout(self) -> None:
        self._move_rollout("pause")

    def resume_rollout(self) -> None:
        self._move_rollout("resume")

    def cancel_rollout(self) -> None:
        self._move_rollout("cancel")

    def rollback_rollout(self) -> None:
        self._move_rollout("rollback", {"reason": "stress rollback"} if self.random.random() < 0.5 else None)

    def read_rollout(self) -> None:
        rollout_id = self.pick_rollout()
        if rollout_id is not None:
            self.call("read_rollout", "GET", f"/api/v1/rollouts/{rollout_id}")

    def refresh(self) -> None:
        """Learn about workers created elsewhere (imports, relaunches) and forget ended instances."""
        status, payload, _, _ = self.call("list_workers", "GET", "/api/v1/workers?limit=1000", None)
        if status == 200 and isinstance(payload, dict):
            with self.fleet.lock:
                for item in payload.get("items", []):
                    if item["id"] not in self.fleet.workers:
                        self.fleet.workers[item["id"]] = KnownWorker(
                            item["id"], item["pool"], item["template"]
                        )


# ---- setup, run, quiesce ----------------------------------------------------------------------------


def seed_fleet(options: Options, ec2: Any, fleet: Fleet) -> None:
    """Templates, pools, `options.workers` RUNNING workers and `options.expiring` of AGING launched two
    hours ago, each on a tagged emulated machine."""
    store = default_context().store
    images = register_template_images(ec2, [*TEMPLATES, AGING])
    for template in [*TEMPLATES, AGING]:
        catalog.put_template(store, template, actor="stress-seed")
    for pool in POOLS:
        catalog.ensure_pool(store, pool, actor="stress-seed")
    launched_long_ago = now() - timedelta(hours=2)
    for n in range(options.workers + options.expiring):
        aging = n >= options.workers
        template = AGING if aging else TEMPLATES[n % len(TEMPLATES)]
        pool = POOLS[n % len(POOLS)]
        worker = workers.create_worker(
            store, template=template.name, region=LOCAL_REGION, pool=pool, actor="stress-seed"
        )
        tags = [
            {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
            {"Key": WORKER_ID_TAG, "Value": worker.id},
            {"Key": TEMPLATE_TAG, "Value": template.name},
            {"Key": POOL_TAG, "Value": pool},
        ]
        machine = ec2.run_instances(
            ImageId=images[template.ami_name_filter],
            InstanceType=template.instance_type,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
            # As the reconciler launches: the SSM agent registers only a machine with a profile.
            IamInstanceProfile={"Name": LOCAL_WORKER_PROFILE},
        )["Instances"][0]
        worker = store.transition_worker(
            worker,
            WorkerStatus.PROVISIONING,
            cause=Cause.CONTROL,
            actor="stress-seed",
            changes={"ec2_instance_id": machine["InstanceId"]}
            | ({"launched_at": launched_long_ago} if aging else {}),
        )
        store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="stress-seed")
        fleet.workers[worker.id] = KnownWorker(worker.id, pool, template.name)


def fleet_line(dynamodb: Any, table: str) -> str:
    from bench.stress_check import snapshot

    shot = snapshot(dynamodb, table)
    statuses = Counter(str(w["status"]) for w in shot.workers.values())
    active = sum(
        1 for i in shot.instances.values() if i["state"] in ("SCHEDULED", "INSTANTIATING", "RUNNING")
    )
    pools = Counter(str(p["status"]) for p in shot.pools.values())
    return (
        "workers "
        + " ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
        + f" | active instances {active} | pools "
        + " ".join(f"{k} {v}" for k, v in sorted(pools.items()))
    )


def watch(seen: Observations, fleet: Callable[[], str], done: threading.Event, every: float = 20.0) -> None:
    """A line every `every` seconds, so a run that stops making progress shows where it stands."""
    started = time.monotonic()
    while not done.wait(every):
        ops = sum(seen.operations.values())
        print(f"t={time.monotonic() - started:.0f}s ops {ops} | {fleet()}", flush=True)


def api_fault_counts(server: ApiServer) -> Counter[str]:
    total: Counter[str] = Counter()
    for url in server.backend_urls:
        answer = requests.get(f"{url}/_local/faults", timeout=30)
        if answer.status_code == 200:
            total.update(answer.json()["injected"])
            total.update(answer.json().get("throttled", {}))
    return total


def switch_api_faults(server: ApiServer, enabled: bool) -> None:
    for url in server.backend_urls:
        requests.post(f"{url}/_local/faults", json={"enabled": enabled}, timeout=30)


SETTLED_ROUNDS = 2


def quiesce(functions: Functions, pump: Ec2EventPump, dynamodb: Any, table: str, limit: float) -> float:
    """Reconcile (and discover now and then) until nothing is left in flight, or `limit` seconds pass.

    Settled means: no short drain still RUNNING past its deadline, no DRAINING worker without work, no
    pool draining past its deadline, and no PENDING/PROVISIONING/STOPPING/TERMINATING worker.
    """
    from bench.stress_check import unsettled

    started = time.monotonic()
    rounds = 0
    settled_rounds = 0
    while time.monotonic() - started < limit:
        pump.poll_once()
        try:
            functions.reconcile()
            if rounds % 5 == 0:
                functions.discover()
        except Exception as exc:  # a failing tick is a finding, not a reason to stop settling
            print(f"quiesce: tick failed: {exc!r}", file=sys.stderr)
        rounds += 1
        # Settled twice in a row, a round apart: the drain workflows run on their own, and one that
        # is forcing its last instances right now looks settled (work and time left) for a moment
        # before its Finish step runs.
        settled_rounds = 0 if unsettled(dynamodb, table) else settled_rounds + 1
        if settled_rounds >= SETTLED_ROUNDS:
            break
        time.sleep(1.0)
    # One more pump pass and cycle, so the last EC2 changes are applied before the check reads.
    pump.poll_once()
    left = unsettled(dynamodb, table)
    if left:
        print(f"quiesce: still unsettled after {limit:.0f} s: {'; '.join(left[:20])}", flush=True)
    return time.monotonic() - started


@contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def quiet() -> None:
    """Errors only, from our handlers and from the emulators' own loggers."""
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    # The shared logger was built at import, before the lines above could reach it.
    logger.setLevel(os.environ["POWERTOOLS_LOG_LEVEL"])
    for name in ("moto", "werkzeug", "fleetkeeper_local.scheduler"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def start_stack(stack: LocalStack, attempts: int = 3) -> None:
    """Start the emulators, again if Java was too slow to answer on a busy machine."""
    for attempt in range(1, attempts + 1):
        try:
            stack.start()
            return
        except LocalStackError as exc:
            if attempt == attempts:
                raise
            print(f"local stack did not start ({exc}); trying again", flush=True)
            stack.dynamodb_port, stack.moto_port = free_port(), free_port()


# How often the rollouts in flight are sampled from the base table while the clients run.
ROLLOUT_SAMPLE_SECONDS = 2.0


def sample_every(seen: Observations, sample: Callable[[], None], done: threading.Event) -> None:
    while not done.wait(ROLLOUT_SAMPLE_SECONDS):
        try:
            sample()
        except Exception:
            with seen.lock:
                seen.errors.append(traceback.format_exc())


def drive(
    clients: list[Client],
    options: Options,
    seen: Observations,
    fleet: Callable[[], str],
    sample: Callable[[], None] | None = None,
) -> None:
    """Every client on its own thread with its share of the operations; a progress line meanwhile, and
    the rollouts in flight sampled (`sample`)."""
    shares = [
        options.ops // options.threads + (1 if i < options.ops % options.threads else 0)
        for i in range(options.threads)
    ]
    threads = [
        threading.Thread(
            target=seen.guard, args=(client.run, share), name=f"stress-{client.index}", daemon=True
        )
        for client, share in zip(clients, shares, strict=True)
    ]
    for thread in threads:
        thread.start()
    done = threading.Event()
    watcher = threading.Thread(target=watch, args=(seen, fleet, done), daemon=True)
    watcher.start()
    if sample is not None:
        threading.Thread(target=sample_every, args=(seen, sample, done), daemon=True).start()
    for thread in threads:
        thread.join()
    done.set()


def aws_limits(options: Options, cleanup: ExitStack) -> aws_rules.AwsRules | None:
    """AWS's limits in every process: the API instances read them from the environment, this one
    installs them now, before its fault plan (a faulted call never reached AWS and spends nothing)."""
    cleanup.enter_context(environment({aws_rules.ENVIRONMENT: options.aws_rules}))
    rules = aws_rules.AwsRules.from_environ()
    return cleanup.enter_context(rules.installed()) if rules is not None else None


def seeded_stage(options: Options, cleanup: ExitStack) -> tuple[Any, Any, Fleet]:
    """The stage's shared settings and the seeded fleet, with the harness's own EC2 and CloudWatch
    clients, made before any fault plan exists: they never see faults."""
    ec2 = boto3.client("ec2", region_name=LOCAL_REGION)
    cloudwatch = boto3.client("cloudwatch", region_name=LOCAL_REGION)
    cleanup.enter_context(environment(system_settings(options)))
    refresh_process_caches()
    fleet = Fleet()
    seed_fleet(options, ec2, fleet)
    return ec2, cloudwatch, fleet


def run(options: Options) -> Report:
    """Start the stack, run the workload, quiesce and check. The stack is stopped whatever happens."""
    quiet()
    log_path = Path(options.log_path or tempfile.mkstemp(prefix="fleetkeeper-stress-", suffix=".log")[1])
    log_path.write_bytes(b"")
    print(f"API instance log: {log_path}", flush=True)
    booting = time.monotonic()
    # Machines boot at once: the stress run's figures are the control plane's, not an emulated boot's.
    stack = LocalStack(dynamodb_port=free_port(), moto_port=free_port(), ec2_delays=Delays(0.0, 0.0))
    table = f"fk-stress-{uuid.uuid4().hex[:8]}"
    with ExitStack() as cleanup:
        start_stack(stack)
        cleanup.callback(stack.stop)
        cleanup.enter_context(environment(stack.environment()))
        resources = provision(stack, table)
        activate(resources, heartbeat_seconds=5)
        dynamodb = stack.dynamodb_client()
        ec2, cloudwatch, fleet = seeded_stage(options, cleanup)
        cleanup.enter_context(environment({FAULTS_ENVIRONMENT: json.dumps(fault_spec(options))}))
        rules = aws_limits(options, cleanup)
        server = ApiServer(port=free_port(), instances=options.api_instances, log_path=log_path).start()
        cleanup.callback(server.stop)
        # When this process's writes committed (the reconcile shards' admissions among them), installed
        # before the fault plan so that a lost answer does not hide a write that landed.
        spans = CommitSpans()
        cleanup.enter_context(faults.installed_hooks(spans.hooks()))
        plan = local_fault_plan(options)
        cleanup.enter_context(plan.installed())
        functions = Functions(options.shards)
        pump = Ec2EventPump(interval_seconds=0.5, deliver=functions.ec2_event)
        pump.start()
        cleanup.callback(pump.stop)

        seen = Observations(started_at=now())
        clients = [
            Client(
                i, options, api=server.url, fleet=fleet, seen=seen, aws=(ec2, cloudwatch), functions=functions
            )
            for i in range(options.threads)
        ]
        began = time.monotonic()
        startup_seconds = began - booting
        drive(
            clients,
            options,
            seen,
            lambda: fleet_line(dynamodb, table),
            lambda: seen.record_rollout_samples(sample_rollouts(dynamodb, table)),
        )
        workload_seconds = time.monotonic() - began

        plan.enabled = False
        switch_api_faults(server, enabled=False)
        injected = Counter(plan.summary()) + api_fault_counts(server)
        injected.update(rules.summary() if rules is not None else {})
        injected.update({f"crashed {name}": n for name, n in functions.crashed.items()})
        pump.stop()
        settle_seconds = quiesce(functions, pump, dynamodb, table, options.quiesce_seconds)
        print(f"settled: {fleet_line(dynamodb, table)}", flush=True)
        cooldown = timedelta(seconds=SCALE_DOWN_COOLDOWN_SECONDS)
        report = check(
            seen,
            dynamodb,
            table,
            ec2,
            now(),
            cooldown=cooldown,
            default=MAX_CONCURRENT_DRAINS,
            spans=spans.spans,
        )
        report.options = options.__dict__ | {"table": table}
        report.startup_seconds = startup_seconds
        report.workload_seconds = workload_seconds
        report.settle_seconds = settle_seconds
        report.faults = dict(sorted(injected.items()))
        report.unhandled = unhandled_errors(log_path)
        return report


def unhandled_errors(log_path: Path) -> dict[str, int]:
    """The exception types behind the API's 500s, from its "unhandled error" log lines."""
    found: Counter[str] = Counter()
    for line in log_path.read_text(errors="replace").splitlines():
        if '"unhandled error"' not in line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        exception = str(record.get("exception") or "")
        last = exception.strip().splitlines()[-1] if exception.strip() else "?"
        found[last.split(":", 1)[0] + ": " + last.split(":", 1)[-1].strip()[:120]] += 1
    return dict(found.most_common())


# ---- the report --------------------------------------------------------------------------------------


RUNS = HERE / "results" / "stress.json"


def run_row(report: Report, note: str) -> dict[str, Any]:
    o = report.options
    return {
        "seed": o["seed"],
        "ops": report.operations,
        "threads": o["threads"],
        "api_instances": o["api_instances"],
        "fault_rate": o["fault_rate"],
        "workload_seconds": round(report.workload_seconds),
        "settle_seconds": round(report.settle_seconds),
        "server_errors": report.server_errors,
        "no_capacity": report.no_capacity,
        "violations": report.violation_count,
        "by_invariant": {name: len(found) for name, found in report.violations.items() if found},
        "faults": report.faults,
        "covered": report.covered,
        "note": note,
    }


def section(runs: list[dict[str, Any]]) -> str:
    """Every recorded run (one per seed, size and thread count), newest last."""
    lines = [
        "## Torture run (bench/stress.py, `make stress`)",
        "",
        "`python -m bench.stress --seed S --ops N --threads T`: API on instance processes, 12 seeded",
        "workers in 3 pools (and, in the runs that count expiry drains, 6 past their lifetime), each fault",
        "class at the rate shown in every process that runs our handlers, an index lag of 0.2 s; then",
        "faults off, the fleet settles, and every invariant is checked",
        "(bench/stress_check.py). 409 NO_CAPACITY is the contract's answer for a full fleet, counted apart.",
        "",
        "| seed | ops | threads | API instances | fault rate | workload | settle | 5xx | 409 NO_CAPACITY "
        "| violations | code |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['seed']} | {r['ops']:,} | {r['threads']} | {r['api_instances']} | {r['fault_rate']:.0%} "
            f"| {r['workload_seconds']} s | {r['settle_seconds']} s | {r['server_errors']} | "
            f"{r['no_capacity']} | {r['violations']} | {r['note'] or '-'} |"
        )
    lines += ["", "Faults injected and violations by invariant, per run:", ""]
    for r in runs:
        faults = ", ".join(f"{k} {v}" for k, v in r["faults"].items()) or "none"
        broken = ", ".join(f"{k}: {v}" for k, v in r["by_invariant"].items()) or "none"
        went = ", ".join(f"{k} {v}" for k, v in r.get("covered", {}).items())
        lines.append(
            f"- seed {r['seed']}, {r['ops']:,} ops: faults {faults}; "
            + (f"covered: {went}; " if went else "")
            + f"violations: {broken}"
        )
    return "\n".join(lines) + "\n"


def write_section(report: Report, note: str) -> None:
    """Record this run beside the others and rebuild bench/results.md from every benchmark's section."""
    from bench.__main__ import HEADER, REPORT, SECTIONS

    SECTIONS.mkdir(exist_ok=True)
    runs: list[dict[str, Any]] = json.loads(RUNS.read_text()) if RUNS.exists() else []
    row = run_row(report, note)
    same = (row["seed"], row["ops"], row["threads"])
    runs = [r for r in runs if (r["seed"], r["ops"], r["threads"]) != same] + [row]
    RUNS.write_text(json.dumps(runs, indent=1) + "\n")
    SECTION.write_text(section(runs))
    parts = [HEADER] + [p.read_text() for p in sorted(SECTIONS.glob("*.md"))]
    REPORT.write_text("\n".join(parts))


def parse(argv: list[str]) -> Options:
    parser = argparse.ArgumentParser(prog="python -m bench.stress", description=__doc__.split("\n")[0])
    default = Options()
    parser.add_argument("--seed", type=int, default=default.seed)
    parser.add_argument("--ops", type=int, default=default.ops)
    parser.add_argument("--threads", type=int, default=default.threads)
    parser.add_argument("--api-instances", type=int, default=default.api_instances)
    parser.add_argument("--workers", type=int, default=default.workers)
    parser.add_argument(
        "--expiring", type=int, default=default.expiring, help="seeded workers past their lifetime"
    )
    parser.add_argument("--fault-rate", type=float, default=default.fault_rate)
    parser.add_argument("--index-lag", type=float, default=default.index_lag_seconds)
    parser.add_argument("--shards", type=int, default=default.shards)
    parser.add_argument("--quiesce-seconds", type=float, default=default.quiesce_seconds)
    parser.add_argument("--no-report", action="store_true", help="do not write bench/results.md")
    parser.add_argument("--note", default="", help="what code ran, for the results table")
    parser.add_argument(
        "--aws-rules", default=default.aws_rules, help="AWS's limits: on, off or a scale such as 0.1"
    )
    args = parser.parse_args(argv)
    return Options(
        seed=args.seed,
        ops=args.ops,
        threads=args.threads,
        api_instances=args.api_instances,
        workers=args.workers,
        expiring=args.expiring,
        fault_rate=args.fault_rate,
        index_lag_seconds=args.index_lag,
        quiesce_seconds=args.quiesce_seconds,
        report=not args.no_report,
        note=args.note,
        aws_rules=args.aws_rules,
        shards=args.shards,
    )


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    report = run(options)
    print(report.render())
    if options.report:
        write_section(report, options.note)
        print(f"wrote {SECTION.relative_to(HERE.parent)} and bench/results.md")
    return 1 if report.violation_count else 0


if __name__ == "__main__":
    sys.exit(main())
