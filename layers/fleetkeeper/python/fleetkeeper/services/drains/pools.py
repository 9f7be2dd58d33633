"""Pool drains: placements stop on the pool at once; the pool goes inactive when empty or past its timeout."""

from __future__ import annotations

from typing import Any

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.drain_policy import (
    pool_drain_timeout,
)
from fleetkeeper.domain.errors import (
    Conflict,
    DrainCancelled,
    DrainInProgress,
    DrainNotEmpty,
    StaleWrite,
    WorkflowUnavailable,
)
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import (
    DrainOutcome,
    DrainThen,
    Pool,
    PoolDrainThen,
    utcnow,
)
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains._shared import emit
from fleetkeeper.services.drains.commands import launch_worker_drain, start_worker_drain
from fleetkeeper.services.drains.contract import WORKFLOW_ACTOR, DrainInput, execution_name, pool_wait_plan

# A pool's workers still coming up when its drain ends.
_LAUNCHING = frozenset({WorkerStatus.PENDING, WorkerStatus.PROVISIONING, WorkerStatus.STARTING})


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
            "drain_cancelled_by": None,
            "drain_cancel_reason": None,
            "drain_execution_arn": ctx.workflows.execution_arn(execution_name("pool", name, generation)),
        }
        return ctx.store.save_pool(pool, changes, actor=actor, action="PoolDrainStarted")

    pool = retry_conflicts(mark_draining)
    # A crash right here leaves a draining pool without an execution: the watchdog starts it.
    try:
        launch_pool_drain(ctx, pool)
    except Exception as exc:
        finish_pool(
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
    emit(ctx, "PoolDrainStarted", pool_detail(pool), "PoolDrainStarted")
    return pool


def launch_pool_drain(ctx: Context, pool: Pool) -> str:
    """Start the execution that serves the pool's current drain; starting it twice is harmless."""
    drain_input = DrainInput.of_pool(ctx, pool)
    return ctx.workflows.start(drain_input.execution_name, drain_input.model_dump(mode="json"))


def pool_detail(pool: Pool, **extra: Any) -> dict[str, Any]:
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


def _current_pool_drain(pool: Pool, drain: DrainInput) -> None:
    if (
        pool.drain_generation != drain.generation
        or pool.status != PoolStatus.DRAINING
        or pool.drain_outcome != DrainOutcome.RUNNING
    ):
        raise DrainCancelled(f"pool {pool.name} is no longer draining for generation {drain.generation}")
    if pool.drain_restarts != drain.restart:
        raise DrainCancelled(f"pool {pool.name} drain is served by restart {pool.drain_restarts} now")


def finish_pool(
    ctx: Context,
    name: str,
    generation: int,
    *,
    target: PoolStatus,
    outcome: DrainOutcome,
    reason: str,
    actor: str,
    restart: int | None = None,
) -> tuple[Pool, Pool] | None:
    """End the pool's drain `generation` if it is still RUNNING (and, with `restart`, still served by
    that execution); None when it already ended or belongs to another execution."""

    def finish_once() -> tuple[Pool, Pool] | None:
        pool = ctx.store.get_pool(name)
        if pool.drain_generation != generation or pool.drain_outcome != DrainOutcome.RUNNING:
            return None
        if restart is not None and pool.drain_restarts != restart:
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


def cancel_pool_drain(ctx: Context, name: str, *, actor: str, reason: str | None = None) -> Pool:
    """draining → active; the waiting workflow fails with DrainCancelled.

    One conditional write (version and status draining) decides: of concurrent cancels exactly one
    wins, and a cancel that finds the pool no longer draining (the drain completed, another cancel won)
    is a conflict, never a second success.
    """

    def cancel_once() -> tuple[Pool, Pool]:
        pool = ctx.store.get_pool(name)
        if pool.status != PoolStatus.DRAINING:
            raise Conflict(
                "pool",
                name,
                pool.status,
                f"pool {name} is {pool.status}; only a draining pool can be cancelled",
            )
        changes: dict[str, Any] = {
            "status": PoolStatus.ACTIVE,
            "drain_cancelled_by": actor,
            "drain_cancel_reason": reason,
        }
        if pool.drain_outcome == DrainOutcome.RUNNING:
            changes.update(
                drain_outcome=DrainOutcome.CANCELLED, drain_finished_at=utcnow(), drain_task_token=None
            )
        # A drain that already ended (in ERROR) left the pool draining: the cancel just reactivates it.
        after = ctx.store.save_pool(
            pool,
            changes,
            actor=actor,
            action="PoolDrainCancelled",
            reason=f"cancelled by {actor}: {reason}" if reason else f"cancelled by {actor}",
        )
        return pool, after

    before, after = retry_conflicts(cancel_once)
    if before.drain_task_token and before.drain_outcome == DrainOutcome.RUNNING:
        ctx.workflows.fail(before.drain_task_token, "DrainCancelled", f"pool drain cancelled by {actor}")
    emit(
        ctx,
        "PoolDrainCancelled",
        pool_detail(after, cancelled_by=actor, cancel_reason=reason),
        "PoolDrainCancelled",
    )
    return after


def pool_begin(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    pool = ctx.store.get_pool(drain.target)
    _current_pool_drain(pool, drain)
    return {
        **pool_wait_plan(ctx, drain.deadline, drain.timeout_seconds),
        "empty": ctx.store.pool_active_instances(pool.name) == 0,
    }


def pool_await_empty(ctx: Context, drain: DrainInput, task_token: str) -> None:
    """Store the pool's callback token, then count: whoever comes second sees the other's write."""

    def register() -> Pool:
        pool = ctx.store.get_pool(drain.target)
        _current_pool_drain(pool, drain)
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
    if not timed_out:
        left = ctx.store.pool_active_instances(drain.target)
        if left:
            # A success answer while work still runs (replayed or forged token): wait again. No
            # instance can land in a draining pool, so the count only goes down after this read.
            raise DrainNotEmpty(f"pool {drain.target} still has {left} active instances; waiting again")
    result = finish_pool(
        ctx,
        drain.target,
        drain.generation,
        target=PoolStatus.INACTIVE,
        outcome=outcome,
        reason=reason,
        actor=WORKFLOW_ACTOR,
        restart=drain.restart,
    )
    if result is None:
        pool = ctx.store.get_pool(drain.target)
        if pool.drain_generation == drain.generation and pool.drain_outcome == outcome:
            after = pool  # an earlier attempt of this step finished it
        else:
            raise DrainCancelled(f"pool {pool.name} drain {drain.generation} already ended")
    else:
        after = result[1]
    drained_workers = _drain_workers(ctx, after, drain) if drain.then != PoolDrainThen.NONE.value else []
    detail_type = "PoolDrainTimedOut" if timed_out else "PoolDrainCompleted"
    emit(ctx, detail_type, pool_detail(after, drained_workers=drained_workers), detail_type)
    if timed_out:
        ctx.notifier.notify(f"fleetkeeper: drain of pool {after.name} timed out", pool_detail(after))
    return {"outcome": outcome.value, "drained_workers": drained_workers}


def _drain_workers(ctx: Context, pool: Pool, drain: DrainInput) -> list[str]:
    """Drain every worker of the pool (then=stop|terminate). Resumable: a retry of the step after a crash
    also starts the drains it marked but never started, recognised by their reason."""
    reason = f"pool {pool.name} drained (drain {drain.generation})"
    drained: list[str] = []
    # The index only says which workers belong to the pool; their status comes from the items.
    for worker in ctx.store.get_workers([w.id for w in ctx.store.workers_in_pool(pool.name)]):
        record = worker.drain
        if (
            worker.status == WorkerStatus.DRAINING
            and record is not None
            and record.outcome == DrainOutcome.RUNNING
            and record.reason == reason
        ):
            launch_worker_drain(ctx, worker.id, record)  # the same execution name: at most one runs
            drained.append(worker.id)
            continue
        if worker.status in _LAUNCHING:
            # Coming up as the pool closes: stopped (or terminated) once it runs, like the others.
            desired = (
                WorkerStatus.STOPPED if drain.then == PoolDrainThen.STOP.value else WorkerStatus.TERMINATED
            )
            if worker.desired_status != desired:
                # On the version read: a worker that moved meanwhile is read again when the step retries.
                ctx.store.update_worker(
                    worker,
                    {"desired_status": desired},
                    actor=WORKFLOW_ACTOR,
                    action="WorkerDesiredStatusSet",
                    reason=f"{reason}: desired {desired} once it runs",
                )
            continue
        if worker.status != WorkerStatus.RUNNING:
            continue
        try:
            start_worker_drain(
                ctx, worker.id, actor=WORKFLOW_ACTOR, reason=reason, then=DrainThen(drain.then)
            )
            drained.append(worker.id)
        except StaleWrite:
            raise  # a race lost on every attempt is not a refusal: the step retries and resumes
        except Conflict as refused:
            logger.warning(
                "worker not drained after pool drain",
                extra={"worker_id": worker.id, "reason": refused.message},
            )
    return drained


def record_pool_error(ctx: Context, drain: DrainInput, text: str) -> dict[str, Any]:
    result = finish_pool(
        ctx,
        drain.target,
        drain.generation,
        target=PoolStatus.DRAINING,
        outcome=DrainOutcome.ERROR,
        reason=text,
        actor=WORKFLOW_ACTOR,
        restart=drain.restart,
    )
    pool = result[1] if result else ctx.store.get_pool(drain.target)
    emit(ctx, "PoolDrainFailed", pool_detail(pool, error=text), "PoolDrainFailed")
    return {"outcome": "ERROR"}
