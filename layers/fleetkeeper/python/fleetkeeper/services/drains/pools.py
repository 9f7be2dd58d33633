"""Pool drains: placements stop on the pool at once; the pool goes inactive when empty or past its timeout."""

from __future__ import annotations

from typing import Any

from fleetkeeper.domain.drain_policy import (
    drain_deadline,
    pool_drain_timeout,
)
from fleetkeeper.domain.errors import (
    Conflict,
    DrainCancelled,
    DrainInProgress,
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
from fleetkeeper.services.drains.commands import start_worker_drain
from fleetkeeper.services.drains.contract import WORKFLOW_ACTOR, DrainInput, execution_name, wait_plan
from fleetkeeper.services.retry import retry_conflicts


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


def _current_pool_drain(pool: Pool, generation: int) -> None:
    if (
        pool.drain_generation != generation
        or pool.status != PoolStatus.DRAINING
        or pool.drain_outcome != DrainOutcome.RUNNING
    ):
        raise DrainCancelled(f"pool {pool.name} is no longer draining for generation {generation}")


def finish_pool(
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
    result = finish_pool(
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
        emit(ctx, "PoolDrainCancelled", pool_detail(updated, cancelled_by=actor), "PoolDrainCancelled")
        return updated
    before, after = result
    if before.drain_task_token:
        ctx.workflows.fail(before.drain_task_token, "DrainCancelled", f"pool drain cancelled by {actor}")
    emit(ctx, "PoolDrainCancelled", pool_detail(after, cancelled_by=actor), "PoolDrainCancelled")
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
    result = finish_pool(
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
    emit(ctx, detail_type, pool_detail(after, drained_workers=drained_workers), detail_type)
    if timed_out:
        ctx.notifier.notify(f"fleetkeeper: drain of pool {after.name} timed out", pool_detail(after))
    return {"outcome": outcome.value, "drained_workers": drained_workers}


def record_pool_error(ctx: Context, drain: DrainInput, text: str) -> dict[str, Any]:
    result = finish_pool(
        ctx,
        drain.target,
        drain.generation,
        target=PoolStatus.DRAINING,
        outcome=DrainOutcome.ERROR,
        reason=text,
        actor=WORKFLOW_ACTOR,
    )
    pool = result[1] if result else ctx.store.get_pool(drain.target)
    emit(ctx, "PoolDrainFailed", pool_detail(pool, error=text), "PoolDrainFailed")
    return {"outcome": "ERROR"}
