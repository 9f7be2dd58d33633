"""The reconcile cycle: workers needing action, their EC2 states in batches, one step per worker.

Cost model (bench/results.md): one Query page per 1000-ish workers of each status, DescribeInstances by
tag at 1000 instances a call (or by id for small sets), GetMetricData at 500 queries a call for the
workers whose metrics are due, and DynamoDB writes only for workers that change.

Mutual exclusion: a cycle holds the `reconcile` lease (a conditional write on one item) for its whole
run; a second invocation that finds it held returns at once. On top of that every worker write is
conditional on version and status, and a launch is claimed on the worker item before RunInstances, so
even a cycle that outlived its lease cannot launch a second machine for the same worker.
"""

from __future__ import annotations

import math
import time
import uuid
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.cloud.ec2 import FILTER_VALUES_LIMIT, Ec2Gateway, Ec2Instance
from fleetkeeper.domain.errors import Conflict, NotFound
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Worker, WorkerMetrics, utcnow
from fleetkeeper.domain.reconcile import Ec2Call, Observation, Outcome, Step, decide, is_due, next_attempt_at
from fleetkeeper.domain.scale_down import (
    Action,
    DisruptionBudget,
    ScaleDownPolicy,
    Verdict,
    evaluate,
    next_idle_since,
    scope_of,
)
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE, POOL_TAG, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services import drain_hooks, drains
from fleetkeeper.services.context import Context
from fleetkeeper.services.worker_exit import release_stopped_worker, retire_worker
from fleetkeeper.settings import Settings

ACTOR = "reconciler"
SCALE_DOWN_ACTOR = "scale-down"
LEASE_NAME = "reconcile"
STATS_SCOPE = "reconcile"
SCALE_DOWN_SCOPE = "scale-down"

# Every status but TERMINATED: the growing history is never read by the reconciler.
RECONCILE_STATUSES = tuple(s for s in WorkerStatus if s != WorkerStatus.TERMINATED)
# A launch claim older than this is from a reconciler that died mid-launch.
LAUNCH_CLAIM_TTL = timedelta(minutes=5)
# Stop starting new work when less than this is left of the invocation.
SAFETY_MARGIN_SECONDS = 10.0
# EC2 and DynamoDB calls of one cycle run on this many threads (boto3 clients are thread-safe).
PARALLELISM = 16
# The reconcile schedule's nominal rate, used to spread metric reads over METRICS_INTERVAL_SECONDS.
NOMINAL_CYCLE_SECONDS = 60

_TRANSIENT = (ClientError, BotoCoreError)

# Metric names the stack's dashboard and alarms read (infra/metrics.py holds the same list).
METRIC_DURATION_MS = "ReconcileDurationMs"
METRIC_ERRORS = "ReconcileErrors"
METRIC_HEARTBEAT = "ReconcileHeartbeat"


def workers_metric(status: WorkerStatus) -> str:
    """The gauge of workers in one status, e.g. WorkersRunning."""
    return "Workers" + status.value.capitalize()


@dataclass
class CycleReport:
    """What one cycle did; counters carry the names served by GET /api/v1/stats."""

    lease_acquired: bool = True
    completed: bool = False
    workers: int = 0
    by_status: Counter[WorkerStatus] = field(default_factory=Counter)
    counters: Counter[str] = field(default_factory=Counter)
    duration_seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "lease_acquired": self.lease_acquired,
            "workers": self.workers,
            "duration_seconds": round(self.duration_seconds, 3),
            "counters": dict(sorted(self.counters.items())),
        }


@dataclass
class _Work:
    worker: Worker
    step: Step
    obs: Observation | None
    scale_down: Verdict | None = None


def scale_down_policy(settings: Settings) -> ScaleDownPolicy:
    return ScaleDownPolicy(
        enabled=settings.scale_down_enabled,
        min_workers=settings.min_workers,
        cooldown=timedelta(seconds=settings.scale_down_cooldown_seconds),
        idle_window=timedelta(seconds=settings.idle_window_seconds),
        cpu_threshold=settings.idle_cpu_threshold,
        lookahead=timedelta(seconds=settings.scale_down_lookahead_seconds),
        budget=DisruptionBudget.parse(settings.max_concurrent_drains),
    )


def reconcile_fleet(
    ctx: Context,
    *,
    time_left: Callable[[], float] | None = None,
    owner: str | None = None,
    now: datetime | None = None,
) -> CycleReport:
    """Run one reconcile cycle over every worker needing action, unless another cycle is running."""
    started = time.monotonic()
    now = now or utcnow()
    remaining = time_left or (lambda: 900.0)
    owner = owner or uuid.uuid4().hex
    report = CycleReport()
    stats = ctx.stats
    # The lease runs on the wall clock, whatever `now` the cycle decides with.
    wall = utcnow()
    lease_until = wall + timedelta(seconds=max(remaining(), 1.0) + SAFETY_MARGIN_SECONDS)
    if not stats.acquire_lease(LEASE_NAME, owner, now=wall, until=lease_until):
        report.lease_acquired = False
        report.counters["lease_busy"] += 1
        logger.info("another reconcile cycle holds the lease; skipping this one")
        _publish(ctx, report, now)
        return report
    try:
        _run_cycle(ctx, report, now, remaining)
        _sweep_drains(ctx, report)
    finally:
        stats.release_lease(LEASE_NAME, owner, now=utcnow())
        report.duration_seconds = time.monotonic() - started
        _publish(ctx, report, now)
    return report


def _sweep_drains(ctx: Context, report: CycleReport) -> None:
    """Keep waiting drains alive and complete those whose last signal was lost (see services/drains)."""
    try:
        swept = drains.sweep_waiting_drains(ctx)
    except Exception:
        # A sweep that fails this cycle runs again next cycle; the drains' own heartbeat re-check remains.
        logger.exception("sweep of waiting drains failed")
        report.counters["drain_sweep_errors"] += 1
        return
    report.counters["drain_signals_recovered"] += swept["completed"]
    report.counters["drain_heartbeats"] += swept["heartbeats"]


def _run_cycle(ctx: Context, report: CycleReport, now: datetime, remaining: Callable[[], float]) -> None:
    workers = list(ctx.store.iter_workers_by_status(RECONCILE_STATUSES))
    report.workers = len(workers)
    report.by_status = Counter(w.status for w in workers)
    due = [w for w in workers if is_due(w, now)]
    report.counters["outcome_skip"] += len(workers) - len(due)
    report.counters["backoff_waiting"] += len(workers) - len(due)

    observations = _observe(ctx, due, now, report)
    readings = _collect_metrics(ctx, due, now, report)
    work: list[_Work] = []
    for worker in due:
        obs = None
        if worker.ec2_instance_id:
            obs = observations.get(worker.ec2_instance_id)
            if obs is None:
                # EC2 could not be read for its region: nothing can be decided without its word.
                report.counters["outcome_skip"] += 1
                continue
        step = decide(
            worker,
            obs,
            now,
            provisioning_timeout=timedelta(seconds=ctx.settings.ec2_provisioning_timeout_seconds),
        )
        work.append(_Work(worker, step, obs))

    _plan_steady_running(ctx, work, readings, now, report)

    def needs_io(item: _Work) -> bool:
        return (
            item.step.target is not None
            or item.step.call is not None
            or item.step.drain_then is not None
            or item.step.outcome == Outcome.RETRY
            or item.scale_down is not None
            or "idle_since" in item.step.changes
            or (item.worker.reconcile_attempts > 0 and item.step.outcome != Outcome.SKIP)
        )

    for item in work:
        if not needs_io(item):
            report.counters[f"outcome_{item.step.outcome.lower()}"] += 1
    busy = [item for item in work if needs_io(item)]

    def act_in_time(item: _Work) -> tuple[Outcome, Counter[str]]:
        if remaining() < SAFETY_MARGIN_SECONDS:
            # Out of time: what is left waits for the next cycle rather than being cut off mid-step.
            return Outcome.REQUEUE, Counter(deferred=1)
        return _act(ctx, item, now)

    with ThreadPoolExecutor(max_workers=PARALLELISM) as pool:
        for outcome, counters in pool.map(act_in_time, busy):
            report.counters[f"outcome_{outcome.lower()}"] += 1
            report.counters.update(counters)

    report.counters["running_worker_count"] = report.by_status[WorkerStatus.RUNNING]
    report.completed = True


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


def describe_instances(gateway: Ec2Gateway, instance_ids: set[str]) -> dict[str, Ec2Instance]:
    """The instances among these ids, in the fewest DescribeInstances calls.

    Up to 200 ids fit one call with an instance-id filter. Beyond that, listing every managed instance
    by tag (1000 a page) is cheaper; the few ids it misses (an instance that lost its tag, or one that
    is gone) are then asked for by id.
    """
    if len(instance_ids) <= FILTER_VALUES_LIMIT:
        return gateway.describe(instance_ids)
    found = {i.instance_id: i for i in gateway.describe_managed() if i.instance_id in instance_ids}
    missing = instance_ids - found.keys()
    if missing:
        found.update(gateway.describe(missing))
    return found


def _observe(
    ctx: Context, workers: list[Worker], now: datetime, report: CycleReport
) -> dict[str, Observation]:
    by_region: dict[str, set[str]] = defaultdict(set)
    for worker in workers:
        if worker.ec2_instance_id:
            by_region[worker.region].add(worker.ec2_instance_id)
    observations: dict[str, Observation] = {}
    for region, ids in sorted(by_region.items()):
        at = utcnow()
        try:
            found = describe_instances(ctx.ec2(region), ids)
        except _TRANSIENT:
            # Without EC2's word nothing can be decided for this region: its workers wait a cycle.
            logger.exception("DescribeInstances failed", region=region)
            report.counters["reconcile_errors"] += 1
            continue
        for instance_id in ids:
            observations[instance_id] = _to_observation(found.get(instance_id), at)
    return observations


def metrics_due(worker_id: str, now: datetime, interval_seconds: int) -> bool:
    """Whether this cycle reads the worker's metrics: each worker once per interval, spread evenly."""
    if interval_seconds <= 0:
        return False
    buckets = max(1, math.ceil(interval_seconds / NOMINAL_CYCLE_SECONDS))
    slot = int(now.timestamp() // NOMINAL_CYCLE_SECONDS) % buckets
    return zlib.crc32(worker_id.encode()) % buckets == slot


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
    readings: dict[str, dict[str, float]] = {}
    for region, ids in sorted(wanted.items()):
        try:
            readings.update(
                ctx.cloudwatch(region).latest(ids, now=now, window=timedelta(seconds=max(interval, 300)))
            )
        except _TRANSIENT:
            logger.exception("GetMetricData failed", region=region)
            report.counters["reconcile_errors"] += 1
    report.counters["metrics_collected_count"] += len(readings)
    return readings


# ---- steady RUNNING workers: idle detection and scale-down -----------------------------------------


def _plan_steady_running(
    ctx: Context,
    work: list[_Work],
    readings: Mapping[str, Mapping[str, float]],
    now: datetime,
    report: CycleReport,
) -> None:
    """Idle tracking for every steady RUNNING worker, then scale-down decisions, one at a time.

    Decisions are taken in one thread so the minimum per scope and the disruption budget account for
    the scale-downs already chosen in this cycle.
    """
    policy = scale_down_policy(ctx.settings)
    steady = [
        item
        for item in work
        if item.worker.status == WorkerStatus.RUNNING
        and item.step.target is None
        and item.step.call is None
        and item.step.drain_then is None
    ]
    running_in_scope: Counter[str] = Counter(
        scope_of(item.worker) for item in work if item.worker.status == WorkerStatus.RUNNING
    )
    draining = sum(1 for item in work if item.worker.status == WorkerStatus.DRAINING)
    fleet = sum(1 for item in work if item.worker.status in (WorkerStatus.RUNNING, WorkerStatus.DRAINING))
    last_by_scope: dict[str, datetime] = {}
    if policy.enabled:
        for name, stamp in ctx.stats.read(SCALE_DOWN_SCOPE).timestamps.items():
            last_by_scope[name] = datetime.fromisoformat(stamp)

    for item in steady:
        worker = item.worker
        reading = readings.get(worker.ec2_instance_id or "")
        if reading is not None:
            report.counters["idle_detection_count"] += 1
            idle_since = next_idle_since(worker.idle_since, reading.get("cpu"), policy.cpu_threshold, now)
            if idle_since != worker.idle_since:
                # The snapshot rides along on the only writes idle tracking makes: when the verdict flips.
                snapshot = WorkerMetrics(
                    cpu_utilization=reading.get("cpu"),
                    memory_utilization=reading.get("memory"),
                    disk_utilization=reading.get("disk"),
                    collected_at=now,
                )
                item.step = Step(
                    item.step.outcome,
                    item.step.reason,
                    changes={"idle_since": idle_since, "metrics": snapshot},
                )
                worker = worker.model_copy(update={"idle_since": idle_since})
        scope = scope_of(worker)
        verdict = evaluate(
            worker,
            now=now,
            policy=policy,
            running_in_scope=running_in_scope[scope],
            last_scale_down_at=last_by_scope.get(scope),
            draining_now=draining,
            fleet_size=fleet,
            timeslot_starts=partial(_timeslot_starts, ctx, worker),
        )
        if verdict.refused_by is not None:
            report.counters[f"scale_down_refused_{verdict.refused_by}"] += 1
            logger.debug("scale-down refused", worker_id=worker.id, guard=str(verdict.refused_by))
        if verdict.action is Action.NONE:
            continue
        logger.info(
            "scale-down chosen", worker_id=worker.id, action=str(verdict.action), reason=verdict.reason
        )
        item.scale_down = verdict
        running_in_scope[scope] -= 1
        last_by_scope[scope] = now
        if verdict.action is Action.DRAIN:
            draining += 1
    if policy.enabled:
        touched = {scope: at for scope, at in last_by_scope.items() if at == now}
        if touched:
            ctx.stats.record(SCALE_DOWN_SCOPE, timestamps=touched)


def _timeslot_starts(ctx: Context, worker: Worker) -> list[datetime]:
    return [i.timeslot_start for i in ctx.store.active_instances_of(worker.id) if i.timeslot_start]


# ---- acting on one worker --------------------------------------------------------------------------


def _act(ctx: Context, item: _Work, now: datetime) -> tuple[Outcome, Counter[str]]:
    counters: Counter[str] = Counter()
    worker, step = item.worker, item.step
    try:
        if step.call is Ec2Call.LAUNCH:
            return _launch(ctx, worker, now, counters), counters
        if item.scale_down is not None:
            return _scale_down(ctx, worker, item.scale_down, step, counters), counters
        if step.drain_then is not None:
            started = drain_hooks.start_drain(
                ctx, worker.id, actor=ACTOR, reason=step.reason, then=step.drain_then
            )
            counters["desired_status_drains" if started else "desired_status_drain_refused"] += 1
            return step.outcome, counters
        if step.outcome == Outcome.RETRY:
            _back_off(ctx, worker, now, step.reason, counters)
            return Outcome.RETRY, counters
        current = _apply_transition(ctx, worker, step, counters)
        if step.call is not None and current.ec2_instance_id:
            _call_ec2(ctx, current, step.call)
        return step.outcome, counters
    except Conflict as lost:
        # Someone else (an EC2 event, the API, a drain) changed the worker since it was read.
        counters["conflicts"] += 1
        logger.info("worker changed concurrently", worker_id=worker.id, now_status=lost.current_status)
        return Outcome.REQUEUE, counters
    except NotFound:
        return Outcome.SKIP, counters
    except _TRANSIENT as error:
        counters["reconcile_errors"] += 1
        logger.warning("reconcile step failed", worker_id=worker.id, error=str(error))
        _back_off(ctx, worker, now, str(error), counters)
        return Outcome.RETRY, counters


def _reset_backoff(worker: Worker) -> dict[str, Any]:
    if worker.reconcile_attempts == 0 and worker.next_reconcile_at is None:
        return {}
    return {"reconcile_attempts": 0, "next_reconcile_at": None, "last_reconcile_error": None}


def _apply_transition(ctx: Context, worker: Worker, step: Step, counters: Counter[str]) -> Worker:
    changes: dict[str, Any] = dict(step.changes)
    if step.outcome != Outcome.RETRY:
        changes.update(_reset_backoff(worker))
    if step.target is None:
        if not changes:
            return worker
        return ctx.store.update_worker(worker, changes, actor=ACTOR, action="Reconciled", reason=step.reason)
    changes["status_reason"] = step.reason
    if step.target == WorkerStatus.TERMINATED:
        updated = retire_worker(
            ctx, worker, cause=step.cause, actor=ACTOR, reason=step.reason, changes=changes
        )
    else:
        updated = ctx.store.transition_worker(
            worker, step.target, cause=step.cause, actor=ACTOR, reason=step.reason, changes=changes
        )
        if step.cause == Cause.EC2:
            release_stopped_worker(ctx, updated, actor=ACTOR)
    if step.drift:
        counters["drift_corrections"] += 1
    if step.counter:
        counters[step.counter] += 1
    logger.info(
        "worker moved",
        worker_id=worker.id,
        from_status=str(worker.status),
        to_status=str(step.target),
        reason=step.reason,
    )
    return updated


def _call_ec2(ctx: Context, worker: Worker, call: Ec2Call) -> None:
    gateway = ctx.ec2(worker.region)
    instance_id = worker.ec2_instance_id or ""
    if call is Ec2Call.STOP:
        gateway.stop(instance_id)
    elif call is Ec2Call.START:
        gateway.start(instance_id)
    elif call is Ec2Call.TERMINATE:
        gateway.terminate(instance_id)


def _back_off(ctx: Context, worker: Worker, now: datetime, error: str, counters: Counter[str]) -> None:
    """Persist the RETRY backoff on the worker so the next invocation honours it."""
    try:
        fresh = ctx.store.get_worker(worker.id)
        if fresh.version != worker.version and fresh.status != worker.status:
            return  # it moved on meanwhile; the backoff belongs to a state that is gone
        ctx.store.update_worker(
            fresh,
            {
                "reconcile_attempts": fresh.reconcile_attempts + 1,
                "next_reconcile_at": next_attempt_at(now, fresh.reconcile_attempts),
                "last_reconcile_error": error[:500],
                "launch_claimed_at": None,
            },
            actor=ACTOR,
            action="ReconcileRetry",
            reason=error[:500],
        )
        counters["retries_scheduled"] += 1
    except (Conflict, NotFound):
        counters["conflicts"] += 1


def _fail(ctx: Context, worker: Worker, reason: str, counters: Counter[str]) -> Outcome:
    ctx.store.transition_worker(
        worker,
        WorkerStatus.FAILED,
        cause=Cause.CONTROL,
        actor=ACTOR,
        reason=reason,
        changes={"status_reason": reason, "launch_claimed_at": None},
    )
    counters["provision_failures"] += 1
    logger.warning("worker failed", worker_id=worker.id, reason=reason)
    return Outcome.REQUEUE


def launch_tags(ctx: Context, worker: Worker, template_tags: Mapping[str, str]) -> dict[str, str]:
    """Region defaults, then template tags, then fleetkeeper's own tags, which always win."""
    region = ctx.settings.region_configs.get(worker.region)
    tags = {**(region.default_tags if region else {}), **template_tags}
    tags.update(
        {
            "Name": f"fleetkeeper-{worker.id}",
            MANAGED_BY_TAG: MANAGED_BY_VALUE,
            WORKER_ID_TAG: worker.id,
            TEMPLATE_TAG: worker.template,
        }
    )
    if worker.pool:
        tags[POOL_TAG] = worker.pool
    return tags


def _launch(ctx: Context, worker: Worker, now: datetime, counters: Counter[str]) -> Outcome:
    """Seed 003 section 3: template, region config, newest AMI, RunInstances, PROVISIONING."""
    template = ctx.store.find_template(worker.template)
    if template is None:
        return _fail(ctx, worker, f"template '{worker.template}' not found", counters)
    configs = ctx.settings.region_configs
    region = configs.get(worker.region)
    if configs and region is None:
        return _fail(ctx, worker, f"no region config for {worker.region}", counters)
    gateway = ctx.ec2(worker.region)

    if worker.launch_claimed_at is not None and now - worker.launch_claimed_at < LAUNCH_CLAIM_TTL:
        return Outcome.SKIP  # another reconciler is launching it right now
    if worker.launch_claimed_at is not None or worker.reconcile_attempts > 0:
        # A reconciler died mid-launch, or an earlier attempt failed after RunInstances may have gone
        # through: adopt the machine it may have started instead of launching a second one.
        adopted = next(
            iter(gateway.describe_managed([{"Name": f"tag:{WORKER_ID_TAG}", "Values": [worker.id]}])), None
        )
        if adopted is not None and adopted.state not in ("terminated", "shutting-down"):
            return _provisioned(ctx, worker, adopted, now, counters, adopted=True)

    image_id = gateway.newest_image(template.ami_name_filter, owners=ctx.settings.ami_owners)
    if image_id is None:
        return _fail(ctx, worker, f"no AMI matches '{template.ami_name_filter}'", counters)

    # The claim: of two reconcilers that read the same PENDING worker, only one wins this write.
    claimed = ctx.store.update_worker(
        worker, {"launch_claimed_at": now}, actor=ACTOR, action="LaunchClaimed", reason=image_id
    )
    instance = gateway.run_instance(
        image_id=image_id,
        instance_type=template.instance_type,
        tags=launch_tags(ctx, worker, template.tags),
        # Same worker and image -> same token: a retried RunInstances returns the first machine.
        client_token=f"fk-{worker.id}-{image_id}"[:64],
        subnet_id=region.subnet_id if region else None,
        security_group_ids=region.security_group_ids if region else (),
        key_name=region.key_name if region else None,
    )
    return _provisioned(ctx, claimed, instance, now, counters, image_id=image_id)


def _provisioned(
    ctx: Context,
    worker: Worker,
    instance: Ec2Instance,
    now: datetime,
    counters: Counter[str],
    *,
    image_id: str | None = None,
    adopted: bool = False,
) -> Outcome:
    ctx.store.transition_worker(
        worker,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor=ACTOR,
        reason="adopted an instance launched earlier" if adopted else "EC2 instance launched",
        action="WorkerProvisioned",
        changes={
            "ec2_instance_id": instance.instance_id,
            "ec2_state": instance.state,
            "ec2_observed_at": now,
            "launch_claimed_at": None,
            **_reset_backoff(worker),
        },
    )
    counters["provisioned_count"] += 1
    _scaling_audit(
        ctx,
        "Worker Provisioned",
        {
            "worker_id": worker.id,
            "template": worker.template,
            "region": worker.region,
            "pool": worker.pool,
            "ec2_instance_id": instance.instance_id,
            "image_id": image_id or instance.image_id,
            "instance_type": instance.instance_type,
            "adopted": adopted,
        },
    )
    return Outcome.SUCCESS


def _scaling_audit(ctx: Context, detail_type: str, detail: Mapping[str, Any]) -> None:
    """A scaling audit record on the audit bus; the worker's own audit item is already in the table."""
    try:
        ctx.audit.publish(detail_type, detail)
    except (*_TRANSIENT, RuntimeError):
        logger.exception("audit event not published", detail_type=detail_type)


def _scale_down(
    ctx: Context, worker: Worker, verdict: Verdict, step: Step, counters: Counter[str]
) -> Outcome:
    current = worker
    if step.changes:
        current = ctx.store.update_worker(worker, step.changes, actor=ACTOR, action="IdleTracked")
    if verdict.action is Action.STOP:
        # Conditional on the version just read: an instance placed meanwhile bumps it and wins.
        stopped = ctx.store.transition_worker(
            current,
            WorkerStatus.STOPPING,
            cause=Cause.CONTROL,
            actor=SCALE_DOWN_ACTOR,
            reason=f"scale-down: {verdict.reason}",
        )
        _call_ec2(ctx, stopped, Ec2Call.STOP)
        counters["scale_down_stop_count"] += 1
    else:
        if not drain_hooks.start_drain(
            ctx,
            worker.id,
            actor=SCALE_DOWN_ACTOR,
            reason=f"scale-down: {verdict.reason}",
            then=DrainThen.STOP,
        ):
            counters["scale_down_drain_unavailable"] += 1
            return Outcome.REQUEUE
        counters["scale_down_drain_count"] += 1
    _scaling_audit(
        ctx,
        "Worker Scaled Down",
        {"worker_id": worker.id, "action": str(verdict.action), "reason": verdict.reason},
    )
    return Outcome.SUCCESS


# ---- counters out: stats item and EMF --------------------------------------------------------------


def _publish(ctx: Context, report: CycleReport, now: datetime) -> None:
    gauges = {"running_worker_count": report.counters.pop("running_worker_count", 0)}
    if report.lease_acquired:
        gauges["last_cycle_workers"] = report.workers
        gauges["last_cycle_ms"] = int(report.duration_seconds * 1000)
    ctx.stats.record(
        STATS_SCOPE,
        counters=report.counters,
        gauges=gauges if report.lease_acquired else None,
        timestamps={"last_run_at": now} if report.lease_acquired else None,
    )
    report.counters["running_worker_count"] = gauges["running_worker_count"]
    emit_counters("Reconcile", report.counters)
    if report.lease_acquired:
        metrics.add_metric(
            name=METRIC_DURATION_MS, unit=MetricUnit.Milliseconds, value=report.duration_seconds * 1000
        )
        metrics.add_metric(
            name=METRIC_ERRORS, unit=MetricUnit.Count, value=report.counters["reconcile_errors"]
        )
    if report.completed:
        for status in RECONCILE_STATUSES:
            metrics.add_metric(
                name=workers_metric(status), unit=MetricUnit.Count, value=report.by_status[status]
            )
        metrics.add_metric(name=METRIC_HEARTBEAT, unit=MetricUnit.Count, value=1)


def emit_counters(prefix: str, counters: Mapping[str, int]) -> None:
    """Each non-zero counter as an EMF metric named <prefix>.<counter>."""
    for name, value in counters.items():
        if value:
            metrics.add_metric(name=f"{prefix}.{name}", unit=MetricUnit.Count, value=value)
