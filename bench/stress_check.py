"""The torture run's observations and its invariant checker.

The clients record what the API acknowledged, with the time each request was sent and its answer
received (one clock: everything runs on this machine). After the run, `check` reads the whole table
straight from DynamoDB (strongly consistent scans, not the API and not an index) and the emulated EC2,
and judges each invariant against both. Each finding names the records involved, so a run can be
replayed with the same seed and the finding looked up in the audit trail.
"""

from __future__ import annotations

import itertools
import threading
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.handlers import REGISTER_FIRST

from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import ACTIVE_INSTANCE_STATES, Cause, WorkerStatus, can_transition
from fleetkeeper.domain.rollouts import replacement_id, restoration_id
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE, WORKER_ID_TAG
from fleetkeeper.store.codec import deserialize

# A drain whose deadline passed this long ago must have been forced and closed by now: the deadline
# fires the Step Functions task timeout, and the reconciler's sweep forces within a cycle.
DEADLINE_GRACE = timedelta(seconds=15)
# A PENDING worker is not waited for: it holds no machine the checks could miss (a claimed launch is
# adopted when its claim expires, minutes later) and no instance.
TRANSITIONAL = frozenset(
    {
        WorkerStatus.PROVISIONING,
        WorkerStatus.STARTING,
        WorkerStatus.STOPPING,
        WorkerStatus.TERMINATING,
    }
)
# The API contract's answer when no worker has room (api/app.py maps CapacityUnavailable to 409): a
# full fleet is a client-side answer, counted and shown apart. Every 5xx is a violation: none is the
# contract's answer to a request that went as it should.
NO_CAPACITY = (409, "NO_CAPACITY")
LIVE_MACHINE_STATES = frozenset({"pending", "running", "stopping", "stopped"})
INVARIANTS = [
    "placement onto a worker after its drain was acknowledged",
    "placement into a pool after its drain was acknowledged",
    "two drains acknowledged for one generation",
    "cancel acknowledged twice for one drain",
    "active_instances differs from the worker's active instances",
    "active_instances negative or above capacity",
    "drain neither terminal nor running with work and time left",
    "drain finished while its worker still had active instances",
    "instance forced by a drain that was no longer running",
    "active instance on a stopped or terminated worker",
    "worker DRAINING with nothing left to wait for",
    "pool draining past its deadline",
    "worker RUNNING or DRAINING on a terminated or missing machine",
    "managed machine without a live worker",
    "acknowledged instance end lost",
    "worker version went backwards",
    "audit trail does not replay through the transition table",
    "acknowledged placement not in the table",
    "two scale-downs of one scope inside its cooldown",
    "worker's operation lock and its open operations disagree",
    "drain stopped its worker without its before_stop operations",
    "rollout took more than max_unavailable of its scope out of placement",
    "surge rollout drained a worker before its replacement ran",
    "rollout RUNNING or ROLLING_BACK with nothing to move it",
    "worker with two replacements from one rollout",
    "voluntary disruptions beyond a budget",
    "disruption counts disagree with owners",
    "worker created in a pool that was not active",
    "replacement of a rollout stopped by someone else while the rollout was active",
    "5xx answer",
    "harness error",
]


@dataclass(frozen=True)
class Call:
    op: str
    method: str
    path: str
    status: int
    payload: Any
    sent: datetime
    received: datetime


@dataclass(frozen=True)
class Placement:
    instance_id: str
    worker_id: str
    pool: str | None
    caller: str
    asked: dict[str, Any]
    sent: datetime
    received: datetime


@dataclass(frozen=True)
class Ack:
    """An acknowledged request about one entity: its send and answer times."""

    entity_id: str
    sent: datetime
    received: datetime
    detail: Any = None


@dataclass(frozen=True)
class Sample:
    worker_id: str
    version: int
    active_instances: int
    capacity: int
    sent: datetime
    received: datetime


@dataclass(frozen=True)
class RolloutSample:
    """One rollout and the workers of its scope and their replacements, read from the base table."""

    at: datetime
    rollout: dict[str, Any]
    workers: dict[str, dict[str, Any]]


@dataclass
class Observations:
    started_at: datetime
    calls: list[Call] = field(default_factory=list)
    placements: list[Placement] = field(default_factory=list)
    drain_acks: list[Ack] = field(default_factory=list)
    cancels: list[Ack] = field(default_factory=list)
    pool_drain_acks: list[Ack] = field(default_factory=list)
    pool_cancels: list[Ack] = field(default_factory=list)
    ends: list[Ack] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    rollout_samples: list[RolloutSample] = field(default_factory=list)
    external: list[tuple[str, str]] = field(default_factory=list)
    ticks: Counter[str] = field(default_factory=Counter)
    tick_failures: Counter[str] = field(default_factory=Counter)
    operations: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record_call(self, call: Call) -> None:
        # Only the answers the checker judges keep their body; a 4xx keeps its error code, the rest
        # their status.
        if call.status < 500:
            payload = call.payload if isinstance(call.payload, dict) else {}
            code = {"error": payload["error"]} if call.status >= 400 and "error" in payload else None
            call = Call(call.op, call.method, call.path, call.status, code, call.sent, call.received)
        with self.lock:
            self.calls.append(call)

    def record_placement(
        self, payload: dict[str, Any], caller: str, asked: dict[str, Any], sent: datetime, received: datetime
    ) -> None:
        placement = Placement(
            payload["id"], payload["worker_id"], payload.get("pool"), caller, asked, sent, received
        )
        with self.lock:
            self.placements.append(placement)

    def _ack(
        self, into: list[Ack], entity_id: str, sent: datetime, received: datetime, detail: Any = None
    ) -> None:
        with self.lock:
            into.append(Ack(entity_id, sent, received, detail))

    def record_drain_ack(self, worker_id: str, generation: Any, sent: datetime, received: datetime) -> None:
        self._ack(self.drain_acks, worker_id, sent, received, generation)

    def record_cancel(self, worker_id: str, sent: datetime, received: datetime) -> None:
        self._ack(self.cancels, worker_id, sent, received)

    def record_pool_drain_ack(self, pool: str, sent: datetime, received: datetime) -> None:
        self._ack(self.pool_drain_acks, pool, sent, received)

    def record_pool_cancel(self, pool: str, sent: datetime, received: datetime) -> None:
        self._ack(self.pool_cancels, pool, sent, received)

    def record_end(self, instance_id: str, state: str, sent: datetime, received: datetime) -> None:
        self._ack(self.ends, instance_id, sent, received, state)

    def record_worker_sample(self, payload: dict[str, Any], sent: datetime, received: datetime) -> None:
        sample = Sample(
            payload["id"],
            int(payload["version"]),
            int(payload["active_instances"]),
            int(payload["capacity"]),
            sent,
            received,
        )
        with self.lock:
            self.samples.append(sample)

    def record_rollout_samples(self, samples: list[RolloutSample]) -> None:
        with self.lock:
            self.rollout_samples.extend(samples)

    def record_external(self, kind: str, machine: str) -> None:
        with self.lock:
            self.external.append((kind, machine))

    def record_tick(self, name: str, tick: Callable[[], Any]) -> None:
        try:
            tick()
        except Exception:
            # A scheduled invocation that fails is retried by its schedule; it counts, it does not stop.
            with self.lock:
                self.tick_failures[name] += 1
        with self.lock:
            self.ticks[name] += 1

    def count(self, op: str) -> None:
        with self.lock:
            self.operations[op] += 1

    def guard(self, run: Callable[[int], None], count: int) -> None:
        try:
            run(count)
        except Exception:
            with self.lock:
                self.errors.append(traceback.format_exc())


# ---- reading the table and EC2 -----------------------------------------------------------------------


@dataclass
class Snapshot:
    workers: dict[str, dict[str, Any]]
    instances: dict[str, dict[str, Any]]
    pools: dict[str, dict[str, Any]]
    audit: dict[tuple[str, str], list[dict[str, Any]]]
    # worker id -> its operations; template name -> its before_stop operations
    operations: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    before_stop: dict[str, list[str]] = field(default_factory=dict)
    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The disruption counts (store/disruption.py): `DISRUPTING#<pool>` and `DISRUPTING` -> their item.
    counts: dict[str, dict[str, Any]] = field(default_factory=dict)


def _scan(dynamodb: Any, table: str) -> Iterator[dict[str, Any]]:
    for page in dynamodb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True):
        for item in page.get("Items", []):
            yield deserialize(item)


def snapshot(dynamodb: Any, table: str) -> Snapshot:
    shot = Snapshot({}, {}, {}, defaultdict(list))
    member_pages: dict[str, dict[str, list[str]]] = defaultdict(dict)
    for item in _scan(dynamodb, table):
        pk, sk = str(item["PK"]), str(item["SK"])
        if pk.startswith("WORKER#") and sk == "WORKER":
            shot.workers[item["id"]] = item
        elif pk.startswith("INSTANCE#") and sk == "INSTANCE":
            shot.instances[item["id"]] = item
        elif pk.startswith("POOL#") and sk == "POOL":
            shot.pools[item["name"]] = item
        elif pk.startswith("WORKER#") and sk.startswith("OPERATION#"):
            shot.operations[str(item["worker_id"])].append(item)
        elif pk.startswith("TEMPLATE#") and sk == "TEMPLATE":
            shot.before_stop[str(item["name"])] = [str(n) for n in item.get("before_stop") or []]
        elif pk.startswith("ROLLOUT#") and sk == "ROLLOUT":
            shot.rollouts[str(item["id"])] = item
        elif pk.startswith("ROLLOUT#") and sk.startswith("MEMBERS#"):
            member_pages[pk.removeprefix("ROLLOUT#")][sk] = [str(w) for w in item.get("ids") or []]
        elif pk.startswith("DISRUPTING") and sk in ("COUNT", "FLEET"):
            shot.counts[pk] = item
        elif pk.startswith("AUDIT#"):
            _, entity, entity_id = pk.split("#", 2)
            shot.audit[(entity, entity_id)].append(item)
    for events in shot.audit.values():
        events.sort(key=lambda e: str(e["SK"]))
    for rid, rollout in shot.rollouts.items():
        _with_scope(rollout, member_pages.get(rid, {}))
    return shot


def _with_scope(rollout: dict[str, Any], pages: dict[str, list[str]]) -> None:
    """The rollout's scope as `worker_ids`, whether it is stored inline (as an earlier release stored it)
    or in member pages beside the item (page order is scope order): every check reads it there."""
    if not rollout.get("worker_ids") and pages:
        rollout["worker_ids"] = [w for _, ids in sorted(pages.items()) for w in ids]


def _member_pages(dynamodb: Any, table: str, rollout_id: str) -> dict[str, list[str]]:
    pages: dict[str, list[str]] = {}
    for page in dynamodb.get_paginator("query").paginate(
        TableName=table,
        ConsistentRead=True,
        KeyConditionExpression="PK = :pk AND begins_with(SK, :m)",
        ExpressionAttributeValues={":pk": {"S": f"ROLLOUT#{rollout_id}"}, ":m": {"S": "MEMBERS#"}},
    ):
        for item in page.get("Items", []):
            found = deserialize(item)
            pages[str(found["SK"])] = [str(w) for w in found.get("ids") or []]
    return pages


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(str(value)) if value else None


def _active_counts(shot: Snapshot) -> Counter[str]:
    counts: Counter[str] = Counter()
    for instance in shot.instances.values():
        if instance["state"] in ACTIVE_INSTANCE_STATES:
            counts[instance["worker_id"]] += 1
    return counts


def _open_drain_problem(worker: dict[str, Any], active: int, at: datetime) -> str | None:
    drain = worker.get("drain") or {}
    if worker["status"] != WorkerStatus.DRAINING:
        return None
    if drain.get("outcome") != "RUNNING":
        return f"DRAINING with drain outcome {drain.get('outcome')}"
    if active == 0:
        return "DRAINING with no active instance"
    deadline = _time(drain.get("deadline"))
    if deadline is not None and deadline + DEADLINE_GRACE < at:
        return f"DRAINING {(at - deadline).total_seconds():.0f} s past its deadline with {active} active"
    return None


def unsettled(dynamodb: Any, table: str) -> list[str]:
    """What the quiesce phase still waits for (empty: settled)."""
    from fleetkeeper.domain.models import utcnow

    shot = snapshot(dynamodb, table)
    at = utcnow()
    counts = _active_counts(shot)
    waiting = []
    for worker in shot.workers.values():
        if worker["status"] in TRANSITIONAL:
            waiting.append(
                f"{worker['id']} {worker['status']} (attempts {worker.get('reconcile_attempts', 0)}, "
                f"next {worker.get('next_reconcile_at')}, error {worker.get('last_reconcile_error')})"
            )
        problem = _open_drain_problem(worker, counts[worker["id"]], at - DEADLINE_GRACE)
        if problem:
            waiting.append(f"{worker['id']} {problem}")
    for pool in shot.pools.values():
        if _pool_overdue(pool, at - DEADLINE_GRACE):
            waiting.append(f"pool {pool['name']} draining past its deadline")
    return waiting


def _pool_overdue(pool: dict[str, Any], at: datetime) -> bool:
    started = _time(pool.get("drain_started_at"))
    timeout = pool.get("drain_timeout_seconds")
    if pool["status"] != "draining" or started is None or not timeout:
        return False
    return started + timedelta(seconds=int(timeout)) + DEADLINE_GRACE < at


def machines(ec2: Any) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for page in ec2.get_paginator("describe_instances").paginate():
        for reservation in page.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                found[instance["InstanceId"]] = instance
    return found


# ---- the check ---------------------------------------------------------------------------------------


@dataclass
class Report:
    violations: dict[str, list[str]]
    operations: int
    operations_by_kind: dict[str, int]
    server_errors: int
    ticks: dict[str, int]
    tick_failures: dict[str, int]
    options: dict[str, Any] = field(default_factory=dict)
    startup_seconds: float = 0.0
    workload_seconds: float = 0.0
    settle_seconds: float = 0.0
    faults: dict[str, int] = field(default_factory=dict)
    no_capacity: int = 0
    answers: dict[str, dict[int, int]] = field(default_factory=dict)
    unhandled: dict[str, int] = field(default_factory=dict)
    covered: dict[str, int] = field(default_factory=dict)

    @property
    def violation_count(self) -> int:
        return sum(len(found) for found in self.violations.values())

    def render(self, details: int = 8) -> str:
        o = self.options
        lines = [
            f"ops {self.operations} threads {o.get('threads')} seed {o.get('seed')} "
            f"startup {self.startup_seconds:.1f} s workload {self.workload_seconds:.1f} s "
            f"settle {self.settle_seconds:.1f} s",
            "operations: " + ", ".join(f"{k} {v}" for k, v in sorted(self.operations_by_kind.items())),
            "answers: "
            + "; ".join(
                f"{op} " + " ".join(f"{code}x{n}" for code, n in counts.items())
                for op, counts in self.answers.items()
            ),
            "ticks: "
            + ", ".join(
                f"{k} {v} (failed {self.tick_failures.get(k, 0)})" for k, v in sorted(self.ticks.items())
            ),
            "faults injected: " + (", ".join(f"{k} {v}" for k, v in self.faults.items()) or "none"),
            "covered: " + (", ".join(f"{k} {v}" for k, v in self.covered.items()) or "none"),
            f"5xx answers: {self.server_errors} (and {self.no_capacity} 409 NO_CAPACITY, the contract's "
            "answer for a full fleet)",
            "500s by exception: " + (", ".join(f"{k} x{v}" for k, v in self.unhandled.items()) or "none"),
            f"violations = {self.violation_count}",
        ]
        for name, found in self.violations.items():
            mark = "ok  " if not found else "FAIL"
            lines.append(f"  {mark} {name}: {len(found)}")
            lines.extend(f"       - {line}" for line in found[:details])
            if len(found) > details:
                lines.append(f"       ... and {len(found) - details} more")
        return "\n".join(lines)


def _entered_running(shot: Snapshot, worker_id: str) -> list[datetime]:
    return [
        at
        for e in shot.audit.get(("worker", worker_id), [])
        if e.get("to_status") == WorkerStatus.RUNNING
        and e.get("from_status") != WorkerStatus.RUNNING
        and (at := _time(e.get("at"))) is not None
    ]


def _pool_reactivated(shot: Snapshot, pool: str) -> list[datetime]:
    return [
        at
        for e in shot.audit.get(("pool", pool), [])
        if e.get("to_status") == "active"
        and e.get("from_status") != "active"
        and (at := _time(e.get("at"))) is not None
    ]


def _entries(shot: Snapshot, key: tuple[str, str], status: str) -> list[datetime]:
    return [
        at
        for e in shot.audit.get(key, [])
        if e.get("to_status") == status
        and e.get("from_status") != status
        and (at := _time(e.get("at"))) is not None
    ]


def _began(entries: list[datetime], ack: Ack) -> datetime:
    """When the acknowledged drain moved its entity into draining (the last such move it could have
    made), or its acknowledgement time if the trail has none in its request's window."""
    inside = [at for at in entries if ack.sent <= at <= ack.received]
    return max(inside) if inside else ack.received


def _trail(shot: Snapshot, key: tuple[str, str], start: datetime, end: datetime) -> str:
    """The entity's audit events from a little before `start` to a little after `end`, in order."""
    margin = timedelta(seconds=2)
    events = [
        f"{e.get('at')} {e.get('action')} {e.get('from_status')}->{e.get('to_status')} by {e.get('actor')}"
        for e in shot.audit.get(key, [])
        if (at := _time(e.get("at"))) is not None and start - margin <= at <= end + margin
    ]
    return " | ".join(events) or "no events"


def _placed_at(shot: Snapshot, instance_id: str) -> str:
    events = shot.audit.get(("instance", instance_id), [])
    return next((str(e.get("at")) for e in events if e.get("action") == "InstancePlaced"), "?")


def _placements_after_drains(seen: Observations, shot: Snapshot, found: dict[str, list[str]]) -> None:
    """A placement sent after a drain of its worker (or its pool) was acknowledged must have been
    refused, unless the drain ended meanwhile: the worker (pool) became RUNNING (active) again, or a
    cancel was acknowledged, after the drain began and before the placement's answer. The drain began
    at its own move into DRAINING, which commits before the acknowledgement leaves the API; a reopen
    racing the drain request can land between the two."""
    drains: dict[str, list[Ack]] = defaultdict(list)
    for ack in seen.drain_acks:
        drains[ack.entity_id].append(ack)
    pool_drains: dict[str, list[Ack]] = defaultdict(list)
    for ack in seen.pool_drain_acks:
        pool_drains[ack.entity_id].append(ack)
    cancels: dict[str, list[datetime]] = defaultdict(list)
    for ack in seen.cancels:
        cancels[ack.entity_id].append(ack.sent)
    pool_cancels: dict[str, list[datetime]] = defaultdict(list)
    for ack in seen.pool_cancels:
        pool_cancels[ack.entity_id].append(ack.sent)
    for placement in seen.placements:
        reopened = _entered_running(shot, placement.worker_id) + cancels[placement.worker_id]
        entries = _entries(shot, ("worker", placement.worker_id), WorkerStatus.DRAINING)
        for ack in drains[placement.worker_id]:
            began = _began(entries, ack)
            if ack.received < placement.sent and not any(began < t < placement.received for t in reopened):
                found["placement onto a worker after its drain was acknowledged"].append(
                    f"instance {placement.instance_id} on {placement.worker_id} sent "
                    f"{(placement.sent - ack.received).total_seconds():.3f} s after drain generation "
                    f"{ack.detail} was acknowledged at {ack.received.isoformat()}; worker trail: "
                    + _trail(shot, ("worker", placement.worker_id), ack.sent, placement.received)
                    + f"; placed at {_placed_at(shot, placement.instance_id)}"
                )
                break
        if not placement.pool:
            continue
        reactivated = _pool_reactivated(shot, placement.pool) + pool_cancels[placement.pool]
        entries = _entries(shot, ("pool", placement.pool), "draining")
        for ack in pool_drains[placement.pool]:
            began = _began(entries, ack)
            if ack.received < placement.sent and not any(began < t < placement.received for t in reactivated):
                found["placement into a pool after its drain was acknowledged"].append(
                    f"instance {placement.instance_id} into pool {placement.pool} (worker "
                    f"{placement.worker_id}) sent {(placement.sent - ack.received).total_seconds():.3f} s "
                    f"after the pool drain was acknowledged at {ack.received.isoformat()}; pool trail: "
                    + _trail(shot, ("pool", placement.pool), ack.sent, placement.received)
                    + f"; placed at {_placed_at(shot, placement.instance_id)}"
                )
                break


def _drain_entries(shot: Snapshot) -> list[Ack]:
    """Every move into DRAINING in the audit, whoever started it (a pool drain starts worker drains)."""
    return [
        Ack(entity_id, at, at)
        for (entity, entity_id), events in shot.audit.items()
        if entity == "worker"
        for e in events
        if e.get("to_status") == WorkerStatus.DRAINING
        and e.get("from_status") != WorkerStatus.DRAINING
        and (at := _time(e.get("at"))) is not None
    ]


def _exclusive_acks(seen: Observations, shot: Snapshot, found: dict[str, list[str]]) -> None:
    """Of two drains started at once, one wins; of two cancels of one drain, one wins (the other 409)."""
    by_generation = Counter((ack.entity_id, ack.detail) for ack in seen.drain_acks)
    for (worker_id, generation), times in by_generation.items():
        if times > 1:
            found["two drains acknowledged for one generation"].append(
                f"{worker_id} generation {generation}: {times} acknowledgements"
            )
    for kind, cancels, starts in (
        ("worker", seen.cancels, seen.drain_acks + _drain_entries(shot)),
        ("pool", seen.pool_cancels, seen.pool_drain_acks),
    ):
        by_entity: dict[str, list[Ack]] = defaultdict(list)
        for ack in cancels:
            by_entity[ack.entity_id].append(ack)
        for entity_id, acks in by_entity.items():
            acks.sort(key=lambda a: a.sent)
            drains = [d for d in starts if d.entity_id == entity_id]
            for first, second in itertools.pairwise(acks):
                # A drain may have started between the two if its answer came after the first cancel
                # was sent and its request went out before the second cancel was answered.
                if not any(first.sent < d.received and d.sent < second.received for d in drains):
                    found["cancel acknowledged twice for one drain"].append(
                        f"{kind} {entity_id}: cancels sent {first.sent.isoformat()} and "
                        f"{second.sent.isoformat()} both answered 200, no drain acknowledged between"
                    )


def _slots(seen: Observations, shot: Snapshot, found: dict[str, list[str]]) -> None:
    counts = _active_counts(shot)
    for worker in shot.workers.values():
        wid, held, capacity = worker["id"], int(worker.get("active_instances", 0)), int(worker["capacity"])
        if held != counts[wid]:
            found["active_instances differs from the worker's active instances"].append(
                f"{wid} {worker['status']} v{worker['version']}: "
                f"active_instances={held}, active instances={counts[wid]}"
            )
        if held < 0 or held > capacity:
            found["active_instances negative or above capacity"].append(f"{wid}: {held} of {capacity}")
    for sample in seen.samples:
        if sample.active_instances < 0 or sample.active_instances > sample.capacity:
            found["active_instances negative or above capacity"].append(
                f"{sample.worker_id} answered {sample.active_instances} of {sample.capacity} "
                f"at v{sample.version}"
            )
    for instance in shot.instances.values():
        if instance["worker_id"] not in shot.workers and instance["state"] in ACTIVE_INSTANCE_STATES:
            found["active_instances differs from the worker's active instances"].append(
                f"instance {instance['id']} active on missing worker {instance['worker_id']}"
            )


def _drains(shot: Snapshot, at: datetime, found: dict[str, list[str]]) -> None:
    counts = _active_counts(shot)
    for worker in shot.workers.values():
        drain = worker.get("drain") or {}
        wid, active = worker["id"], counts[worker["id"]]
        if drain.get("outcome") == "RUNNING" and worker["status"] != WorkerStatus.DRAINING:
            found["drain neither terminal nor running with work and time left"].append(
                f"{wid}: drain generation {drain.get('generation')} RUNNING on a {worker['status']} worker"
            )
        problem = _open_drain_problem(worker, active, at)
        if problem:
            found["worker DRAINING with nothing left to wait for"].append(
                f"{wid} v{worker['version']} generation {drain.get('generation')}: {problem}"
            )
    for pool in shot.pools.values():
        if _pool_overdue(pool, at):
            found["pool draining past its deadline"].append(
                f"{pool['name']}: started {pool.get('drain_started_at')}, "
                f"timeout {pool.get('drain_timeout_seconds')} s"
            )


def _status_at(events: list[dict[str, Any]], at: datetime) -> str | None:
    """The worker's status at `at`, replayed from its audit trail."""
    status: str | None = None
    for event in events:
        when = _time(event.get("at"))
        if when is None or when > at:
            break
        status = event.get("to_status") or status
    return status


def _active_spans(shot: Snapshot) -> dict[str, list[tuple[str, datetime, datetime | None, str | None]]]:
    """worker id -> (instance id, placed at, ended at or None, end reason) from the instances' audit."""
    spans: dict[str, list[tuple[str, datetime, datetime | None, str | None]]] = defaultdict(list)
    for (entity, instance_id), events in shot.audit.items():
        instance = shot.instances.get(instance_id)
        if entity != "instance" or instance is None:
            continue
        # On its worker since it was placed there, or since a drain's reschedule last moved it there.
        arrivals = [
            _time(e.get("at")) for e in events if e.get("action") in ("InstancePlaced", "InstanceMoved")
        ]
        placed = arrivals[-1] if arrivals else None
        end = next((e for e in events if e.get("to_status") in ("COMPLETED", "FAILED", "TERMINATED")), None)
        if placed is not None:
            ended = _time(end.get("at")) if end else None
            spans[instance["worker_id"]].append(
                (instance_id, placed, ended, end.get("reason") if end else None)
            )
    return spans


def _drain_endings(shot: Snapshot, found: dict[str, list[str]]) -> None:
    """A drain finishes (DRAINING -> STOPPING/TERMINATING) only once its worker is empty: force ends
    what still runs first. A drain's force ends instances only while that drain still runs."""
    spans = _active_spans(shot)
    for wid in shot.workers:
        events = shot.audit.get(("worker", wid), [])
        for event in events:
            if event.get("from_status") != WorkerStatus.DRAINING or event.get("to_status") not in (
                WorkerStatus.STOPPING,
                WorkerStatus.TERMINATING,
            ):
                continue
            if (event.get("details") or {}).get("cause", Cause.CONTROL) != Cause.CONTROL:
                continue
            at = _time(event.get("at"))
            assert at is not None
            still = [i for i, placed, ended, _ in spans[wid] if placed < at and (ended is None or ended > at)]
            if still:
                found["drain finished while its worker still had active instances"].append(
                    f"{wid} {event['from_status']} -> {event['to_status']} at {at.isoformat()} with "
                    f"{len(still)} active: {', '.join(still[:3])}"
                )
        for instance_id, _, ended, reason in spans[wid]:
            if reason != "drain_timeout" or ended is None:
                continue
            status = _status_at(events, ended)
            if status != WorkerStatus.DRAINING:
                found["instance forced by a drain that was no longer running"].append(
                    f"instance {instance_id} ended drain_timeout at {ended.isoformat()} "
                    f"while {wid} was {status}"
                )


def _stranded(shot: Snapshot, found: dict[str, list[str]]) -> None:
    gone = (WorkerStatus.STOPPED, WorkerStatus.TERMINATED)
    for instance in shot.instances.values():
        worker = shot.workers.get(instance["worker_id"])
        if worker is not None and instance["state"] in ACTIVE_INSTANCE_STATES and worker["status"] in gone:
            found["active instance on a stopped or terminated worker"].append(
                f"instance {instance['id']} {instance['state']} v{instance['version']} on "
                f"{worker['id']} {worker['status']}"
            )


def _machines(shot: Snapshot, ec2_machines: dict[str, dict[str, Any]], found: dict[str, list[str]]) -> None:
    for worker in shot.workers.values():
        if worker["status"] not in (WorkerStatus.RUNNING, WorkerStatus.DRAINING):
            continue
        machine = ec2_machines.get(str(worker.get("ec2_instance_id")))
        state = machine["State"]["Name"] if machine else "missing"
        if state in ("terminated", "shutting-down", "missing"):
            found["worker RUNNING or DRAINING on a terminated or missing machine"].append(
                f"{worker['id']} {worker['status']} on {worker.get('ec2_instance_id')} ({state})"
            )
    live_by_machine = {
        str(w.get("ec2_instance_id")): w
        for w in shot.workers.values()
        if w["status"] != WorkerStatus.TERMINATED
    }
    for machine_id, machine in ec2_machines.items():
        tags = {t["Key"]: t["Value"] for t in machine.get("Tags", [])}
        if (
            tags.get(MANAGED_BY_TAG) != MANAGED_BY_VALUE
            or machine["State"]["Name"] not in LIVE_MACHINE_STATES
        ):
            continue
        if machine_id not in live_by_machine:
            found["managed machine without a live worker"].append(
                f"{machine_id} {machine['State']['Name']} tagged for worker {tags.get(WORKER_ID_TAG)}"
            )


def _ends(seen: Observations, shot: Snapshot, found: dict[str, list[str]]) -> None:
    for ack in seen.ends:
        instance = shot.instances.get(ack.entity_id)
        state = instance["state"] if instance else "missing"
        if state != ack.detail:
            found["acknowledged instance end lost"].append(
                f"instance {ack.entity_id}: {ack.detail} acknowledged at {ack.received.isoformat()}, "
                f"now {state} (v{instance['version'] if instance else '-'})"
            )


def _versions(seen: Observations, shot: Snapshot, found: dict[str, list[str]]) -> None:
    """A read sent after another read's answer came back must not see an older version."""
    by_worker: dict[str, list[Sample]] = defaultdict(list)
    for sample in seen.samples:
        by_worker[sample.worker_id].append(sample)
    for wid, samples in by_worker.items():
        by_answer = sorted(samples, key=lambda s: s.received)
        highest: Sample | None = None
        i = 0
        for sample in sorted(samples, key=lambda s: s.sent):
            while i < len(by_answer) and by_answer[i].received < sample.sent:
                if highest is None or by_answer[i].version > highest.version:
                    highest = by_answer[i]
                i += 1
            if highest is not None and sample.version < highest.version:
                found["worker version went backwards"].append(
                    f"{wid}: v{sample.version} read after v{highest.version} had been answered"
                )
        final = shot.workers.get(wid)
        top = max(s.version for s in samples)
        if final is not None and int(final["version"]) < top:
            found["worker version went backwards"].append(
                f"{wid}: stored v{final['version']} below answered v{top}"
            )


def _audit(shot: Snapshot, found: dict[str, list[str]]) -> None:
    for wid, worker in shot.workers.items():
        events = shot.audit.get(("worker", wid), [])
        previous: str | None = None
        for event in events:
            source, target = event.get("from_status"), event.get("to_status")
            cause = Cause((event.get("details") or {}).get("cause", Cause.CONTROL))
            if previous is not None and source is not None and source != previous:
                found["audit trail does not replay through the transition table"].append(
                    f"{wid}: {event['action']} at {event['at']} starts from {source}, "
                    f"the trail was at {previous}"
                )
            moved = source is not None and target is not None and source != target
            if moved and not can_transition(WorkerStatus(str(source)), WorkerStatus(str(target)), cause):
                found["audit trail does not replay through the transition table"].append(
                    f"{wid}: {event['action']} {source} -> {target} ({cause}) is not in the table"
                )
            previous = target if target is not None else previous
        if previous != worker["status"]:
            found["audit trail does not replay through the transition table"].append(
                f"{wid}: the trail ends at {previous}, the worker is {worker['status']}"
            )


def _placements_kept(seen: Observations, shot: Snapshot, found: dict[str, list[str]]) -> None:
    """An acknowledged placement is in the table, on the worker it was answered with unless a drain
    moved it since, whatever answers were lost on the way (a retried write that landed twice would show
    as a slot count apart)."""
    for placement in seen.placements:
        instance = shot.instances.get(placement.instance_id)
        trail = shot.audit.get(("instance", placement.instance_id), [])
        moved = any(e.get("action") == "InstanceMoved" for e in trail)
        if instance is None or (instance["worker_id"] != placement.worker_id and not moved):
            where = f"on {instance['worker_id']}" if instance else "missing"
            found["acknowledged placement not in the table"].append(
                f"instance {placement.instance_id} answered on {placement.worker_id} at "
                f"{placement.received.isoformat()}, {where}"
            )


# Scale-down claims its scope's cooldown before its worker's write, so two of one scope may be audited a
# little closer than the cooldown; never by more than this.
COOLDOWN_SLACK = timedelta(seconds=10)
SCALE_DOWN_ACTOR = "scale-down"
# The reason expiry gives its drains (services/reconcile/expiry.py).
EXPIRED = "expired"


def _scale_downs(shot: Snapshot, cooldown: timedelta | None, found: dict[str, list[str]]) -> None:
    """One scale-down per scope (template and pool) per cooldown, across every shard and cycle."""
    if cooldown is None:
        return
    by_scope: dict[str, list[tuple[datetime, str]]] = defaultdict(list)
    for (entity, wid), events in shot.audit.items():
        worker = shot.workers.get(wid)
        if entity != "worker" or worker is None:
            continue
        scope = f"{worker.get('template')}#{worker.get('pool') or '-'}"
        for e in events:
            moved = e.get("from_status") == WorkerStatus.RUNNING and e.get("to_status") in (
                WorkerStatus.STOPPING,
                WorkerStatus.DRAINING,
            )
            if moved and e.get("actor") == SCALE_DOWN_ACTOR and (at := _time(e.get("at"))) is not None:
                by_scope[scope].append((at, wid))
    for scope, downs in by_scope.items():
        downs.sort()
        for (first, a), (second, b) in itertools.pairwise(downs):
            if second - first < cooldown - COOLDOWN_SLACK:
                found["two scale-downs of one scope inside its cooldown"].append(
                    f"{scope}: {a} at {first.isoformat()} and {b} {(second - first).total_seconds():.1f} s "
                    f"later, cooldown {cooldown.total_seconds():.0f} s"
                )


_OPEN_OPERATIONS = frozenset({"PENDING", "RUNNING"})


def _operation_locks(shot: Snapshot, found: dict[str, list[str]]) -> None:
    """A worker runs one operation at a time: its lock names its one open operation, or none is open."""
    for wid, worker in shot.workers.items():
        operations = shot.operations.get(wid, [])
        open_ids = sorted(str(op["id"]) for op in operations if op["status"] in _OPEN_OPERATIONS)
        lock = worker.get("operation_in_flight")
        if len(open_ids) > 1 or open_ids != ([str(lock)] if lock else []):
            found["worker's operation lock and its open operations disagree"].append(
                f"{wid} {worker['status']}: lock {lock or '-'}, open operations {', '.join(open_ids) or '-'}"
            )


def _before_stops(shot: Snapshot, found: dict[str, list[str]]) -> None:
    """A drain that stops a worker whose template names before_stop operations ran them first (or
    audited why it could not): requested after the drain began and before it completed."""
    for wid, worker in shot.workers.items():
        if not shot.before_stop.get(str(worker.get("template"))):
            continue
        requested = [
            at
            for op in shot.operations.get(wid, [])
            if op.get("origin") == "before_stop" and (at := _time(op.get("created_at"))) is not None
        ]
        began: datetime | None = None
        for e in shot.audit.get(("worker", wid), []):
            at = _time(e.get("at"))
            if at is None:
                continue
            if e.get("to_status") == WorkerStatus.DRAINING and e.get("from_status") != WorkerStatus.DRAINING:
                began = at
            elif e.get("action") == "BeforeStopOperationFailed":
                requested.append(at)
            elif (
                e.get("action") == "WorkerDrainCompleted"
                and began is not None
                and not any(began <= t <= at for t in requested)
            ):
                found["drain stopped its worker without its before_stop operations"].append(
                    f"{wid}: drained from {began.isoformat()}, completed at {at.isoformat()} "
                    f"({e.get('to_status')}) with no before_stop operation"
                )


# ---- rollouts ----------------------------------------------------------------------------------------

ROLLOUT_ACTOR = "rollout:"
# Out of placement while its drain runs or its machine goes.
_LEAVING = frozenset({WorkerStatus.DRAINING, WorkerStatus.STOPPING, WorkerStatus.TERMINATING})
_GONE = frozenset({WorkerStatus.STOPPED, WorkerStatus.TERMINATED})
# A worker in one of these has never run (a replacement still launching, or none at all).
_NOT_RAN = frozenset({WorkerStatus.PENDING, WorkerStatus.PROVISIONING, WorkerStatus.STARTING})
_FINISHED_WORKER = frozenset({WorkerStatus.STOPPED, WorkerStatus.TERMINATED, WorkerStatus.FAILED, *_LEAVING})
# A RUNNING or ROLLING_BACK rollout with no `blocked` reason writes a step every leading cycle: one
# whose last step is older than this is stuck.
ROLLOUT_STALL = timedelta(seconds=120)


def _rollout_drained(rollout: dict[str, Any], worker: dict[str, Any] | None) -> bool:
    drain = (worker or {}).get("drain") or {}
    return drain.get("requested_by") == ROLLOUT_ACTOR + str(rollout["id"])


def _never_ran(worker: dict[str, Any] | None, at: datetime, ran: dict[str, datetime]) -> bool:
    """Whether a replacement had not run by `at`: absent, or neither in service nor RUNNING in its
    audit trail before `at` (`ran`: each worker's first move to RUNNING)."""
    if worker is None:
        return True
    if worker["status"] in (WorkerStatus.RUNNING, WorkerStatus.DRAINING):
        return False
    first = ran.get(str(worker["id"]))
    return first is None or first > at


def first_running(shot: Snapshot) -> dict[str, datetime]:
    """Each worker's first move to RUNNING, from its audit trail."""
    ran: dict[str, datetime] = {}
    for (entity, wid), events in shot.audit.items():
        if entity != "worker":
            continue
        for e in events:
            if e.get("to_status") == WorkerStatus.RUNNING and (at := _time(e.get("at"))) is not None:
                ran[wid] = at
                break
    return ran


def rollout_out_of_placement(
    rollout: dict[str, Any], workers: dict[str, dict[str, Any]], at: datetime, ran: dict[str, datetime]
) -> list[str]:
    """The scope's workers out of placement because of this rollout: its drain runs or their machine
    goes, or (with replacements) they are gone and their replacement has not run yet."""
    out = []
    for wid in rollout.get("worker_ids") or []:
        worker = workers.get(wid)
        if worker is None or not _rollout_drained(rollout, worker):
            continue
        gap = (
            rollout.get("replace", True)
            and worker["status"] in _GONE
            and _never_ran(workers.get(replacement_id(str(rollout["id"]), wid)), at, ran)
        )
        if worker["status"] in _LEAVING or gap:
            out.append(wid)
    return out


def rollout_surge_short(
    rollout: dict[str, Any], workers: dict[str, dict[str, Any]], at: datetime, ran: dict[str, datetime]
) -> list[str]:
    """With surge, the scope's workers the rollout took out whose replacement has not run: each is one
    RUNNING worker fewer than the scope started with, because of the rollout."""
    if rollout.get("strategy") != "surge" or not rollout.get("replace", True):
        return []
    rid = str(rollout["id"])
    short = []
    for wid in rollout.get("worker_ids") or []:
        worker = workers.get(wid)
        if worker is None or worker["status"] == WorkerStatus.RUNNING:
            continue
        if not _rollout_drained(rollout, worker):
            continue
        if _never_ran(workers.get(replacement_id(rid, wid)), at, ran):
            short.append(wid)
    return short


def judge_rollout_sample(
    sample: RolloutSample, found: dict[str, list[str]], ran: dict[str, datetime] | None = None
) -> None:
    """A RUNNING rollout as sampled: at most max_unavailable of its scope out because of it, and with
    surge none of them out before its replacement ran."""
    ran = ran or {}
    rollout = sample.rollout
    if rollout.get("status") != "RUNNING":
        return
    rid, limit = rollout["id"], int(rollout["max_unavailable"])
    out = rollout_out_of_placement(rollout, sample.workers, sample.at, ran)
    if len(out) > limit:
        found["rollout took more than max_unavailable of its scope out of placement"].append(
            f"{rid} at {sample.at.isoformat()}: {len(out)} out, max_unavailable {limit}: {', '.join(out[:5])}"
        )
    short = rollout_surge_short(rollout, sample.workers, sample.at, ran)
    if short:
        found["surge rollout drained a worker before its replacement ran"].append(
            f"{rid} at {sample.at.isoformat()}: {len(short)} of its {len(rollout.get('worker_ids') or [])} "
            f"drained with no replacement RUNNING: {', '.join(short[:5])}"
        )


def sample_rollouts(dynamodb: Any, table: str) -> list[RolloutSample]:
    """Every RUNNING rollout and its scope's workers and replacements, strongly consistent reads of the
    base table (the rollout first, its workers right after)."""
    at = datetime.now(UTC)
    rollouts = [
        deserialize(item)
        for page in dynamodb.get_paginator("scan").paginate(
            TableName=table,
            ConsistentRead=True,
            FilterExpression="begins_with(PK, :p) AND SK = :s AND #st = :r",
            ExpressionAttributeNames={"#st": "status"},
            ExpressionAttributeValues={
                ":p": {"S": "ROLLOUT#"},
                ":s": {"S": "ROLLOUT"},
                ":r": {"S": "RUNNING"},
            },
        )
        for item in page.get("Items", [])
    ]
    samples = []
    for rollout in rollouts:
        if not rollout.get("worker_ids"):
            _with_scope(rollout, _member_pages(dynamodb, table, str(rollout["id"])))
        scope = [str(w) for w in rollout.get("worker_ids") or []]
        ids = sorted({*scope, *(replacement_id(str(rollout["id"]), w) for w in scope)})
        samples.append(RolloutSample(at, rollout, _get_workers(dynamodb, table, ids)))
    return samples


def _get_workers(dynamodb: Any, table: str, ids: list[str]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(ids), 100):
        keys: list[dict[str, Any]] = [
            {"PK": {"S": f"WORKER#{wid}"}, "SK": {"S": "WORKER"}} for wid in ids[start : start + 100]
        ]
        for _ in range(10):
            if not keys:
                break
            answer = dynamodb.batch_get_item(RequestItems={table: {"Keys": keys, "ConsistentRead": True}})
            for item in answer.get("Responses", {}).get(table, []):
                worker = deserialize(item)
                found[str(worker["id"])] = worker
            keys = answer.get("UnprocessedKeys", {}).get(table, {}).get("Keys", [])
    return found


def _rollouts_at_end(shot: Snapshot, at: datetime, found: dict[str, list[str]]) -> None:
    """Once the fleet settled: the final state judged as one more sample; no rollout left RUNNING or
    ROLLING_BACK with nothing to move it; no worker replaced twice."""
    ran = first_running(shot)
    for rollout in shot.rollouts.values():
        judge_rollout_sample(RolloutSample(at, rollout, shot.workers), found, ran)
        rid, status = str(rollout["id"]), rollout.get("status")
        updated = _time(rollout.get("updated_at"))
        if (
            status in ("RUNNING", "ROLLING_BACK")
            and not rollout.get("blocked")
            and (updated is None or updated + ROLLOUT_STALL < at)
        ):
            found["rollout RUNNING or ROLLING_BACK with nothing to move it"].append(
                f"{rid} {status}, not blocked, last step {updated.isoformat() if updated else '-'}"
            )
        _replacements(shot, rollout, found)


def _replacements(shot: Snapshot, rollout: dict[str, Any], found: dict[str, list[str]]) -> None:
    """A worker this rollout created is the replacement or the restoration of one worker of its scope
    (their ids are derived); any other is a second replacement. Once rolled back, no worker of the
    scope keeps both its replacement and its restoration in service."""
    rid = str(rollout["id"])
    scope = [str(w) for w in rollout.get("worker_ids") or []]
    derived = {replacement_id(rid, w) for w in scope} | {restoration_id(rid, w) for w in scope}
    actor = ROLLOUT_ACTOR + rid
    for (entity, wid), events in shot.audit.items():
        created = next((e for e in events if e.get("action") == "WorkerCreated"), None)
        mine = created is not None and created.get("actor") == actor
        if entity == "worker" and mine and wid not in derived:
            found["worker with two replacements from one rollout"].append(
                f"{rid} created {wid}, which replaces none of its scope by id"
            )
    if rollout.get("status") != "ROLLED_BACK":
        return
    for w in scope:
        both = [shot.workers.get(replacement_id(rid, w)), shot.workers.get(restoration_id(rid, w))]
        if all(x is not None and x["status"] not in _FINISHED_WORKER for x in both):
            found["worker with two replacements from one rollout"].append(
                f"{rid} ROLLED_BACK: {w} has replacement {both[0]['id']} {both[0]['status']} and "  # type: ignore[index]
                f"restoration {both[1]['id']} {both[1]['status']}"  # type: ignore[index]
            )


# ---- the door: budgets, counts, new workers, rollouts' replacements ----------------------------------
#
# Judged from the audit trail alone: every write that gives a worker a place in its pool's budgets, or
# takes it back, says so (`details.in_use` +1 or -1, with the owner's reason, and for a place taken the
# instant it was decided at and the version of the pool's budgets it was decided on), and every write of
# a pool's budgets says what they became (`details.disruption`). The budget rule is restated here from
# docs/disruption.md, not taken from domain/disruption.py; whether a cron window is open at an instant
# is domain/windows.py's, which has its own brute-force oracle (tests/unit/test_windows_property.py).

VOLUNTARY = frozenset(str(reason) for reason in DisruptionReason)
# A pool's members, the base of its percentages: serving, or on their way out.
POOL_MEMBERS = frozenset({"RUNNING", "DRAINING", "STOPPING", "TERMINATING"})
# The base of the stage default's percentage (MAX_CONCURRENT_DRAINS): the fleet's RUNNING and DRAINING.
FLEET_BASE = frozenset({"RUNNING", "DRAINING"})
# A write without a recorded span committed after its audit item's `at` and at most this long after: a
# transaction retried through throttling, with its backoff, on a machine shared with the emulators.
COMMIT_SLACK = timedelta(seconds=10)
AUDIT_PREFIX = "AUDIT#"
ACTIVE_ROLLOUT = frozenset({"RUNNING", "PAUSED", "ROLLING_BACK"})


@dataclass(frozen=True)
class Span:
    """When a write committed: after `lo`, before `hi`."""

    lo: datetime
    hi: datetime

    def before(self, other: Span) -> bool:
        """Whether this write certainly committed before `other`."""
        return self.hi < other.lo


# An audit item's (PK, SK) -> when the transaction that put it committed.
Spans = Mapping[tuple[str, str], Span]


class CommitSpans:
    """When each TransactWriteItems of this process was sent and answered, by the audit items it put:
    their commit lies in between, a span much tighter than an audit item's `at` and COMMIT_SLACK. Its
    handlers (`hooks()`) go in first (fleetkeeper_local.faults.installed_hooks), so a fault that replaces
    the answer of a write that landed does not hide it."""

    def __init__(self) -> None:
        self.spans: dict[tuple[str, str], Span] = {}
        self._lock = threading.Lock()

    def hooks(self) -> list[tuple[str, Callable[..., Any]] | tuple[str, Callable[..., Any], object]]:
        return [
            (f"{event}.dynamodb.TransactWriteItems", handler, REGISTER_FIRST)
            for event, handler in (
                ("before-parameter-build", self._audit_keys),
                ("before-call", self._sent),
                ("after-call", self._answered),
            )
        ]

    def _audit_keys(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["stress_audit_keys"] = [
            (str(put["Item"]["PK"]["S"]), str(put["Item"]["SK"]["S"]))
            for item in params.get("TransactItems", [])
            if (put := item.get("Put")) is not None
            and str(put["Item"].get("PK", {}).get("S", "")).startswith(AUDIT_PREFIX)
        ]

    def _sent(self, context: dict[str, Any], **_: Any) -> None:
        context["stress_sent"] = datetime.now(UTC)

    def _answered(self, http_response: Any, context: dict[str, Any], **_: Any) -> None:
        sent = context.get("stress_sent")
        if sent is None or http_response.status_code >= 300:
            return
        span = Span(sent, datetime.now(UTC))
        with self._lock:
            for key in context.get("stress_audit_keys", []):
                self.spans[key] = span


@dataclass(frozen=True)
class Stint:
    """An entity's time in one status, between the writes that began and ended it (None: it goes on)."""

    status: str
    began: Span
    ended: Span | None

    def may_overlap(self, lo: datetime, hi: datetime) -> bool:
        return self.began.lo <= hi and (self.ended is None or self.ended.hi >= lo)

    def certainly_holds(self, at: Span) -> bool:
        return self.began.before(at) and (self.ended is None or at.before(self.ended))


@dataclass(frozen=True)
class Place:
    """A worker's place in its pool's budgets, from the write that took it to the one that gave it back
    (None: held still). The rest is the taking write's: its actor, the owner's reason, the instant it was
    decided at and the version of the pool it was decided on."""

    worker_id: str
    pool: str | None
    actor: str
    reason: str
    since: datetime | None
    pool_version: int | None
    taken: Span
    given_back: Span | None

    @property
    def voluntary(self) -> bool:
        return self.reason in VOLUNTARY

    def certainly_held_at(self, at: Span) -> bool:
        return self.taken.before(at) and (self.given_back is None or at.before(self.given_back))


@dataclass(frozen=True)
class PoolVersion:
    status: str
    budgets: tuple[Budget, ...]
    written: Span


class Trail:
    """The audit trail as timelines: each worker's statuses and places, each pool's versions, each
    rollout's statuses. A write's span is the recorded one (`spans`), else its `at` and COMMIT_SLACK."""

    def __init__(self, shot: Snapshot, spans: Spans | None = None) -> None:
        self.spans = spans or {}
        self.pool_of: dict[str, str | None] = {}
        self.statuses: dict[str, list[Stint]] = {}
        self.places: list[Place] = []
        self.created: dict[str, tuple[dict[str, Any], Span]] = {}
        self.pools: dict[str, list[PoolVersion]] = {}
        self.rollouts: dict[str, list[Stint]] = {}
        self.problems: list[str] = []
        for (entity, entity_id), events in sorted(shot.audit.items()):
            if entity == "worker" and entity_id in shot.workers:
                self._worker(shot.workers[entity_id], events)
            elif entity == "pool":
                self._pool(entity_id, events, shot.pools.get(entity_id))
            elif entity == "rollout":
                self.rollouts[entity_id] = self._stints(events)

    def span(self, event: dict[str, Any]) -> Span:
        found = self.spans.get((str(event.get("PK")), str(event.get("SK"))))
        if found is not None:
            return found
        at = datetime.fromisoformat(str(event["at"]))
        return Span(at, at + COMMIT_SLACK)

    def _stints(self, events: list[dict[str, Any]]) -> list[Stint]:
        stints: list[Stint] = []
        for event in events:
            target = event.get("to_status")
            if target is None or (stints and stints[-1].status == target):
                continue
            span = self.span(event)
            if stints:
                stints[-1] = Stint(stints[-1].status, stints[-1].began, span)
            stints.append(Stint(str(target), span, None))
        return stints

    def _worker(self, worker: dict[str, Any], events: list[dict[str, Any]]) -> None:
        wid = str(worker["id"])
        self.pool_of[wid] = str(worker["pool"]) if worker.get("pool") else None
        self.statuses[wid] = self._stints(events)
        taking: dict[str, Any] | None = None
        for event in events:
            if event.get("action") == "WorkerCreated":
                self.created[wid] = (event, self.span(event))
            moved = int((event.get("details") or {}).get("in_use") or 0)
            if moved > 0:
                if taking is not None:
                    self.problems.append(f"{wid}: took a place at {event.get('at')} while it held one")
                taking = event
            elif moved < 0:
                if taking is None:
                    self.problems.append(f"{wid}: gave back a place at {event.get('at')} it did not hold")
                    continue
                self.places.append(self._place(wid, taking, self.span(event)))
                taking = None
        if taking is not None:
            self.places.append(self._place(wid, taking, None))

    def _place(self, wid: str, taking: dict[str, Any], given_back: Span | None) -> Place:
        details = taking.get("details") or {}
        version = details.get("pool_version")
        return Place(
            worker_id=wid,
            pool=self.pool_of[wid],
            actor=str(taking.get("actor")),
            reason=str(details.get("owner")),
            since=_time(details.get("owner_since")),
            pool_version=int(version) if version is not None else None,
            taken=self.span(taking),
            given_back=given_back,
        )

    def _pool(self, name: str, events: list[dict[str, Any]], item: dict[str, Any] | None) -> None:
        # Each write of a pool is conditional on the version it read, and made its audit item after that
        # read: in time order, the pool's audit items are its versions 1, 2, 3...
        versions: list[PoolVersion] = []
        budgets: tuple[Budget, ...] = ()
        for event in events:
            written = (event.get("details") or {}).get("disruption")
            if written is not None:
                budgets = tuple(DisruptionPolicy.model_validate_json(str(written)).budgets)
            status = event.get("to_status") or (versions[-1].status if versions else "active")
            versions.append(PoolVersion(str(status), budgets, self.span(event)))
        if item is not None and int(item.get("version", 0)) != len(versions):
            self.problems.append(f"pool {name} is at version {item.get('version')}, {len(versions)} audited")
        self.pools[name] = versions

    def possible(self, statuses: frozenset[str], lo: datetime, hi: datetime, pool: str | None) -> int:
        """The workers of `pool` (of the fleet: "*") that may have been in one of `statuses` at some
        instant from `lo` to `hi`."""
        return sum(
            1
            for wid, stints in self.statuses.items()
            if (pool == "*" or self.pool_of.get(wid) == pool)
            and any(s.status in statuses and s.may_overlap(lo, hi) for s in stints)
        )


def allows(limit: int | str, base: int) -> int:
    """How many a budget's `max` lets be disrupted at once: a count, or a percentage of `base` rounded
    up (docs/disruption.md)."""
    text = str(limit).strip()
    if text.endswith("%"):
        return -(-int(text[:-1]) * base // 100)
    return int(text)


@dataclass(frozen=True)
class Judged:
    """A voluntary place taken, as the oracle sees it: the places certainly held in its scope once it
    was taken (its own included) and the most its budget could allow then."""

    place: Place
    in_use: int
    allowed: int
    budget: str

    @property
    def beyond(self) -> bool:
        return self.in_use > self.allowed

    def describe(self) -> str:
        p = self.place
        return (
            f"{p.worker_id} ({p.reason} by {p.actor}, decided at {p.since.isoformat() if p.since else '-'}) "
            f"in pool {p.pool or '-'}: {self.in_use} in use, {self.budget} allows {self.allowed}"
        )


def judge_budgets(
    trail: Trail, *, default: str, simulated_clock: bool = False
) -> tuple[list[Judged], list[str]]:
    """Every voluntary place taken, judged on its own: the most restrictive of its pool's budgets that
    applies to its reason at the instant it was decided (its window open, the reason among those it
    names), else the stage default fleet-wide; and what the trail cannot judge.

    Sound, not exact: a place counts as held when it certainly was, as the commit spans order them, and
    a percentage takes the most members the pool may have had between the decision and the commit (the
    door reads them in between). `simulated_clock`: the decisions' instants are not the wall clock (a
    test's), so the door's read is bounded by the commit less COMMIT_SLACK (a decider running beside it,
    such as scale-down's stops, may change the members in between)."""
    judged: list[Judged] = []
    problems = list(trail.problems)
    for place in trail.places:
        if not place.voluntary:
            continue
        if place.since is None:
            problems.append(f"{place.worker_id}: a {place.reason} place without its instant")
            continue
        read_from = place.taken.lo - COMMIT_SLACK if simulated_clock else min(place.since, place.taken.lo)
        budgets: list[tuple[int, int]] = []  # (allowed, index) of each budget that applies
        if place.pool is not None:
            versions = trail.pools.get(place.pool, [])
            if place.pool_version is None or not 0 < place.pool_version <= len(versions):
                problems.append(f"{place.worker_id}: decided on version {place.pool_version} of {place.pool}")
                continue
            members = trail.possible(POOL_MEMBERS, read_from, place.taken.hi, place.pool)
            for index, budget in enumerate(versions[place.pool_version - 1].budgets):
                named = budget.reasons is None or place.reason in {str(r) for r in budget.reasons}
                if named and budget.window_at(place.since).active:
                    budgets.append((allows(budget.max, members), index))
        if budgets:
            allowed, index = min(budgets)
            scope, name = place.pool, f"budget {index} of pool {place.pool}"
        else:
            fleet = trail.possible(FLEET_BASE, read_from, place.taken.hi, "*")
            allowed, scope, name = allows(default, fleet), "*", f"the stage default {default}"
        held = sum(
            1
            for other in trail.places
            if other.worker_id != place.worker_id
            and scope in ("*", other.pool)
            and other.certainly_held_at(place.taken)
        )
        judged.append(Judged(place, held + 1, allowed, name))
    return judged, problems


def _door(shot: Snapshot, default: str, spans: Spans | None, found: dict[str, list[str]]) -> int:
    """The door's invariants, from one reading of the trail; how many voluntary places it judged."""
    trail = Trail(shot, spans)
    judged, problems = judge_budgets(trail, default=default)
    found["voluntary disruptions beyond a budget"] += [j.describe() for j in judged if j.beyond]
    found["voluntary disruptions beyond a budget"] += [f"not judged: {p}" for p in problems]
    _counts(shot, found)
    _new_workers(trail, found)
    _held_replacements(trail, found)
    return len(judged)


def _counts(shot: Snapshot, found: dict[str, list[str]]) -> None:
    """Each pool's DISRUPTING#<pool> item (and each template's attribute of it) and the fleet's count
    the workers with a counted owner."""
    owned: Counter[str] = Counter()
    for worker in shot.workers.values():
        if (worker.get("owner") or {}).get("counted", False):
            pool = worker.get("pool") or "-"
            owned[f"DISRUPTING#{pool}"] += 1
            owned[f"DISRUPTING#{pool} in_use#{worker.get('template')}"] += 1
            owned["DISRUPTING"] += 1
    stored: Counter[str] = Counter()
    for pk, item in shot.counts.items():
        for name, value in item.items():
            if name == "in_use":
                stored[pk] += int(value)
            elif name.startswith("in_use#"):
                stored[f"{pk} {name}"] += int(value)
    for key in sorted(set(owned) | set(stored)):
        if owned[key] != stored[key]:
            found["disruption counts disagree with owners"].append(
                f"{key}: stored {stored[key]}, {owned[key]} workers with a counted owner"
            )


def _new_workers(trail: Trail, found: dict[str, list[str]]) -> None:
    """A worker is created only into a pool that is active when the creation commits."""
    for wid, (event, span) in sorted(trail.created.items()):
        pool = trail.pool_of.get(wid)
        for version, stint in enumerate(_pool_stints(trail.pools.get(pool or "", [])), start=1):
            if stint.status != "active" and stint.certainly_holds(span):
                found["worker created in a pool that was not active"].append(
                    f"{wid} created by {event.get('actor')} at {event.get('at')} while pool {pool} was "
                    f"{stint.status} (version {version})"
                )


def _pool_stints(versions: list[PoolVersion]) -> list[Stint]:
    return [
        Stint(v.status, v.written, versions[n + 1].written if n + 1 < len(versions) else None)
        for n, v in enumerate(versions)
    ]


def _held_replacements(trail: Trail, found: dict[str, list[str]]) -> None:
    """A rollout's replacement is the rollout's while it is active: no other voluntary disruption takes
    it (an operator or EC2 may)."""
    made_by = {
        wid: str(event.get("actor")).removeprefix(ROLLOUT_ACTOR)
        for wid, (event, _) in trail.created.items()
        if str(event.get("actor")).startswith(ROLLOUT_ACTOR)
    }
    for place in trail.places:
        rid = made_by.get(place.worker_id)
        if rid is None or not place.voluntary or place.actor == ROLLOUT_ACTOR + rid:
            continue
        for stint in trail.rollouts.get(rid, []):
            if stint.status in ACTIVE_ROLLOUT and stint.certainly_holds(place.taken):
                found["replacement of a rollout stopped by someone else while the rollout was active"].append(
                    f"{place.worker_id}, made by {rid} ({stint.status}), taken by {place.actor} "
                    f"({place.reason}) decided at {place.since.isoformat() if place.since else '-'}"
                )
                break


def covered(shot: Snapshot) -> dict[str, int]:
    """What the run went through, from the table: a run without scale-downs or operations checked
    nothing about them."""
    moves = [e for (entity, _), events in shot.audit.items() if entity == "worker" for e in events]
    pool_writes = [e for (entity, _), events in shot.audit.items() if entity == "pool" for e in events]
    operations = [op for ops in shot.operations.values() for op in ops]
    return {
        "scale-downs": sum(
            1
            for e in moves
            if e.get("actor") == SCALE_DOWN_ACTOR and e.get("from_status") == WorkerStatus.RUNNING
        ),
        "expiry drains": sum(
            1
            for e in moves
            if e.get("action") == "WorkerDrainStarted" and str(e.get("reason") or "").startswith(EXPIRED)
        ),
        "budget changes": sum(
            1
            for e in pool_writes
            if e.get("action") != "PoolCreated" and "disruption" in (e.get("details") or {})
        ),
        "pool drains": sum(
            1 for e in pool_writes if e.get("to_status") == "draining" and e.get("from_status") != "draining"
        ),
        "drains completed": sum(1 for e in moves if e.get("action") == "WorkerDrainCompleted"),
        "operations": len(operations),
        "before_stop operations": sum(1 for op in operations if op.get("origin") == "before_stop"),
        "operations succeeded": sum(1 for op in operations if op.get("status") == "SUCCESS"),
        "rollouts": len(shot.rollouts),
        "rollouts succeeded": sum(1 for r in shot.rollouts.values() if r.get("status") == "SUCCEEDED"),
        "rollouts rolled back": sum(1 for r in shot.rollouts.values() if r.get("status") == "ROLLED_BACK"),
        "rollout replacements": sum(int(r.get("replaced") or 0) for r in shot.rollouts.values()),
    }


def _no_capacity(call: Call) -> bool:
    error = call.payload.get("error") if isinstance(call.payload, dict) else None
    return (call.status, error) == NO_CAPACITY


def _statuses(seen: Observations, found: dict[str, list[str]]) -> int:
    """Every 5xx is a violation; the full-fleet answers are counted apart (their number is returned)."""
    found["5xx answer"] = [
        f"{c.op} {c.method} {c.path} -> {c.status} {c.payload}" for c in seen.calls if c.status >= 500
    ]
    return sum(1 for c in seen.calls if _no_capacity(c))


def check(
    seen: Observations,
    dynamodb: Any,
    table: str,
    ec2: Any,
    at: datetime,
    *,
    cooldown: timedelta | None = None,
    default: str | None = None,
    spans: Spans | None = None,
) -> Report:
    """Every invariant on the settled fleet; `default` is the stage's MAX_CONCURRENT_DRAINS (the door's
    are judged only with it), `spans` the commit spans recorded in this process (CommitSpans)."""
    found: dict[str, list[str]] = {name: [] for name in INVARIANTS}
    shot = snapshot(dynamodb, table)
    _placements_after_drains(seen, shot, found)
    _exclusive_acks(seen, shot, found)
    _slots(seen, shot, found)
    _drains(shot, at, found)
    _drain_endings(shot, found)
    _stranded(shot, found)
    _machines(shot, machines(ec2), found)
    _ends(seen, shot, found)
    _versions(seen, shot, found)
    _audit(shot, found)
    _placements_kept(seen, shot, found)
    _scale_downs(shot, cooldown, found)
    _operation_locks(shot, found)
    _before_stops(shot, found)
    ran = first_running(shot)
    for sample in seen.rollout_samples:
        judge_rollout_sample(sample, found, ran)
    _rollouts_at_end(shot, at, found)
    judged = _door(shot, default, spans, found) if default is not None else 0
    no_capacity = _statuses(seen, found)
    found["harness error"] = list(seen.errors)
    answers: dict[str, Counter[int]] = defaultdict(Counter)
    for c in seen.calls:
        answers[c.op][c.status] += 1
    return Report(
        answers={op: dict(sorted(counts.items())) for op, counts in sorted(answers.items())},
        no_capacity=no_capacity,
        violations=found,
        operations=sum(seen.operations.values()),
        operations_by_kind=dict(seen.operations),
        server_errors=len(found["5xx answer"]),
        ticks=dict(seen.ticks),
        tick_failures=dict(seen.tick_failures),
        covered=covered(shot)
        | {
            "rollout samples": sum(1 for r in seen.rollout_samples if r.rollout.get("status") == "RUNNING"),
            "voluntary places judged": judged,
        },
    )
