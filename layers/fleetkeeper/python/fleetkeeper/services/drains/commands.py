"""Worker drain commands: plan, start, cancel, close and status (what operators and hooks ask for)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.drain_policy import (
    drain_deadline,
    estimated_completion,
    worker_drain_timeout,
)
from fleetkeeper.domain.errors import (
    Conflict,
    DrainInProgress,
    WorkflowUnavailable,
)
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import (
    DrainOutcome,
    DrainRecord,
    DrainThen,
    Worker,
    utcnow,
)
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains._shared import drain_of, emit, worker_detail
from fleetkeeper.services.drains.contract import WORKFLOW_ACTOR, DrainInput, DrainStatus, execution_name
from fleetkeeper.services.drains.reschedule import plan_moves


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
        reschedule=record.reschedule,
        moved_instances=record.moved_instances,
        left_instances=worker.active_instances,
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
    reschedule: bool = True,
    actor: str,
) -> DrainStatus:
    """What a drain would do now, without doing it (dry run)."""
    now = utcnow()
    worker = ctx.store.get_worker(worker_id)
    timeout = worker_drain_timeout(timeout_seconds, ctx.store.find_template(worker.template))
    deadline = drain_deadline(now, timeout)
    refusal = _refusal(worker)
    active = ctx.store.active_instances_of(worker.id)
    movable = {i.id for i in plan_moves(ctx, worker)} if reschedule and refusal is None else set()
    staying = [i for i in active if i.id not in movable]
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
        reschedule=reschedule,
        moved_instances=len(movable),
        left_instances=max(worker.active_instances - len(movable), 0),
        estimated_completion=estimated_completion(staying, deadline, now),
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
    reschedule: bool = True,
) -> DrainStatus:
    """Take the worker out of placement now (RUNNING → DRAINING) and start its drain workflow.

    With `reschedule` (the default) the workflow's begin step moves the worker's SCHEDULED instances
    to other workers with room (services/drains/reschedule.py).

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
            reschedule=reschedule,
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
    record = drain_of(worker)
    # A crash right here leaves a DRAINING worker without an execution: the watchdog starts it.
    try:
        launch_worker_drain(ctx, worker.id, record)
    except Exception as exc:
        _undo_unstarted_drain(ctx, worker.id, record.generation, exc)
        raise WorkflowUnavailable(
            f"the drain workflow could not start ({exc}); worker {worker.id} is back to its previous state"
        ) from exc
    emit(
        ctx,
        "WorkerDrainStarted",
        worker_detail(worker, timeout_seconds=record.timeout_seconds),
        "DrainStarted",
    )
    logger.info("drain started", extra={"worker_id": worker.id, "generation": record.generation})
    return status_of(ctx, worker, now)


def launch_worker_drain(ctx: Context, worker_id: str, record: DrainRecord) -> str:
    """Start the execution that serves this drain record; starting it twice is harmless.

    The name and input are derived from the record alone, so a retry (or the watchdog) that starts it
    again gets the same execution back rather than a second one.
    """
    drain_input = DrainInput.of_worker(ctx, worker_id, record)
    return ctx.workflows.start(drain_input.execution_name, drain_input.model_dump(mode="json"))


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


def cancel_worker_drain(ctx: Context, worker_id: str, *, actor: str, reason: str | None = None) -> Worker:
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
        changes: dict[str, Any] = {}
        audit_reason = "drain cancelled"
        if worker.desired_status in (WorkerStatus.STOPPED, WorkerStatus.TERMINATED):
            # A cancel means "keep this worker running": a desired STOPPED or TERMINATED would make the
            # next reconcile cycle drain it again, undoing the cancel. See docs/drains.md.
            changes["desired_status"] = None
            audit_reason = f"drain cancelled; desired status {worker.desired_status} cleared"
        if reason:
            audit_reason = f"{audit_reason}: {reason}"
        cancelled = None
        if record is not None:
            final = record.outcome if record.outcome != DrainOutcome.RUNNING else DrainOutcome.CANCELLED
            cancelled = record.model_copy(
                update={
                    "outcome": final,
                    "cancelled_by": actor,
                    "cancel_reason": reason,
                    "finished_at": record.finished_at or now,
                    "task_token": None,
                }
            )
        after = ctx.store.transition_worker(
            worker,
            WorkerStatus.RUNNING,
            cause=Cause.CONTROL,
            actor=actor,
            reason=audit_reason,
            action="WorkerDrainCancelled",
            changes={**changes, "drain": cancelled},
        )
        return worker, after

    before, after = retry_conflicts(cancel)
    # If the token is not stored yet, await-empty will find the drain cancelled and fail itself.
    token = before.drain.task_token if before.drain else None
    if token:
        ctx.workflows.fail(token, "DrainCancelled", f"drain cancelled by {actor}")
    emit(
        ctx,
        "WorkerDrainCancelled",
        worker_detail(after, cancelled_by=actor, cancel_reason=reason),
        "DrainCancelled",
    )
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
