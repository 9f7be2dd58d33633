"""Worker and pool drains: what operators ask for, and the steps the drain workflow runs.

A drain is one Step Functions execution (infra/statemachines/drain.asl.json). The worker (or pool) item
is the source of truth; the workflow only sequences the steps and owns the deadline:

    begin → await-empty (callback token, timeout = time left) → [force on timeout] → finish

Whoever ends the last active instance sends the stored token at once. A cancel fails it with
DrainCancelled. Every step re-reads the item and is safe to run twice, because Step Functions retries.
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any, Literal

from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, model_validator

from fleetkeeper.cloud.ec2 import is_missing_instance
from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.drain_policy import (
    deadline_passed,
    drain_deadline,
    estimated_completion,
    pool_drain_timeout,
    seconds_left,
    worker_drain_timeout,
)
from fleetkeeper.domain.errors import (
    Conflict,
    DrainCancelled,
    DrainInProgress,
    DrainNotStartable,
    IllegalTransition,
    StaleWrite,
    WorkflowUnavailable,
)
from fleetkeeper.domain.lifecycle import Cause, InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import (
    DrainOutcome,
    DrainRecord,
    DrainThen,
    Instance,
    Pool,
    PoolDrainThen,
    Worker,
    utcnow,
)
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services.context import Context

WORKFLOW_ACTOR = "drain-workflow"
_EXECUTION_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# Step Functions execution names are at most 80 characters.
_EXECUTION_NAME_LIMIT = 80
# A callback task's timeout must exceed its heartbeat, and both must be at least a second.
_MINIMUM_WAIT_SECONDS = 2


class DrainStatus(BaseModel):
    """What a worker's latest drain is doing (seed 002's status endpoint)."""

    model_config = ConfigDict(extra="forbid")

    worker_id: str
    status: Literal["NOT_RUN", "RUNNING", "SUCCESS", "ERROR", "CANCELLED", "TIMED_OUT"]
    worker_status: WorkerStatus
    generation: int | None = None
    started_at: datetime | None = None
    deadline: datetime | None = None
    timeout_seconds: int | None = None
    reason: str | None = None
    requested_by: str | None = None
    then: DrainThen | None = None
    active_instances: int
    forced_instances: int = 0
    estimated_completion: datetime | None = None
    execution_arn: str | None = None
    finished_at: datetime | None = None
    cancelled_by: str | None = None
    error: str | None = None
    dry_run: bool = False
    may_start: bool | None = None
    refusal: str | None = None


class DrainInput(BaseModel):
    """The input of one drain execution, as the workflow passes it to every step."""

    model_config = ConfigDict(extra="ignore")

    kind: Literal["worker", "pool"]
    worker_id: str | None = None
    pool: str | None = None
    generation: int
    timeout_seconds: int
    started_at: datetime
    deadline: datetime
    reason: str | None = None
    requested_by: str
    then: str
    heartbeat_seconds: int

    @model_validator(mode="after")
    def _names_its_target(self) -> DrainInput:
        if (self.kind == "worker" and not self.worker_id) or (self.kind == "pool" and not self.pool):
            raise ValueError(
                f"a {self.kind} drain needs its {'worker_id' if self.kind == 'worker' else 'pool'}"
            )
        return self

    def record(self, **overrides: Any) -> DrainRecord:
        """The drain record this execution stands for, as the request wrote it."""
        fields: dict[str, Any] = {
            "generation": self.generation,
            "started_at": self.started_at,
            "deadline": self.deadline,
            "timeout_seconds": self.timeout_seconds,
            "reason": self.reason,
            "requested_by": self.requested_by,
            "then": DrainThen(self.then),
        }
        return DrainRecord(**{**fields, **overrides})

    @property
    def target(self) -> str:
        """The worker id or pool name this drain serves."""
        return self.worker_id or self.pool or ""


def execution_name(kind: str, key: str, generation: int) -> str:
    """Deterministic per (worker or pool, generation): a repeated request can never start two drains."""
    name = f"{kind}-{_EXECUTION_NAME_UNSAFE.sub('_', key)}-g{generation}"
    if len(name) <= _EXECUTION_NAME_LIMIT:
        return name
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{kind}-{digest}-g{generation}"


def wait_plan(ctx: Context, deadline: datetime, now: datetime | None = None) -> dict[str, Any]:
    """Timeout and heartbeat for the await-empty callback task."""
    now = now or utcnow()
    left = max(seconds_left(deadline, now), _MINIMUM_WAIT_SECONDS)
    heartbeat = max(1, min(ctx.settings.drain_heartbeat_seconds, left - 1))
    return {"seconds_left": left, "heartbeat_seconds": heartbeat, "expired": deadline_passed(deadline, now)}


def _emit(ctx: Context, detail_type: str, detail: dict[str, Any], metric: str | None = None) -> None:
    ctx.audit.publish(detail_type, detail)
    if metric:
        metrics.add_metric(name=metric, unit="Count", value=1)


def _worker_detail(worker: Worker, **extra: Any) -> dict[str, Any]:
    record = worker.drain
    detail: dict[str, Any] = {"worker_id": worker.id, "status": str(worker.status), "pool": worker.pool}
    if record:
        detail.update(
            generation=record.generation,
            reason=record.reason,
            requested_by=record.requested_by,
            then=str(record.then),
            deadline=record.deadline.isoformat(),
            outcome=str(record.outcome),
        )
    detail.update(extra)
    return detail


# ---- operator requests: worker drains --------------------------------------------------------------


def _refusal(worker: Worker) -> Conflict | None:
    if worker.status == WorkerStatus.DRAINING and (
        worker.drain is None or worker.drain.outcome == DrainOutcome.RUNNING
    ):
        return DrainInProgress("worker", worker.id)
    # A DRAINING worker whose drain ended in ERROR may be drained again: that is its way out.
    if worker.status not in (WorkerStatus.RUNNING, WorkerStatus.DRAINING):
        return Conflict(
            "worker",
            worker.id,
            worker.status,
            f"worker {worker.id} is {worker.status}; only a RUNNING worker can be drained",
        )
    return None


def status_of(ctx: Context, worker: Worker, now: datetime | None = None) -> DrainStatus:
    """The drain status view of a worker as read."""
    now = now or utcnow()
    record = worker.drain
    if record is None:
        return DrainStatus(
            worker_id=worker.id,
            status="NOT_RUN",
            worker_status=worker.status,
            active_instances=worker.active_instances,
        )
    estimate = None
    if record.outcome == DrainOutcome.RUNNING:
        estimate = estimated_completion(ctx.store.active_instances_of(worker.id), record.deadline, now)
    return DrainStatus(
        worker_id=worker.id,
        status=record.outcome.value,
        worker_status=worker.status,
        generation=record.generation,
        started_at=record.started_at,
        deadline=record.deadline,
        timeout_seconds=record.timeout_seconds,
        reason=record.reason,
        requested_by=record.requested_by,
        then=record.then,
        active_instances=worker.active_instances,
        forced_instances=record.forced_instances,
        estimated_completion=estimate,
        execution_arn=record.execution_arn,
        finished_at=record.finished_at,
        cancelled_by=record.cancelled_by,
        error=record.error,
    )


def worker_drain_status(ctx: Context, worker_id: str) -> DrainStatus:
    return status_of(ctx, ctx.store.get_worker(worker_id))


def plan_worker_drain(
    ctx: Context,
    worker_id: str,
    *,
    timeout_seconds: int | None = None,
    then: DrainThen = DrainThen.STOP,
    reason: str | None = None,
    actor: str,
) -> DrainStatus:
    """What a drain would do now, without doing it (dry run)."""
    now = utcnow()
    worker = ctx.store.get_worker(worker_id)
    timeout = worker_drain_timeout(timeout_seconds, ctx.store.find_template(worker.template))
    deadline = drain_deadline(now, timeout)
    refusal = _refusal(worker)
    return DrainStatus(
        worker_id=worker.id,
        status="NOT_RUN",
        worker_status=worker.status,
        started_at=now,
        deadline=deadline,
        timeout_seconds=timeout,
        reason=reason,
        requested_by=actor,
        then=then,
        active_instances=worker.active_instances,
        estimated_completion=estimated_completion(ctx.store.active_instances_of(worker.id), deadline, now),
        dry_run=True,
        may_start=refusal is None,
        refusal=refusal.message if refusal else None,
    )


def start_worker_drain(
    ctx: Context,
    worker_id: str,
    *,
    actor: str,
    reason: str | None = None,
    timeout_seconds: int | None = None,
    then: DrainThen = DrainThen.STOP,
) -> DrainStatus:
    """Take the worker out of placement now (RUNNING → DRAINING) and start its drain workflow.

    The status change happens here, before the request returns, so no instance can land on the worker
    once the caller has its 202. The workflow's begin step accepts a worker that is already DRAINING
    for the same generation.
    """
    now = utcnow()

    def mark_draining() -> Worker:
        worker = ctx.store.get_worker(worker_id)
        refusal = _refusal(worker)
        if refusal is not None:
            raise refusal
        timeout = worker_drain_timeout(timeout_seconds, ctx.store.find_template(worker.template))
        generation = worker.next_drain_generation
        record = DrainRecord(
            generation=generation,
            started_at=now,
            deadline=drain_deadline(now, timeout),
            timeout_seconds=timeout,
            reason=reason,
            requested_by=actor,
            then=then,
            execution_arn=ctx.workflows.execution_arn(execution_name("drain", worker.id, generation)),
        )
        if worker.status == WorkerStatus.RUNNING:
            return ctx.store.transition_worker(
                worker,
                WorkerStatus.DRAINING,
                cause=Cause.CONTROL,
                actor=actor,
                reason=reason,
                action="WorkerDrainStarted",
                changes={"drain": record},
            )
        return ctx.store.update_worker(
            worker, {"drain": record}, actor=actor, action="WorkerDrainRestarted", reason=reason
        )

    worker = retry_conflicts(mark_draining)
    record = _drain_of(worker)
    drain_input = DrainInput(
        kind="worker",
        worker_id=worker.id,
        generation=record.generation,
        timeout_seconds=record.timeout_seconds,
        started_at=record.started_at,
        deadline=record.deadline,
        reason=reason,
        requested_by=actor,
        then=record.then.value,
        heartbeat_seconds=ctx.settings.drain_heartbeat_seconds,
    )
    try:
        ctx.workflows.start(
            execution_name("drain", worker.id, record.generation), drain_input.model_dump(mode="json")
        )
    except Exception as exc:
        _undo_unstarted_drain(ctx, worker.id, record.generation, exc)
        raise WorkflowUnavailable(
            f"the drain workflow could not start ({exc}); worker {worker.id} is back to its previous state"
        ) from exc
    _emit(
        ctx,
        "WorkerDrainStarted",
        _worker_detail(worker, timeout_seconds=record.timeout_seconds),
        "DrainStarted",
    )
    logger.info("drain started", extra={"worker_id": worker.id, "generation": record.generation})
    return status_of(ctx, worker, now)


def _undo_unstarted_drain(ctx: Context, worker_id: str, generation: int, cause: Exception) -> None:
    """Put back a worker whose drain workflow never started, so it is not left draining for nothing."""

    def undo() -> None:
        worker = ctx.store.get_worker(worker_id)
        record = worker.drain
        if record is None or record.generation != generation or worker.status != WorkerStatus.DRAINING:
            return
        failed = record.model_copy(
            update={
                "outcome": DrainOutcome.ERROR,
                "finished_at": utcnow(),
                "error": f"workflow did not start: {cause}",
            }
        )
        ctx.store.transition_worker(
            worker,
            WorkerStatus.RUNNING,
            cause=Cause.CONTROL,
            actor=WORKFLOW_ACTOR,
            reason="drain workflow did not start",
            action="WorkerDrainFailed",
            changes={"drain": failed},
        )

    retry_conflicts(undo)
    metrics.add_metric(name="DrainFailed", unit="Count", value=1)


def cancel_worker_drain(ctx: Context, worker_id: str, *, actor: str) -> Worker:
    """Admin cancel: DRAINING → RUNNING, and the waiting workflow fails with DrainCancelled."""
    now = utcnow()

    def cancel() -> tuple[Worker, Worker]:
        worker = ctx.store.get_worker(worker_id)
        if worker.status != WorkerStatus.DRAINING:
            raise Conflict(
                "worker",
                worker.id,
                worker.status,
                f"worker {worker.id} is {worker.status}; only a DRAINING worker has a drain to cancel",
            )
        record = worker.drain
        cancelled = None
        if record is not None:
            final = record.outcome if record.outcome != DrainOutcome.RUNNING else DrainOutcome.CANCELLED
            cancelled = record.model_copy(
                update={
                    "outcome": final,
                    "cancelled_by": actor,
                    "finished_at": record.finished_at or now,
                    "task_token": None,
                }
            )
        after = ctx.store.transition_worker(
            worker,
            WorkerStatus.RUNNING,
            cause=Cause.CONTROL,
            actor=actor,
            reason="drain cancelled",
            action="WorkerDrainCancelled",
            changes={"drain": cancelled},
        )
        return worker, after

    before, after = retry_conflicts(cancel)
    # If the token is not stored yet, await-empty will find the drain cancelled and fail itself.
    token = before.drain.task_token if before.drain else None
    if token:
        ctx.workflows.fail(token, "DrainCancelled", f"drain cancelled by {actor}")
    _emit(ctx, "WorkerDrainCancelled", _worker_detail(after, cancelled_by=actor), "DrainCancelled")
    return after


def close_drain(ctx: Context, worker: Worker, *, outcome: DrainOutcome, reason: str, actor: str) -> Worker:
    """End the open drain of a worker that went away (orphan GC, console termination).

    The worker's status is left as it is; only the drain record closes, and its workflow stops waiting.
    """

    def close() -> tuple[Worker, str | None]:
        current = ctx.store.get_worker(worker.id)
        record = current.drain
        if record is None or record.outcome != DrainOutcome.RUNNING:
            return current, None
        closed = record.model_copy(
            update={"outcome": outcome, "finished_at": utcnow(), "error": reason, "task_token": None}
        )
        updated = ctx.store.update_worker(
            current, {"drain": closed}, actor=actor, action="WorkerDrainClosed", reason=reason
        )
        return updated, record.task_token

    updated, token = retry_conflicts(close)
    if token:
        ctx.workflows.fail(token, "DrainCancelled", reason)
    return updated


# ---- workflow steps: worker drains -----------------------------------------------------------------


def _drain_of(worker: Worker) -> DrainRecord:
    if worker.drain is None:
        raise RuntimeError(f"worker {worker.id} has no drain record where one was just written")
    return worker.drain


def _current_drain(worker: Worker, generation: int) -> DrainRecord:
    """The drain this execution serves, or DrainCancelled if it was cancelled, closed or superseded."""
    record = worker.drain
    if record is None or record.generation != generation:
        raise DrainCancelled(f"worker {worker.id} has no drain of generation {generation} any more")
    if record.outcome != DrainOutcome.RUNNING:
        raise DrainCancelled(f"drain {generation} of worker {worker.id} already ended: {record.outcome}")
    return record


def begin(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    """RUNNING → DRAINING (unless the request already did it); returns the wait plan."""

    def ensure_draining() -> Worker:
        worker = ctx.store.get_worker(drain.target)
        record = worker.drain
        if record is not None and record.generation >= drain.generation:
            _current_drain(worker, drain.generation)
            if worker.status != WorkerStatus.DRAINING:
                raise DrainNotStartable(f"worker {worker.id} is {worker.status}, not DRAINING")
            return worker
        if worker.status != WorkerStatus.RUNNING:
            raise DrainNotStartable(
                f"worker {worker.id} is {worker.status}; only a RUNNING worker can be drained"
            )
        started = drain.record()
        return ctx.store.transition_worker(
            worker,
            WorkerStatus.DRAINING,
            cause=Cause.CONTROL,
            actor=drain.requested_by,
            reason=drain.reason,
            action="WorkerDrainStarted",
            changes={"drain": started},
        )

    worker = retry_conflicts(ensure_draining)
    # Reporting emptiness here lets the state machine skip the wait for a worker that is already empty.
    return {**wait_plan(ctx, _drain_of(worker).deadline), "empty": worker.active_instances == 0}


def await_empty(ctx: Context, drain: DrainInput, task_token: str) -> None:
    """Store the callback token on the worker; answer it at once if the worker is already empty."""

    def register() -> Worker:
        worker = ctx.store.get_worker(drain.target)
        # A cancel that came before the token was stored wins here: raising fails the waiting task with
        # DrainCancelled at once, without the token.
        record = _current_drain(worker, drain.generation)
        if worker.status != WorkerStatus.DRAINING:
            raise DrainNotStartable(f"worker {worker.id} is {worker.status}, not DRAINING")
        return ctx.store.update_worker(
            worker,
            {"drain": record.model_copy(update={"task_token": task_token})},
            actor=WORKFLOW_ACTOR,
            action="WorkerDrainAwaitingEmpty",
        )

    worker = retry_conflicts(register)
    # The write above succeeded against this very count (its version matched), so if it is zero no
    # instance is left to send the token later: send it now.
    if worker.active_instances == 0:
        ctx.workflows.succeed(task_token, {"worker_id": worker.id, "empty": True})


def recheck(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    """Heartbeat safety net: is the worker empty, or the deadline passed, although no signal came?"""
    worker = ctx.store.get_worker(drain.target)
    record = _current_drain(worker, drain.generation)
    return {**wait_plan(ctx, record.deadline), "empty": worker.active_instances == 0}


def force(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    """The deadline passed: terminate what still runs, tell the operators, then let finish stop the worker."""
    worker = ctx.store.get_worker(drain.target)
    record = _current_drain(worker, drain.generation)
    forced: list[str] = []
    for instance in ctx.store.active_instances_of(worker.id):
        try:
            ended = ctx.store.end_instance(
                instance, InstanceState.TERMINATED, actor=WORKFLOW_ACTOR, reason="drain_timeout"
            )
        except (StaleWrite, IllegalTransition):
            continue  # it ended on its own meanwhile
        signal_if_drained(ctx, ended)  # it may have been its pool's last instance
        forced.append(instance.id)
        _emit(
            ctx,
            "InstanceForceTerminated",
            {"instance_id": instance.id, "worker_id": worker.id, "reason": "drain_timeout"},
            "InstanceForceTerminated",
        )

    def mark_timed_out() -> Worker:
        current = ctx.store.get_worker(worker.id)
        latest = _current_drain(current, drain.generation)
        update = {
            "forced_instances": latest.forced_instances + len(forced),
            "timed_out_at": latest.timed_out_at or utcnow(),
        }
        return ctx.store.update_worker(
            current,
            {"drain": latest.model_copy(update=update)},
            actor=WORKFLOW_ACTOR,
            action="WorkerDrainTimedOut",
            reason="drain deadline passed",
        )

    timed_out = retry_conflicts(mark_timed_out)
    detail = _worker_detail(timed_out, forced_instances=forced, deadline=record.deadline.isoformat())
    ctx.notifier.notify(f"fleetkeeper: drain of worker {worker.id} timed out", detail)
    _emit(ctx, "WorkerDrainTimedOut", detail, "DrainTimedOut")
    return {"forced_instances": len(forced)}


def finish(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    """DRAINING → STOPPING (then=stop) or TERMINATING (then=terminate), and ask EC2 to do it."""

    def complete() -> Worker:
        worker = ctx.store.get_worker(drain.target)
        record = worker.drain
        if (
            record is not None
            and record.generation == drain.generation
            and record.finished_at
            and record.outcome in (DrainOutcome.SUCCESS, DrainOutcome.TIMED_OUT)
        ):
            return worker  # finished by an earlier attempt of this step
        record = _current_drain(worker, drain.generation)
        if worker.status != WorkerStatus.DRAINING:
            raise DrainNotStartable(f"worker {worker.id} is {worker.status}, not DRAINING")
        target = WorkerStatus.TERMINATING if record.then == DrainThen.TERMINATE else WorkerStatus.STOPPING
        outcome = DrainOutcome.TIMED_OUT if record.timed_out_at else DrainOutcome.SUCCESS
        done = record.model_copy(update={"outcome": outcome, "finished_at": utcnow(), "task_token": None})
        return ctx.store.transition_worker(
            worker,
            target,
            cause=Cause.CONTROL,
            actor=WORKFLOW_ACTOR,
            reason=f"drain {outcome.value.lower()}",
            action="WorkerDrainCompleted",
            changes={"drain": done},
        )

    worker = retry_conflicts(complete)
    record = _drain_of(worker)
    if worker.ec2_instance_id:
        # If this call fails the step is retried; if it never succeeds the reconciler's STOPPING and
        # TERMINATING handlers repeat it, so the worker cannot stay half-stopped.
        gateway = ctx.ec2(worker.region)
        try:
            if record.then == DrainThen.TERMINATE:
                gateway.terminate(worker.ec2_instance_id)
            else:
                gateway.stop(worker.ec2_instance_id)
        except ClientError as exc:
            if not is_missing_instance(exc):
                raise
            # The machine is already gone: the drain still succeeded; discovery records the orphan.
            logger.warning(
                "drained worker has no EC2 instance any more",
                extra={"worker_id": worker.id, "ec2_instance_id": worker.ec2_instance_id},
            )
    duration = (record.finished_at or utcnow()) - record.started_at
    metrics.add_metric(name="DrainDurationSeconds", unit="Seconds", value=duration.total_seconds())
    _emit(
        ctx,
        "WorkerDrainCompleted",
        _worker_detail(worker, duration_seconds=duration.total_seconds()),
        "DrainCompleted",
    )
    return {"worker_status": str(worker.status), "outcome": str(record.outcome)}


def record_error(ctx: Context, drain: DrainInput, error: dict[str, Any] | None) -> dict[str, Any]:
    """The final catch: record ERROR on the drain so it never fails silently."""
    text = _error_text(error)
    if drain.kind == "pool":
        return _record_pool_error(ctx, drain, text)

    def mark() -> Worker:
        worker = ctx.store.get_worker(drain.target)
        record = worker.drain
        if record is not None and record.generation > drain.generation:
            return worker  # a newer drain owns the worker now; this stale execution must not touch it
        if record is not None and record.generation == drain.generation:
            if record.outcome != DrainOutcome.RUNNING:
                return worker  # already ended (e.g. finished, then EC2 refused): keep that outcome
            failed = record.model_copy(
                update={
                    "outcome": DrainOutcome.ERROR,
                    "error": text,
                    "finished_at": utcnow(),
                    "task_token": None,
                }
            )
        else:
            failed = drain.record(outcome=DrainOutcome.ERROR, error=text, finished_at=utcnow())
        return ctx.store.update_worker(
            worker, {"drain": failed}, actor=WORKFLOW_ACTOR, action="WorkerDrainFailed", reason=text
        )

    worker = retry_conflicts(mark)
    _emit(ctx, "WorkerDrainFailed", _worker_detail(worker, error=text), "DrainFailed")
    logger.error("drain failed", extra={"worker_id": worker.id, "error": text})
    return {"outcome": "ERROR"}


def _error_text(error: dict[str, Any] | None) -> str:
    if not error:
        return "unknown error"
    return f"{error.get('Error', 'Error')}: {str(error.get('Cause', ''))[:500]}"


# ---- signals -------------------------------------------------------------------------------------


def signal_if_drained(ctx: Context, instance: Instance) -> None:
    """After an instance ended: send the waiting drain tokens of its worker and pool if now empty."""
    worker = ctx.store.find_worker(instance.worker_id)
    if worker is not None and worker.status == WorkerStatus.DRAINING and worker.drain is not None:
        record = worker.drain
        if record.outcome == DrainOutcome.RUNNING and record.task_token and worker.active_instances == 0:
            ctx.workflows.succeed(record.task_token, {"worker_id": worker.id, "empty": True})
    if instance.pool:
        pool = ctx.store.find_pool(instance.pool)
        if (
            pool is not None
            and pool.status == PoolStatus.DRAINING
            and pool.drain_task_token
            and ctx.store.pool_active_instances(pool.name) == 0
        ):
            ctx.workflows.succeed(pool.drain_task_token, {"pool": pool.name, "empty": True})


def sweep_waiting_drains(ctx: Context) -> dict[str, int]:
    """Keep waiting drains alive and recover lost signals; the reconciler runs this every cycle.

    A drain whose worker is empty but whose token was never answered completes here. Otherwise a
    heartbeat keeps the callback task waiting without costing a state transition, so a drain's
    transition count does not grow with its length.
    """
    completed = heartbeats = 0
    for worker in ctx.store.iter_workers_by_status([WorkerStatus.DRAINING]):
        record = worker.drain
        if record is None or record.outcome != DrainOutcome.RUNNING or not record.task_token:
            continue
        current = ctx.store.get_worker(worker.id)  # the index may lag; act on the item
        token = current.drain.task_token if current.drain else None
        if not token or current.status != WorkerStatus.DRAINING:
            continue
        if current.active_instances == 0:
            completed += ctx.workflows.succeed(
                token, {"worker_id": current.id, "empty": True, "recovered": True}
            )
        else:
            heartbeats += ctx.workflows.heartbeat(token)
    for pool in ctx.store.list_pools():
        if pool.status != PoolStatus.DRAINING or not pool.drain_task_token:
            continue
        if ctx.store.pool_active_instances(pool.name) == 0:
            completed += ctx.workflows.succeed(pool.drain_task_token, {"pool": pool.name, "empty": True})
        else:
            heartbeats += ctx.workflows.heartbeat(pool.drain_task_token)
    return {"completed": completed, "heartbeats": heartbeats}


# ---- pool drains (seed 004) ----------------------------------------------------------------------


def start_pool_drain(
    ctx: Context,
    name: str,
    *,
    actor: str,
    timeout_seconds: int | None = None,
    then: PoolDrainThen = PoolDrainThen.NONE,
) -> Pool:
    """Stop placements on the pool now and start its drain workflow."""
    now = utcnow()
    timeout = pool_drain_timeout(timeout_seconds)

    def mark_draining() -> Pool:
        pool = ctx.store.get_pool(name)
        if pool.status == PoolStatus.DRAINING and pool.drain_outcome in (None, DrainOutcome.RUNNING):
            raise DrainInProgress("pool", name)
        if pool.status == PoolStatus.INACTIVE:
            raise Conflict(
                "pool",
                name,
                pool.status,
                f"pool {name} is inactive; PUT it with status active before draining it",
            )
        generation = pool.drain_generation + 1
        changes = {
            "status": PoolStatus.DRAINING,
            "drain_started_at": now,
            "drain_timeout_seconds": timeout,
            "drain_then": then,
            "drain_generation": generation,
            "drain_outcome": DrainOutcome.RUNNING,
            "drain_requested_by": actor,
            "drain_task_token": None,
            "drain_finished_at": None,
            "drain_execution_arn": ctx.workflows.execution_arn(execution_name("pool", name, generation)),
        }
        return ctx.store.save_pool(pool, changes, actor=actor, action="PoolDrainStarted")

    pool = retry_conflicts(mark_draining)
    drain_input = DrainInput(
        kind="pool",
        pool=name,
        generation=pool.drain_generation,
        timeout_seconds=timeout,
        started_at=now,
        deadline=drain_deadline(now, timeout),
        requested_by=actor,
        then=then.value,
        heartbeat_seconds=ctx.settings.drain_heartbeat_seconds,
    )
    try:
        ctx.workflows.start(
            execution_name("pool", name, pool.drain_generation), drain_input.model_dump(mode="json")
        )
    except Exception as exc:
        _finish_pool(
            ctx,
            name,
            pool.drain_generation,
            target=PoolStatus.ACTIVE,
            outcome=DrainOutcome.ERROR,
            reason=f"workflow did not start: {exc}",
            actor=WORKFLOW_ACTOR,
        )
        raise WorkflowUnavailable(
            f"the pool drain workflow could not start ({exc}); pool {name} is active again"
        ) from exc
    _emit(ctx, "PoolDrainStarted", _pool_detail(pool), "PoolDrainStarted")
    return pool


def _pool_detail(pool: Pool, **extra: Any) -> dict[str, Any]:
    return {
        "pool": pool.name,
        "status": str(pool.status),
        "generation": pool.drain_generation,
        "timeout_seconds": pool.drain_timeout_seconds,
        "then": str(pool.drain_then),
        "requested_by": pool.drain_requested_by,
        "outcome": str(pool.drain_outcome),
        **extra,
    }


def _current_pool_drain(pool: Pool, generation: int) -> None:
    if (
        pool.drain_generation != generation
        or pool.status != PoolStatus.DRAINING
        or pool.drain_outcome != DrainOutcome.RUNNING
    ):
        raise DrainCancelled(f"pool {pool.name} is no longer draining for generation {generation}")


def _finish_pool(
    ctx: Context,
    name: str,
    generation: int,
    *,
    target: PoolStatus,
    outcome: DrainOutcome,
    reason: str,
    actor: str,
) -> tuple[Pool, Pool] | None:
    def finish_once() -> tuple[Pool, Pool] | None:
        pool = ctx.store.get_pool(name)
        if pool.drain_generation != generation or pool.drain_outcome != DrainOutcome.RUNNING:
            return None
        changes: dict[str, Any] = {
            "drain_outcome": outcome,
            "drain_finished_at": utcnow(),
            "drain_task_token": None,
        }
        if pool.status != target:
            changes["status"] = target
        action = {
            DrainOutcome.SUCCESS: "PoolDrainCompleted",
            DrainOutcome.TIMED_OUT: "PoolDrainTimedOut",
            DrainOutcome.CANCELLED: "PoolDrainCancelled",
        }.get(outcome, "PoolDrainFailed")
        return pool, ctx.store.save_pool(pool, changes, actor=actor, action=action, reason=reason)

    return retry_conflicts(finish_once)


def cancel_pool_drain(ctx: Context, name: str, *, actor: str) -> Pool:
    """draining → active; the waiting workflow fails with DrainCancelled."""
    pool = ctx.store.get_pool(name)
    if pool.status != PoolStatus.DRAINING:
        raise Conflict(
            "pool", name, pool.status, f"pool {name} is {pool.status}; only a draining pool can be cancelled"
        )
    result = _finish_pool(
        ctx,
        name,
        pool.drain_generation,
        target=PoolStatus.ACTIVE,
        outcome=DrainOutcome.CANCELLED,
        reason=f"cancelled by {actor}",
        actor=actor,
    )
    if result is None:
        # The drain already ended (e.g. in ERROR) but the pool is still draining: just reactivate it.
        current = ctx.store.get_pool(name)
        updated = ctx.store.save_pool(
            current, {"status": PoolStatus.ACTIVE}, actor=actor, action="PoolDrainCancelled"
        )
        _emit(ctx, "PoolDrainCancelled", _pool_detail(updated, cancelled_by=actor), "PoolDrainCancelled")
        return updated
    before, after = result
    if before.drain_task_token:
        ctx.workflows.fail(before.drain_task_token, "DrainCancelled", f"pool drain cancelled by {actor}")
    _emit(ctx, "PoolDrainCancelled", _pool_detail(after, cancelled_by=actor), "PoolDrainCancelled")
    return after


def pool_begin(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    pool = ctx.store.get_pool(drain.target)
    _current_pool_drain(pool, drain.generation)
    return {**wait_plan(ctx, drain.deadline), "empty": ctx.store.pool_active_instances(pool.name) == 0}


def pool_await_empty(ctx: Context, drain: DrainInput, task_token: str) -> None:
    """Store the pool's callback token, then count: whoever comes second sees the other's write."""

    def register() -> Pool:
        pool = ctx.store.get_pool(drain.target)
        _current_pool_drain(pool, drain.generation)
        return ctx.store.save_pool(
            pool, {"drain_task_token": task_token}, actor=WORKFLOW_ACTOR, action="PoolDrainAwaitingEmpty"
        )

    pool = retry_conflicts(register)
    if ctx.store.pool_active_instances(pool.name) == 0:
        ctx.workflows.succeed(task_token, {"pool": pool.name, "empty": True})


def pool_finish(ctx: Context, drain: DrainInput, *, timed_out: bool) -> dict[str, Any]:
    """draining → inactive (empty, or timed out); then drain the pool's workers if the request asked to."""
    outcome = DrainOutcome.TIMED_OUT if timed_out else DrainOutcome.SUCCESS
    reason = "drain timeout expired" if timed_out else "all instances completed"
    result = _finish_pool(
        ctx,
        drain.target,
        drain.generation,
        target=PoolStatus.INACTIVE,
        outcome=outcome,
        reason=reason,
        actor=WORKFLOW_ACTOR,
    )
    if result is None:
        pool = ctx.store.get_pool(drain.target)
        if pool.drain_generation == drain.generation and pool.drain_outcome == outcome:
            after = pool  # an earlier attempt of this step finished it
        else:
            raise DrainCancelled(f"pool {pool.name} drain {drain.generation} already ended")
    else:
        after = result[1]
    drained_workers: list[str] = []
    if drain.then != PoolDrainThen.NONE.value:
        for worker in ctx.store.workers_in_pool(after.name):
            if worker.status != WorkerStatus.RUNNING:
                continue
            try:
                start_worker_drain(
                    ctx,
                    worker.id,
                    actor=WORKFLOW_ACTOR,
                    reason=f"pool {after.name} drained",
                    then=DrainThen(drain.then),
                )
                drained_workers.append(worker.id)
            except Conflict as refused:
                logger.warning(
                    "worker not drained after pool drain",
                    extra={"worker_id": worker.id, "reason": refused.message},
                )
    detail_type = "PoolDrainTimedOut" if timed_out else "PoolDrainCompleted"
    _emit(ctx, detail_type, _pool_detail(after, drained_workers=drained_workers), detail_type)
    if timed_out:
        ctx.notifier.notify(f"fleetkeeper: drain of pool {after.name} timed out", _pool_detail(after))
    return {"outcome": outcome.value, "drained_workers": drained_workers}


def _record_pool_error(ctx: Context, drain: DrainInput, text: str) -> dict[str, Any]:
    result = _finish_pool(
        ctx,
        drain.target,
        drain.generation,
        target=PoolStatus.DRAINING,
        outcome=DrainOutcome.ERROR,
        reason=text,
        actor=WORKFLOW_ACTOR,
    )
    pool = result[1] if result else ctx.store.get_pool(drain.target)
    _emit(ctx, "PoolDrainFailed", _pool_detail(pool, error=text), "PoolDrainFailed")
    return {"outcome": "ERROR"}


# ---- the drain_tasks Lambda: one entry for every Task state of the state machine ---------------------


class StepRequest(BaseModel):
    """The Payload a Task state sends (see infra/statemachines/drain.asl.json)."""

    model_config = ConfigDict(extra="ignore")

    step: Literal[
        "begin",
        "await_empty",
        "recheck",
        "force",
        "finish",
        "record_error",
        "pool_begin",
        "pool_await_empty",
        "pool_recheck",
        "pool_finish",
    ]
    drain: DrainInput
    task_token: str | None = None
    error: dict[str, Any] | None = None
    timed_out: bool = False


def run_step(ctx: Context, request: StepRequest) -> dict[str, Any]:
    """Run one workflow step; named errors (DrainCancelled, DrainNotStartable) steer the state machine."""
    drain = request.drain
    match request.step:
        case "begin":
            return begin(ctx, drain)
        case "await_empty" | "pool_await_empty":
            if not request.task_token:
                raise DrainNotStartable(f"{request.step} needs the task token")
            if request.step == "await_empty":
                await_empty(ctx, drain, request.task_token)
            else:
                pool_await_empty(ctx, drain, request.task_token)
            return {"registered": True}
        case "recheck":
            return recheck(ctx, drain)
        case "force":
            return force(ctx, drain)
        case "finish":
            return finish(ctx, drain)
        case "record_error":
            return record_error(ctx, drain, request.error)
        case "pool_begin" | "pool_recheck":
            # Both report the time left and whether the pool is already empty.
            return pool_begin(ctx, drain)
        case "pool_finish":
            return pool_finish(ctx, drain, timed_out=request.timed_out)
