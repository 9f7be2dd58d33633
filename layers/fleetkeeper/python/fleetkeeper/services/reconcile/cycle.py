"""The reconcile cycle: the lease, the batched reads, one isolated step per worker, the report.

Mutual exclusion: a cycle holds the `reconcile` lease (a conditional write on one item) for its whole
run; a second invocation that finds it held returns at once. A sharded reconciler runs one cycle per
shard in parallel, each over its own share of the workers (domain/sharding.py) under its own lease
(`reconcile#2of4`). On top of that every worker write is
conditional on version and status, and a launch is claimed on the worker item before RunInstances, so
even a cycle that outlived its lease cannot launch a second machine for the same worker.

Isolation: whatever one worker raises, in planning or in acting, is logged with its id, counted
(`worker_errors`) and backed off on that worker alone (RETRY, persisted); the other workers and the
drain sweep go on. An EC2 read that fails for a region backs off that region's workers only. Launches
and starts are made in batches (one RunInstances per batch of launches alike, one StartInstances per
region and instance type), each worker's part of them isolated the same way: a call that fails is met
by each of its workers as its own.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError

from fleetkeeper.cloud import retry
from fleetkeeper.cloud.ec2 import CapacityError, Ec2Instance
from fleetkeeper.cloud.fleet_reads import metrics_due, read_instances, read_metrics
from fleetkeeper.domain.errors import Conflict, NotFound, Unavailable
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.reconcile import (
    Ec2Call,
    Observation,
    Outcome,
    Step,
    decide,
    is_due,
)
from fleetkeeper.domain.sharding import Shard, split_mismatch
from fleetkeeper.observability import emit_counters, logger, metrics
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.services import admission, drains, operations
from fleetkeeper.services.capacity import PoolReads
from fleetkeeper.services.context import Context
from fleetkeeper.services.layout import keep_layout
from fleetkeeper.services.reconcile import provisioning
from fleetkeeper.services.reconcile.actions import (
    Result,
    Work,
    apply_step,
    back_off,
    fail,
    is_start,
    start_all,
    start_desired_drain,
)
from fleetkeeper.services.reconcile.capacity import launch_refused, scale_out
from fleetkeeper.services.reconcile.drift import plan_drift
from fleetkeeper.services.reconcile.expiry import replace_expired
from fleetkeeper.services.reconcile.images import NewestImages
from fleetkeeper.services.reconcile.repair import repair_workers
from fleetkeeper.services.reconcile.scale_down import plan_steady_running, scale_down
from fleetkeeper.services.repair import BRAKE_NOTE
from fleetkeeper.services.rollouts.auto import start_auto_rollouts
from fleetkeeper.services.rollouts.engine import advance_rollouts
from fleetkeeper.services.rollouts.rollbacks import advance_rollbacks
from fleetkeeper.services.stats import RECONCILE_SCOPE, reconcile_scope

LEASE_NAME = "reconcile"
STATS_SCOPE = RECONCILE_SCOPE

# Every status but TERMINATED: the growing history is never read by the reconciler.
RECONCILE_STATUSES = tuple(s for s in WorkerStatus if s != WorkerStatus.TERMINATED)
# Stop starting new work when less than this is left of the invocation.
SAFETY_MARGIN_SECONDS = 10.0
# A PENDING worker whose launch EC2 refused (a final error) this many times in a row is FAILED: about ten
# minutes at the longest backoff, time enough for a capacity shortage or a configuration fix.
MAX_REFUSED_LAUNCHES = 10
# EC2 and DynamoDB calls of one cycle run on this many threads (boto3 clients are thread-safe).
PARALLELISM = 16

# Metric names the stack's dashboard and alarms read (infra/metrics.py holds the same list).
METRIC_DURATION_MS = "ReconcileDurationMs"
METRIC_ERRORS = "ReconcileErrors"
METRIC_HEARTBEAT = "ReconcileHeartbeat"


def workers_metric(status: WorkerStatus) -> str:
    """The gauge of workers in one status, e.g. WorkersRunning."""
    return "Workers" + status.value.capitalize()


def is_retryable(error: BaseException) -> bool:
    """Whether trying again later may succeed: AWS's own classification (cloud/retry.py), plus a store
    call that already spent its retries on a retryable error (`Unavailable`)."""
    return isinstance(error, Unavailable) or retry.is_retryable(error)


def _is_aws_error(error: BaseException) -> bool:
    return retry.error_code(error) is not None or isinstance(error, BotoCoreError)


@dataclass
class CycleReport:
    """What one cycle did; counters carry the names served by GET /api/v1/stats."""

    shard: Shard = field(default_factory=Shard)
    lease_acquired: bool = True
    completed: bool = False
    # Why the cycle did not run at all (a shard split the stage is not configured for), if it did not.
    refused: str | None = None
    # This shard's workers (the whole fleet's when unsharded); `by_status` counts the whole fleet.
    workers: int = 0
    by_status: Counter[WorkerStatus] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    # Last-cycle words kept in the shard's own stats scope, e.g. the pools whose repair brake held.
    notes: dict[str, dict[str, str]] = field(default_factory=dict)
    duration_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard.index,
            "shards": self.shard.count,
            "lease_acquired": self.lease_acquired,
            **({"refused": self.refused} if self.refused else {}),
            "workers": self.workers,
            "duration_seconds": round(self.duration_seconds, 3),
            "counters": dict(sorted(self.counters.items())),
        }


def reconcile_fleet(
    ctx: Context,
    *,
    time_left: Callable[[], float] | None = None,
    owner: str | None = None,
    now: datetime | None = None,
    shard: Shard | None = None,
) -> CycleReport:
    """Run one reconcile cycle over every worker of the shard (the whole fleet by default) needing
    action, unless another cycle of the same shard is running."""
    started = time.monotonic()
    now = now or utcnow()
    remaining = time_left or (lambda: 900.0)
    owner = owner or uuid.uuid4().hex
    report = CycleReport(shard=shard or Shard())
    report.refused = split_mismatch(report.shard, ctx.settings.reconcile_shards)
    if report.refused is not None:
        # A by-hand run or a schedule left over from another split: running it would overlap the
        # configured shards. Refused loudly, but not as a failure: a deploy that changes the split
        # can deliver one such tick, and the missing shard shows in `reconcile-not-running`.
        report.lease_acquired = False
        report.counters["shard_mismatch"] += 1
        logger.warning("reconcile cycle refused", reason=report.refused)
        ctx.stats.record(STATS_SCOPE, counters=report.counters)
        emit_counters("Reconcile", report.counters)
        return report
    lease = LEASE_NAME + report.shard.suffix
    stats = ctx.stats
    # The lease runs on the wall clock, whatever `now` the cycle decides with.
    wall = utcnow()
    lease_until = wall + timedelta(seconds=max(remaining(), 1.0) + SAFETY_MARGIN_SECONDS)
    if not stats.acquire_lease(lease, owner, now=wall, until=lease_until):
        report.lease_acquired = False
        report.counters["lease_busy"] += 1
        logger.info("another reconcile cycle holds the lease; skipping this one")
        _publish(ctx, report, now)
        return report
    try:
        draining: list[Worker] | None = None
        try:
            draining = _run_cycle(ctx, report, now, remaining)
            _advance_rollouts(ctx, report, remaining)
        except Exception:
            # Even a cycle that could not read its workers keeps the waiting drains alive.
            _sweep_drains(ctx, report, remaining, draining)
            raise
        _sweep_drains(ctx, report, remaining, draining)
    finally:
        stats.release_lease(lease, owner, now=utcnow())
        report.duration_seconds = time.monotonic() - started
        _publish(ctx, report, now)
    return report


def _sweep_drains(
    ctx: Context, report: CycleReport, remaining: Callable[[], float], draining: list[Worker] | None
) -> None:
    """Keep waiting drains alive and complete those whose last signal was lost (see services/drains), in
    what is left of the invocation after the cycle's own work. `draining`: the cycle's own read of its
    DRAINING workers, or None when it has none and the sweep reads them itself."""
    try:
        swept = drains.sweep_waiting_drains(ctx, report.shard, time_left=remaining, draining=draining)
    except Exception:  # the sweep runs again next cycle
        # The drains' own heartbeat re-check remains meanwhile.
        logger.exception("sweep of waiting drains failed")
        report.counters["drain_sweep_errors"] += 1
        return
    report.counters["drain_signals_recovered"] += swept["completed"]
    report.counters["drain_heartbeats"] += swept["heartbeats"]
    # The watchdog's findings: executions restarted for their generation, drains closed with ERROR, and
    # drains whose check failed this cycle (each isolated; they are looked at again next cycle).
    report.counters["drain_executions_restarted"] += swept.get("restarted", 0)
    report.counters["drain_executions_closed"] += swept.get("closed", 0)
    report.counters["drain_sweep_errors"] += swept.get("errors", 0)
    # Drains with a call due that did not fit the time left: first in line next cycle.
    report.counters["drain_sweep_deferred"] += swept.get("deferred", 0)


def _advance_rollouts(ctx: Context, report: CycleReport, remaining: Callable[[], float]) -> None:
    """Rollouts span shards: the leading shard alone advances them, after the workers' own steps."""
    if not report.shard.leads:
        return
    # Rollouts and rollbacks each in their own try: a failure of one does not hold the other back.
    for advance in (advance_rollouts, advance_rollbacks):
        try:
            advance(ctx, report.counters, time_left=remaining, margin_seconds=SAFETY_MARGIN_SECONDS)
        except Exception:  # they wait a cycle; nothing else depends on them
            logger.exception("rollout steps failed", phase=advance.__name__)
            report.counters["rollout_errors"] += 1


def _run_cycle(
    ctx: Context, report: CycleReport, now: datetime, remaining: Callable[[], float]
) -> list[Worker]:
    """The cycle's work on its shard's workers; the DRAINING ones it read, for the drain sweep."""
    shard = report.shard
    # A shard reads its own buckets of the status index, and the fleet-wide counts the scale-down
    # guards need from the exact counters (store/counters.py); while the table is being migrated to
    # that layout, every shard reads the whole index instead, as before (store/layout.py).
    read = ctx.store.reconcile_read(RECONCILE_STATUSES, shard)
    workers = read.workers
    report.workers = len(workers)
    report.by_status = read.counts.by_status
    due = [w for w in workers if is_due(w, now)]
    report.counters["outcome_skip"] += len(workers) - len(due)
    report.counters["backoff_waiting"] += len(workers) - len(due)

    observations, unreadable = _observe(ctx, due, report, shard=shard)
    readings = _collect_metrics(ctx, due, now, report)
    work = [_plan(ctx, worker, observations, unreadable, now) for worker in due]
    # Drift and launches ask the same question of each template's filter: answered once this cycle.
    images = NewestImages(ctx)
    # Scale-in and scale-out assess the same policy pools: what the first read, the second reuses.
    pool_reads = PoolReads(ctx)
    try:
        plan_steady_running(ctx, work, readings, now, report.counters, counts=read.counts, reads=pool_reads)
    except Exception:  # scale-down waits a cycle; every other step still runs
        logger.exception("scale-down planning failed")
        report.counters["scale_down_errors"] += 1
        report.counters["reconcile_errors"] += 1
    try:
        # After scale-down, which rewrites the changes of the steps it plans (services/reconcile/drift.py).
        plan_drift(ctx, work, now, report.counters, images)
    except Exception:  # drift waits a cycle; every step still runs
        logger.exception("drift planning failed")
        report.counters["drift_errors"] += 1
        report.counters["reconcile_errors"] += 1

    for item in work:
        if not item.needs_io():
            report.counters[f"outcome_{item.step.outcome.lower()}"] += 1
    busy = [item for item in work if item.needs_io()]

    def finish(item: Work, step: Callable[[Counter[str]], Outcome]) -> Result:
        return isolated(ctx, item, now, step)

    def in_time(item: Work, step: Callable[[Counter[str]], Outcome]) -> Result:
        if remaining() < SAFETY_MARGIN_SECONDS:
            # Out of time: what is left waits for the next cycle rather than being cut off mid-step.
            return Outcome.REQUEUE, Counter(deferred=1)
        return finish(item, step)

    # Launches and starts are made in batches, each worker's own part isolated as any step is; a claim
    # on a batch's place, and what follows a call that was made (a pairing, a refusal), is never deferred.
    launches = [i for i in busy if i.error is None and i.step.call is Ec2Call.LAUNCH]
    starts = [i for i in busy if is_start(i)]
    batched = {id(i) for i in (*launches, *starts)}
    alone = [i for i in busy if id(i) not in batched]
    with ContextThreadPool(max_workers=PARALLELISM) as pool:
        results = [
            *pool.map(lambda item: in_time(item, lambda c: _dispatch(ctx, item, now, c, images)), alone),
            *provisioning.launch_all(
                ctx, launches, now=now, images=images, pool=pool, run=in_time, finish=finish
            ),
            *start_all(ctx, starts, pool=pool, run=in_time, finish=finish),
        ]
    for outcome, counters in results:
        report.counters[f"outcome_{outcome.lower()}"] += 1
        report.counters.update(counters)

    _after_steps(ctx, work, workers, report, now=now, remaining=remaining, reads=pool_reads)
    if shard.leads:
        _lead_steps(ctx, work, report, remaining)

    report.counters["running_worker_count"] = report.by_status[WorkerStatus.RUNNING]
    report.completed = True
    return [w for w in workers if w.status == WorkerStatus.DRAINING]


def _after_steps(
    ctx: Context,
    work: list[Work],
    workers: list[Worker],
    report: CycleReport,
    *,
    now: datetime,
    remaining: Callable[[], float],
    reads: PoolReads,
) -> None:
    """What follows the workers' own steps, so it never delays them, each on its own: a failure waits a
    cycle and holds none of the others back."""
    counters = report.counters

    def repair() -> None:
        report.notes[BRAKE_NOTE] = repair_workers(
            ctx, workers, now, counters, time_left=remaining, margin_seconds=SAFETY_MARGIN_SECONDS
        )

    steps: list[tuple[str, str, Callable[[], None]]] = [
        # On fresh reads: owners left by disruptions that never started, and disruptions no owner counts
        # (services/admission.py).
        (
            "settling owners",
            "owner_errors",
            lambda: admission.settle_owners(
                ctx,
                [i.worker for i in work if not i.needs_io()],
                counters,
                now,
                time_left=remaining,
                margin_seconds=SAFETY_MARGIN_SECONDS,
            ),
        ),
        (
            "replacing expired workers",
            "expiry_errors",
            lambda: replace_expired(
                ctx, work, now, counters, time_left=remaining, margin_seconds=SAFETY_MARGIN_SECONDS
            ),
        ),
        ("repairing sick workers", "repair_errors", repair),
        (
            # After scale-in, repairs and expiry: its own read of the counts sees their workers.
            "scaling out",
            "capacity_errors",
            lambda: scale_out(
                ctx,
                now,
                counters,
                owns=report.shard.owns,
                time_left=remaining,
                margin_seconds=SAFETY_MARGIN_SECONDS,
                reads=reads,
            ),
        ),
        (
            "worker operations",
            "operation_errors",
            lambda: operations.reconcile_operations(
                ctx,
                workers,
                now,
                counters,
                time_left=remaining,
                margin_seconds=SAFETY_MARGIN_SECONDS,
                owns=report.shard.owns,
            ),
        ),
    ]
    for what, counter, step in steps:
        try:
            step()
        except Exception:
            logger.exception(f"{what} failed")
            counters[counter] += 1


def _lead_steps(ctx: Context, work: list[Work], report: CycleReport, remaining: Callable[[], float]) -> None:
    """What the leading shard alone does, after the workers' steps: start auto rollouts (they span
    shards), then keep the table's layout."""
    try:
        # After the workers' steps wrote their drift (services/rollouts/auto.py).
        start_auto_rollouts(
            ctx,
            [item.planned for item in work],
            report.counters,
            time_left=remaining,
            margin_seconds=SAFETY_MARGIN_SECONDS,
        )
    except Exception:  # the start waits a cycle; the worker steps above already ran
        logger.exception("auto rollouts failed")
        report.counters["auto_rollout_errors"] += 1
    try:
        # After everything else, within what is left of the invocation (services/layout.py).
        keep_layout(ctx, report.counters, time_left=remaining)
    except Exception:  # the migration waits a cycle; nothing else depends on it
        logger.exception("table layout step failed")
        report.counters["layout_errors"] += 1


def _plan(
    ctx: Context,
    worker: Worker,
    observations: Mapping[str, Observation],
    unreadable: Mapping[str, BaseException],
    now: datetime,
) -> Work:
    """The worker's step, or the error that kept it from having one (backed off when acting)."""
    obs = None
    if worker.ec2_instance_id:
        region_error = unreadable.get(worker.region)
        if region_error is not None:
            # Without EC2's word nothing can be decided for this worker: it waits out a backoff.
            step = Step(Outcome.RETRY, "EC2 unreadable in its region")
            return Work(worker, step, None, error=region_error, region_unreadable=True)
        obs = observations[worker.ec2_instance_id]
    try:
        step = decide(
            worker,
            obs,
            now,
            provisioning_timeout=timedelta(seconds=ctx.settings.ec2_provisioning_timeout_seconds),
        )
    except Exception as error:  # a bad record affects only its own worker
        return Work(worker, Step(Outcome.RETRY, "planning failed"), obs, error=error)
    return Work(worker, step, obs)


# ---- reading EC2 and CloudWatch in batches --------------------------------------------------------


def _to_observation(instance: Ec2Instance | None, at: datetime) -> Observation:
    if instance is None:
        return Observation(state=None, observed_at=at)
    return Observation(
        state=instance.state,
        private_ip=instance.private_ip,
        public_ip=instance.public_ip,
        launch_time=instance.launch_time,
        observed_at=at,
    )


def _observe(
    ctx: Context, workers: list[Worker], report: CycleReport, *, shard: Shard
) -> tuple[dict[str, Observation], dict[str, BaseException]]:
    """instance id -> observation, and the regions EC2 could not be read in (with the error).

    A shard of several holds about its share of each region's instances, so it reads its own by id
    instead of listing the whole region's (cloud/fleet_reads.describe_instances)."""
    wanted: dict[str, set[str]] = defaultdict(set)
    for worker in workers:
        if worker.ec2_instance_id:
            wanted[worker.region].add(worker.ec2_instance_id)
    at = utcnow()
    managed = {region: len(ids) * shard.count for region, ids in wanted.items()} if shard.count > 1 else None
    reads = read_instances(ctx.ec2, wanted, managed=managed)
    for region, error in reads.failed.items():
        logger.error(
            "DescribeInstances failed", region=region, error=str(error), retryable=is_retryable(error)
        )
        report.counters["reconcile_errors"] += 1
    return {iid: _to_observation(found, at) for iid, found in reads.found.items()}, dict(reads.failed)


def _collect_metrics(
    ctx: Context, workers: list[Worker], now: datetime, report: CycleReport
) -> dict[str, dict[str, float]]:
    interval = ctx.settings.metrics_interval_seconds
    wanted: dict[str, set[str]] = defaultdict(set)
    for worker in workers:
        if (
            worker.status == WorkerStatus.RUNNING
            and worker.ec2_instance_id
            and metrics_due(worker.id, now, interval)
        ):
            wanted[worker.region].add(worker.ec2_instance_id)
    reads = read_metrics(ctx.cloudwatch, wanted, now=now, window=timedelta(seconds=max(interval, 300)))
    for region, error in reads.failed.items():
        # No reading only keeps idle tracking where it was; nothing else depends on it.
        logger.error("GetMetricData failed", region=region, error=str(error), retryable=is_retryable(error))
        report.counters["reconcile_errors"] += 1
    report.counters["metrics_collected_count"] += len(reads.found)
    return reads.found


# ---- acting on one worker, isolated ----------------------------------------------------------------


def isolated(ctx: Context, item: Work, now: datetime, step: Callable[[Counter[str]], Outcome]) -> Result:
    """Run a part of one worker's work (its step, or its share of a batch); whatever it raises stays with
    this worker (logged, counted, backed off)."""
    counters: Counter[str] = Counter()
    worker = item.worker
    if item.error is not None:
        return _worker_failed(ctx, item, item.error, now, counters), counters
    try:
        return step(counters), counters
    except Conflict as lost:
        # Someone else (an EC2 event, the API, a drain) changed the worker since it was read.
        counters["conflicts"] += 1
        logger.info("worker changed concurrently", worker_id=worker.id, now_status=lost.current_status)
        return Outcome.REQUEUE, counters
    except NotFound:
        return Outcome.SKIP, counters
    except Exception as error:  # isolation: one worker never stops the cycle
        return _worker_failed(ctx, item, error, now, counters), counters


def _dispatch(
    ctx: Context, item: Work, now: datetime, counters: Counter[str], images: NewestImages | None
) -> Outcome:
    worker, step = item.worker, item.step
    if step.call is Ec2Call.RETIRE_LAUNCHED:
        return provisioning.retire_launched(ctx, worker, step, counters)
    if item.scale_down is not None and item.admitted is not None:
        return scale_down(ctx, worker, item.scale_down, item.admitted, counters)
    if step.drain_then is not None:
        return start_desired_drain(ctx, worker, step, step.drain_then, counters)
    if step.outcome == Outcome.RETRY:
        back_off(ctx, worker, now, step.reason, counters)
        return Outcome.RETRY
    return apply_step(ctx, worker, step, counters)


def _worker_failed(
    ctx: Context, item: Work, error: BaseException, now: datetime, counters: Counter[str]
) -> Outcome:
    """Log, count and back off one worker's failure; a launch refused again and again fails the worker."""
    worker = item.worker
    retryable = is_retryable(error)
    from_region = item.region_unreadable
    counters["region_unavailable" if from_region else "worker_errors"] += 1
    if not from_region:
        counters["reconcile_errors"] += 1
    if not retryable:
        counters["final_errors"] += 1
    reason = f"{type(error).__name__}: {error}"
    logger.warning(
        "reconcile step failed",
        worker_id=worker.id,
        status=str(worker.status),
        retryable=retryable,
        error=reason[:500],
        exc_info=error if not from_region else None,
    )
    try:
        if isinstance(error, CapacityError):
            # No capacity or no quota: not the worker's fault, and no reason to give it up. It waits the
            # capacity backoff and launches when EC2 has room again (docs/lifecycle.md); its pool's
            # scale-out backs off too (docs/capacity.md).
            counters["capacity_errors"] += 1
            if launch_refused(ctx, worker, error.code, reason, now):
                counters["launches_refused_for_capacity"] += 1
            back_off(ctx, worker, now, reason, counters, capacity=True)
            return Outcome.RETRY
        if item.step.call is Ec2Call.LAUNCH and launch_refused(
            ctx, worker, retry.error_code(error), reason, now
        ):
            counters["launches_refused_for_capacity"] += 1
        if item.step.call is Ec2Call.LAUNCH and _is_aws_error(error) and not retryable:
            # EC2 refused the launch (a bad AMI or subnet, a denied call, no capacity): it is tried again
            # at the longest backoff, and given up after MAX_REFUSED_LAUNCHES refusals in a row. The
            # launch claim was written meanwhile, so the worker is read again.
            fresh = ctx.store.get_worker(worker.id)
            if fresh.status == WorkerStatus.PENDING and fresh.reconcile_attempts + 1 >= MAX_REFUSED_LAUNCHES:
                return fail(ctx, fresh, f"launch refused {MAX_REFUSED_LAUNCHES} times: {reason}", counters)
        back_off(ctx, worker, now, reason, counters, final=not retryable)
    except Exception:  # the backoff is lost, not the cycle; the worker is simply due again
        logger.exception("backoff not recorded", worker_id=worker.id)
        counters["backoff_errors"] += 1
    return Outcome.RETRY


# ---- counters out: stats item and EMF --------------------------------------------------------------


def _publish(ctx: Context, report: CycleReport, now: datetime) -> None:
    """Counters add up in the `reconcile` stats scope whichever shard counted them; the fleet-wide
    gauges come from the lead shard; each shard's own timings go to its own scope (`reconcile#2of4`)."""
    shard = report.shard
    running = report.counters.pop("running_worker_count", 0)
    fleet_gauges = {"running_worker_count": running} if report.lease_acquired and shard.leads else {}
    own_gauges: dict[str, int] = {}
    own_times: dict[str, datetime] = {}
    own_notes = report.notes if report.lease_acquired else {}
    if report.lease_acquired:
        own_gauges = {
            "last_cycle_workers": report.workers,
            "last_cycle_ms": int(report.duration_seconds * 1000),
        }
        own_times = {"last_run_at": now}
        if report.completed:
            own_times["last_completed_at"] = now
    if shard.count == 1:
        ctx.stats.record(
            STATS_SCOPE,
            counters=report.counters,
            gauges={**fleet_gauges, **own_gauges} or None,
            timestamps=own_times or None,
            notes=own_notes or None,
        )
    else:
        # The shared scope's times are the lead's, like its gauges; each shard's are in its own scope.
        ctx.stats.record(
            STATS_SCOPE,
            counters=report.counters,
            gauges=fleet_gauges or None,
            timestamps=own_times if fleet_gauges else None,
        )
        if report.lease_acquired:
            ctx.stats.record(
                reconcile_scope(shard), gauges=own_gauges, timestamps=own_times, notes=own_notes or None
            )
    # The fleet's running count is a gauge that happens to travel with the counters: one shard sends it.
    emit_counters("Reconcile", {**report.counters, **fleet_gauges})
    report.counters["running_worker_count"] = running
    if report.lease_acquired:
        metrics.add_metric(
            name=METRIC_DURATION_MS, unit=MetricUnit.Milliseconds, value=report.duration_seconds * 1000
        )
        metrics.add_metric(
            name=METRIC_ERRORS, unit=MetricUnit.Count, value=report.counters["reconcile_errors"]
        )
    if report.completed:
        if shard.leads:
            # Every shard has the whole fleet's counts; one of them reports them.
            for status in RECONCILE_STATUSES:
                metrics.add_metric(
                    name=workers_metric(status), unit=MetricUnit.Count, value=report.by_status[status]
                )
        # One per shard and cycle: the alarm wants as many per period as there are shards.
        metrics.add_metric(name=METRIC_HEARTBEAT, unit=MetricUnit.Count, value=1)
