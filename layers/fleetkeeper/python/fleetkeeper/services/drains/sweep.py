"""The reconcile cycle's drain sweep: every open drain of the shard is looked at each cycle, Step
Functions is called only for what is due, on parallel threads, inside the invocation's time budget.

The status index lists the open drains (a DRAINING worker of the shard whose drain is RUNNING; on the
lead shard, each draining pool), and their marks say which have a call due. Those are taken in batches,
each read again from the items (one consistent BatchGetItem: the index may lag), and for each the sweep

1. answers its token when the worker (or pool) is empty but no signal came (a lost signal);
2. otherwise sends the waiting task a heartbeat when one is due, so a long drain costs no re-checks;
3. has the watchdog (watchdog.py) describe its execution when that is due, and restart or close a lost
   one.

When each call is due, and in what order the drains are taken (lost signals, then the longest waiting),
is domain/drain_sweep.py; what the sweep last did for a drain is its mark (store/drain_marks.py). The
batches run on SWEEP_PARALLELISM threads. A drain whose turn comes with less than SWEEP_MARGIN_SECONDS
left of the invocation is not started: it is counted `deferred`, and being the longest waiting, goes
first next cycle. One drain that fails is logged and counted (`errors`); the others are still swept.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeVar

from fleetkeeper.domain.drain_sweep import (
    DrainKind,
    DrainMark,
    DueWork,
    describe_due,
    heartbeat_due,
    marked,
    sweep_order,
    waiting_since,
)
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, Pool, Worker, utcnow
from fleetkeeper.domain.sharding import WHOLE_FLEET, Shard
from fleetkeeper.observability import logger
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains.watchdog import (
    START_GRACE,
    is_young,
    pool_execution_arn,
    watch_pool,
    watch_worker,
    worker_execution_arn,
)

# The keys a sweep always returns: the signals', the watchdog's verdicts, and what was left for later.
SWEEP_COUNTS = (
    "completed",
    "heartbeats",
    "errors",
    "running",
    "young",
    "restarted",
    "closed",
    "settled",
    "deferred",
    "not_due",
)
# Step Functions and DynamoDB calls of one sweep run on this many threads (boto3 clients are thread-safe).
SWEEP_PARALLELISM = 8
# Drains per task: their items are read in one BatchGetItem, their calls made one after another.
_BATCH = 20
# Marks read per BatchGetItem (DynamoDB's limit), the reads in parallel.
_MARKS_PER_READ = 100
# No drain is started with less than this left of the invocation: what is under way still ends, and the
# cycle still releases its lease and publishes its report before the Lambda times out.
SWEEP_MARGIN_SECONDS = 5.0

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class _Task:
    due: DueWork
    mark: DrainMark | None


def sweep_waiting_drains(
    ctx: Context,
    shard: Shard = WHOLE_FLEET,
    *,
    time_left: Callable[[], float] | None = None,
    now: datetime | None = None,
    grace: timedelta = START_GRACE,
    draining: Iterable[Worker] | None = None,
) -> dict[str, int]:
    """Recover lost signals, keep waiting drains alive and run the watchdog, for what is due and fits
    in `time_left()` (seconds left of the invocation; unbounded without it). Counts per SWEEP_COUNTS.
    `draining`: the shard's DRAINING workers as the caller has just read them from the index; without
    it the sweep reads them."""
    return dict(_sweep(ctx, shard, now or utcnow(), grace, time_left, signals=True, draining=draining))


def run_watchdog(
    ctx: Context,
    *,
    now: datetime | None = None,
    grace: timedelta = START_GRACE,
    shard: Shard = WHOLE_FLEET,
    time_left: Callable[[], float] | None = None,
) -> Counter[str]:
    """The watchdog's part of the sweep alone: describe the executions that are due, restart or close
    the lost ones. Counts per verdict, plus `errors`, `deferred` and `not_due`."""
    return _sweep(ctx, shard, now or utcnow(), grace, time_left, signals=False)


def _sweep(
    ctx: Context,
    shard: Shard,
    now: datetime,
    grace: timedelta,
    time_left: Callable[[], float] | None,
    *,
    signals: bool,
    draining: Iterable[Worker] | None = None,
) -> Counter[str]:
    remaining = time_left or (lambda: math.inf)
    counts: Counter[str] = Counter(dict.fromkeys(SWEEP_COUNTS, 0))
    # The index lists the shard's open drains (it may lag by a cycle); each drain with a call due is read
    # again from its item, in its own task, before anything is decided.
    if draining is None:
        draining = ctx.store.iter_workers_by_status([WorkerStatus.DRAINING], shard=shard)
    workers = [
        (worker, worker.drain)
        for worker in draining
        if shard.owns(worker.id) and worker.drain is not None and worker.drain.outcome == DrainOutcome.RUNNING
    ]
    pools = _open_pool_drains(ctx) if shard.leads else []
    subjects: list[tuple[DrainKind, str]] = [("worker", w.id) for w, _ in workers]
    subjects += [("pool", p.name) for p in pools]
    chunks = [subjects[start : start + _MARKS_PER_READ] for start in range(0, len(subjects), _MARKS_PER_READ)]
    marks = {key: mark for found in _in_threads(ctx.store.drain_marks, chunks) for key, mark in found.items()}
    rules = _Rules(
        ctx,
        now=now,
        grace=grace,
        signals=signals,
        heartbeat=timedelta(seconds=ctx.settings.drain_heartbeat_seconds),
        interval=timedelta(seconds=ctx.settings.drain_watchdog_interval_seconds),
    )

    tasks: list[_Task] = []
    for worker, record in workers:
        mark = marks.get(("worker", worker.id))
        work, young = rules.worker_due(worker, record, mark)
        counts["young"] += young
        tasks.append(_Task(work, mark))
    for pool in pools:
        mark = marks.get(("pool", pool.name))
        work, young = rules.pool_due(pool, mark)
        counts["young"] += young
        tasks.append(_Task(work, mark))

    due = sweep_order([task.due for task in tasks if task.due.calls])
    counts["not_due"] += len(tasks) - len(due)
    marks_by_subject = {(task.due.kind, task.due.key): task.mark for task in tasks}

    def run(batch: list[DueWork]) -> Counter[str]:
        """A batch of drains, in order, each started only while time is left; the batch's worker
        items read in one consistent BatchGetItem (the index may lag) when its first drain starts."""
        done: Counter[str] = Counter()
        fresh: dict[str, Worker] | None = None
        for work in batch:
            if remaining() < SWEEP_MARGIN_SECONDS:
                done["deferred"] += 1  # first in line next cycle: it has waited longest
                continue
            mark = marks_by_subject[work.kind, work.key]
            try:
                if work.kind == "pool":
                    done.update(_sweep_pool(ctx, work, mark, rules))
                    continue
                if fresh is None:
                    ids = [w.key for w in batch if w.kind == "worker"]
                    fresh = {worker.id: worker for worker in ctx.store.get_workers(ids)}
                done.update(_sweep_worker(ctx, fresh.get(work.key), mark, rules))
            except Exception:
                logger.exception("sweep of an open drain failed", extra={"kind": work.kind, "key": work.key})
                done["errors"] += 1
        return done

    # Consecutive batches go to parallel threads, so the longest-waiting drains are started first.
    batches = [due[start : start + _BATCH] for start in range(0, len(due), _BATCH)]
    for done in _in_threads(run, batches):
        counts.update(done)
    if counts["deferred"]:
        logger.warning(
            "drain sweep out of time; the rest waits for the next cycle", deferred=counts["deferred"]
        )
    return counts


@dataclass(frozen=True)
class _Rules:
    """What is due for a drain this sweep (domain/drain_sweep.py), with the sweep's clock and settings."""

    ctx: Context
    now: datetime
    grace: timedelta
    signals: bool
    heartbeat: timedelta
    interval: timedelta

    def worker_due(self, worker: Worker, record: DrainRecord, mark: DrainMark | None) -> tuple[DueWork, bool]:
        """What is due for this worker drain, and whether it is too young to be described."""
        token = record.task_token if self.signals else None
        complete = token is not None and worker.active_instances == 0
        beat = token is not None and not complete and heartbeat_due(mark, token, self.now, self.heartbeat)
        young = is_young(record.restarts, record.started_at, self.now, self.grace)
        # A young drain is never described, so its execution's name is not needed either.
        describe = not young and describe_due(
            mark, worker_execution_arn(self.ctx, worker.id, record), self.now, self.interval
        )
        since = waiting_since(mark, heartbeat=beat, describe=describe)
        return DueWork("worker", worker.id, complete, beat, describe, since), young

    def pool_due(self, pool: Pool, mark: DrainMark | None) -> tuple[DueWork, bool]:
        young = is_young(pool.drain_restarts, pool.drain_started_at or self.now, self.now, self.grace)
        describe = not young and describe_due(
            mark, pool_execution_arn(self.ctx, pool), self.now, self.interval
        )
        # Whether a pool is empty takes reading its workers: a waiting pool drain is looked at every cycle.
        look = self.signals and pool.drain_task_token is not None
        since = waiting_since(mark, heartbeat=look, describe=describe)
        return DueWork("pool", pool.name, complete=look, describe=describe, waiting_since=since), young


def _open_pool_drains(ctx: Context) -> list[Pool]:
    return [
        pool
        for pool in ctx.store.list_pools()
        if pool.status == PoolStatus.DRAINING
        and (pool.drain_outcome == DrainOutcome.RUNNING or pool.drain_task_token is not None)
    ]


def _in_threads(call: Callable[[T], R], items: Iterable[T]) -> list[R]:
    """`call` over the items on SWEEP_PARALLELISM threads, in order, each in a copy of the caller's
    context (the logger's keys and anything else kept in context variables)."""
    pending = list(items)
    if len(pending) <= 1:
        return [call(item) for item in pending]
    with ContextThreadPool(max_workers=SWEEP_PARALLELISM) as pool:
        futures = [pool.submit(call, item) for item in pending]
        return [future.result() for future in futures]


def _sweep_worker(ctx: Context, worker: Worker | None, mark: DrainMark | None, rules: _Rules) -> Counter[str]:
    """One worker drain, decided on its item as read for this sweep (None: it is gone)."""
    counts: Counter[str] = Counter()
    record = worker.drain if worker is not None else None
    if worker is None or worker.status != WorkerStatus.DRAINING or record is None:
        return Counter(settled=1)
    if record.outcome != DrainOutcome.RUNNING:
        return Counter(settled=1)
    work, _ = rules.worker_due(worker, record, mark)
    token = record.task_token
    answered = False
    beat: str | None = None
    described: str | None = None
    if work.complete and token:
        answered = ctx.workflows.succeed(token, {"worker_id": worker.id, "empty": True, "recovered": True})
        counts["completed"] += answered
    elif work.heartbeat and token and ctx.workflows.heartbeat(token):
        counts["heartbeats"] += 1
        beat = token
    if work.describe and not answered:
        verdict = watch_worker(ctx, worker, rules.now, rules.grace)
        counts[verdict] += 1
        if verdict == "running":
            described = worker_execution_arn(ctx, worker.id, record)
    if beat or described:
        marked_now = marked(
            mark, "worker", worker.id, now=rules.now, heartbeat_token=beat, described_arn=described
        )
        ctx.store.put_drain_mark(marked_now, now=rules.now)
    return counts


def _sweep_pool(ctx: Context, work: DueWork, mark: DrainMark | None, rules: _Rules) -> Counter[str]:
    counts: Counter[str] = Counter()
    pool = ctx.store.get_pool(work.key)  # the listing came from an index; act on the item
    token = pool.drain_task_token
    answered = False
    beat: str | None = None
    described: str | None = None
    if work.complete and pool.status == PoolStatus.DRAINING and token:
        if ctx.store.pool_active_instances(pool.name) == 0:
            answered = ctx.workflows.succeed(token, {"pool": pool.name, "empty": True})
            counts["completed"] += answered
        elif heartbeat_due(mark, token, rules.now, rules.heartbeat) and ctx.workflows.heartbeat(token):
            counts["heartbeats"] += 1
            beat = token
    if work.describe and not answered:
        verdict = watch_pool(ctx, pool, rules.now, rules.grace)
        counts[verdict] += 1
        if verdict == "running":
            described = pool_execution_arn(ctx, pool)
    if beat or described:
        marked_now = marked(
            mark, "pool", pool.name, now=rules.now, heartbeat_token=beat, described_arn=described
        )
        ctx.store.put_drain_mark(marked_now, now=rules.now)
    return counts
