"""The watchdog: every open drain has a live execution, or gets a new one, or is closed with ERROR.

A drain record that says RUNNING is a promise that some execution will finish it. That promise breaks
when the execution never started (a crash between the status write and StartExecution), ended without
recording its outcome (RecordError failed too), or was stopped by Step Functions itself (States.Runtime,
the history limit, the one-year limit, an operator's StopExecution). The reconcile cycle's drain sweep
(services/drains/sweep.py) describes each open drain's execution when it is due and

- running: nothing to do;
- missing, aborted, timed out, failed with anything but the workflow's own DrainFailed, or succeeded
  while the record still says RUNNING: starts a new execution for the same generation (name suffix
  -r<n>, same deadline, so it waits only for the time left), at most MAX_RESTARTS times;
- failed with DrainFailed (the workflow gave up and could not record it), or out of restarts: closes
  the drain with ERROR, with a metric, an audit event and a notification.

A closed drain no longer owns its worker: the reconciler stops an empty worker and leaves a busy one
out of placement for an operator (docs/drains.md).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Literal

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.cloud.workflows import ExecutionState
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, Pool, Worker, utcnow
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services import operations
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains._shared import emit, worker_detail
from fleetkeeper.services.drains.commands import launch_worker_drain
from fleetkeeper.services.drains.contract import execution_name
from fleetkeeper.services.drains.pools import finish_pool, launch_pool_drain, pool_detail

WATCHDOG_ACTOR = "drain-watchdog"
# New executions for one drain generation before the watchdog gives up and closes it with ERROR.
MAX_RESTARTS = 3
# A request writes the drain first and starts its execution right after; an execution younger than
# this may simply not be started yet.
START_GRACE = timedelta(seconds=60)
METRIC_EXECUTION_LOST = "DrainExecutionLost"
# The Fail state the workflow ends in after RecordError (infra/statemachines/drain.asl.json).
_WORKFLOW_GAVE_UP = "DrainFailed"

Verdict = Literal["running", "young", "restarted", "closed", "settled"]


def is_young(restarts: int, started_at: datetime | None, now: datetime, grace: timedelta) -> bool:
    """A drain whose request may still be starting its first execution: not described yet."""
    return restarts == 0 and started_at is not None and now - started_at < grace


def worker_execution_arn(ctx: Context, worker_id: str, record: DrainRecord) -> str:
    """The execution that serves this worker drain (the newest restart's)."""
    return record.execution_arn or ctx.workflows.execution_arn(
        execution_name("drain", worker_id, record.generation, record.restarts)
    )


def pool_execution_arn(ctx: Context, pool: Pool) -> str:
    """The execution that serves the pool's drain (the newest restart's)."""
    return pool.drain_execution_arn or ctx.workflows.execution_arn(
        execution_name("pool", pool.name, pool.drain_generation, pool.drain_restarts)
    )


def _problem(execution: ExecutionState | None) -> str | None:
    """Why this execution no longer serves an open drain, or None while it runs."""
    if execution is None:
        return "execution does not exist"
    if execution.status == "RUNNING":
        return None
    detail = f": {execution.error}" if execution.error else ""
    return f"execution {execution.status}{detail}"


def _gave_up(execution: ExecutionState | None) -> bool:
    return execution is not None and execution.status == "FAILED" and execution.error == _WORKFLOW_GAVE_UP


# ---- worker drains -------------------------------------------------------------------------------


def watch_worker(ctx: Context, worker: Worker, now: datetime, grace: timedelta) -> Verdict:
    """The verdict on one worker drain, given its worker as read from the item (never the index)."""
    record = worker.drain
    if worker.status != WorkerStatus.DRAINING or record is None or record.outcome != DrainOutcome.RUNNING:
        return "settled"
    arn = worker_execution_arn(ctx, worker.id, record)
    if is_young(record.restarts, record.started_at, now, grace):
        return "young"  # its request may still be starting it
    execution = ctx.workflows.describe(arn)
    problem = _problem(execution)
    if problem is None:
        return "running"
    if _gave_up(execution) or record.restarts >= MAX_RESTARTS:
        _close_worker_drain(ctx, worker.id, record.generation, arn, problem)
        return "closed"
    restarted = _restart_worker_drain(ctx, worker.id, record.generation, arn, problem)
    return "restarted" if restarted else "settled"


def _restart_worker_drain(ctx: Context, worker_id: str, generation: int, lost_arn: str, why: str) -> bool:
    def claim() -> Worker | None:
        worker = ctx.store.get_worker(worker_id)
        record = worker.drain
        if (
            worker.status != WorkerStatus.DRAINING
            or record is None
            or record.generation != generation
            or record.outcome != DrainOutcome.RUNNING
            or (record.execution_arn is not None and record.execution_arn != lost_arn)
        ):
            return None  # settled meanwhile, or another watchdog already replaced the execution
        restart = record.restarts + 1
        name = execution_name("drain", worker.id, generation, restart)
        replaced = record.model_copy(
            update={
                "restarts": restart,
                "execution_arn": ctx.workflows.execution_arn(name),
                "task_token": None,
            }
        )
        # Conditional on the version read: of two watchdogs, one claims the restart.
        return ctx.store.update_worker(
            worker, {"drain": replaced}, actor=WATCHDOG_ACTOR, action="WorkerDrainRestarted", reason=why
        )

    worker = retry_conflicts(claim)
    if worker is None or worker.drain is None:
        return False
    metrics.add_metric(name=METRIC_EXECUTION_LOST, unit="Count", value=1)
    # If this start fails, the next cycle finds the new execution missing and tries again (bounded).
    launch_worker_drain(ctx, worker.id, worker.drain)
    emit(ctx, "WorkerDrainRestarted", worker_detail(worker, lost_execution=lost_arn, problem=why))
    logger.warning(
        "drain execution lost; restarted",
        extra={"worker_id": worker.id, "generation": generation, "problem": why},
    )
    return True


def _close_worker_drain(ctx: Context, worker_id: str, generation: int, lost_arn: str, why: str) -> None:
    text = f"drain execution lost ({why}); closed by the watchdog"

    def close() -> Worker | None:
        worker = ctx.store.get_worker(worker_id)
        record = worker.drain
        if (
            record is None
            or record.generation != generation
            or record.outcome != DrainOutcome.RUNNING
            or (record.execution_arn is not None and record.execution_arn != lost_arn)
        ):
            return None
        failed = record.model_copy(
            update={"outcome": DrainOutcome.ERROR, "error": text, "finished_at": utcnow(), "task_token": None}
        )
        return ctx.store.update_worker(
            worker, {"drain": failed}, actor=WATCHDOG_ACTOR, action="WorkerDrainFailed", reason=text
        )

    worker = retry_conflicts(close)
    if worker is None:
        return
    try:
        # A drain closed after it was marked finishing is stopped by the reconciler without its
        # before-stop operations: each one that did not finish is said to have not run.
        operations.abandon_before_stop(ctx, worker, generation, text)
    except Exception:  # the alert below still goes out
        logger.exception("before-stop operations of a closed drain not audited", worker_id=worker.id)
    metrics.add_metric(name=METRIC_EXECUTION_LOST, unit="Count", value=1)
    detail = worker_detail(worker, error=text, lost_execution=lost_arn)
    emit(ctx, "WorkerDrainFailed", detail, "DrainFailed")
    ctx.notifier.notify(f"fleetkeeper: drain of worker {worker.id} lost its workflow", detail)
    logger.error("drain execution lost; drain closed", extra={"worker_id": worker.id, "problem": why})


# ---- pool drains ---------------------------------------------------------------------------------


def watch_pool(ctx: Context, pool: Pool, now: datetime, grace: timedelta) -> Verdict:
    """The verdict on one pool drain, given the pool as read from its item."""
    if pool.status != PoolStatus.DRAINING or pool.drain_outcome != DrainOutcome.RUNNING:
        return "settled"
    arn = pool_execution_arn(ctx, pool)
    if is_young(pool.drain_restarts, pool.drain_started_at or now, now, grace):
        return "young"  # its request may still be starting it
    execution = ctx.workflows.describe(arn)
    problem = _problem(execution)
    if problem is None:
        return "running"
    if _gave_up(execution) or pool.drain_restarts >= MAX_RESTARTS:
        text = f"drain execution lost ({problem}); closed by the watchdog"
        result = finish_pool(
            ctx,
            pool.name,
            pool.drain_generation,
            target=PoolStatus.DRAINING,
            outcome=DrainOutcome.ERROR,
            reason=text,
            actor=WATCHDOG_ACTOR,
            restart=pool.drain_restarts,
        )
        if result is not None:
            metrics.add_metric(name=METRIC_EXECUTION_LOST, unit="Count", value=1)
            detail = pool_detail(result[1], error=text, lost_execution=arn)
            emit(ctx, "PoolDrainFailed", detail, "PoolDrainFailed")
            ctx.notifier.notify(f"fleetkeeper: drain of pool {pool.name} lost its workflow", detail)
        return "closed"
    return "restarted" if _restart_pool_drain(ctx, pool, arn, problem) else "settled"


def _restart_pool_drain(ctx: Context, seen: Pool, lost_arn: str, why: str) -> bool:
    def claim() -> Pool | None:
        pool = ctx.store.get_pool(seen.name)
        if (
            pool.status != PoolStatus.DRAINING
            or pool.drain_generation != seen.drain_generation
            or pool.drain_outcome != DrainOutcome.RUNNING
            or pool.drain_restarts != seen.drain_restarts
        ):
            return None
        restart = pool.drain_restarts + 1
        name = execution_name("pool", pool.name, pool.drain_generation, restart)
        changes = {
            "drain_restarts": restart,
            "drain_execution_arn": ctx.workflows.execution_arn(name),
            "drain_task_token": None,
        }
        return ctx.store.save_pool(
            pool, changes, actor=WATCHDOG_ACTOR, action="PoolDrainRestarted", reason=why
        )

    pool = retry_conflicts(claim)
    if pool is None:
        return False
    metrics.add_metric(name=METRIC_EXECUTION_LOST, unit="Count", value=1)
    launch_pool_drain(ctx, pool)
    emit(ctx, "PoolDrainRestarted", pool_detail(pool, lost_execution=lost_arn, problem=why))
    return True
