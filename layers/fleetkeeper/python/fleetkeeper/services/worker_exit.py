"""Ending a worker whose machine is gone: the worker, its instances and its open drain, in that order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, Worker
from fleetkeeper.observability import logger
from fleetkeeper.services import drain_hooks, drains

if TYPE_CHECKING:
    from fleetkeeper.services.context import Context

# The reason written on instances that were running on a machine that disappeared.
WORKER_LOST = "worker_lost"
# ... and on a machine that EC2 stopped outside fleetkeeper (console, spot stop).
WORKER_STOPPED = "worker_stopped"


def retire_worker(
    ctx: Context,
    worker: Worker,
    *,
    cause: Cause,
    actor: str,
    reason: str,
    changes: Mapping[str, Any] | None = None,
) -> Worker:
    """Mark the worker TERMINATED (soft delete), end its active instances and close an open drain.

    The worker moves first, conditionally, so of two concurrent retirements only one goes on to the
    instances; ending an instance is itself conditional, so a retry after a crash finishes the job.
    """
    retired = ctx.store.transition_worker(
        worker,
        WorkerStatus.TERMINATED,
        cause=cause,
        actor=actor,
        reason=reason,
        changes={"terminated_by": actor, "terminated_reason": reason, **(changes or {})},
    )
    end_lost_instances(ctx, retired, actor=actor)
    drain_hooks.close_drain(ctx, worker, outcome=DrainOutcome.ERROR, reason=WORKER_LOST, actor=actor)
    return retired


def finish_retirement(ctx: Context, worker: Worker, *, actor: str) -> None:
    """Complete a retirement that was cut short (crash, throttling) after the worker became TERMINATED."""
    if worker.status != WorkerStatus.TERMINATED:
        return
    if worker.active_instances > 0:
        end_lost_instances(ctx, worker, actor=actor)
    drain_hooks.close_drain(ctx, worker, outcome=DrainOutcome.ERROR, reason=WORKER_LOST, actor=actor)


def release_stopped_worker(ctx: Context, worker: Worker, *, actor: str) -> None:
    """EC2 stopped the machine under its sessions: end them and close the drain that waited on them.

    Left alone they would come back as ghosts holding slots when the machine restarts.
    """
    if worker.status != WorkerStatus.STOPPED:
        return
    if worker.active_instances > 0:
        end_lost_instances(ctx, worker, actor=actor, reason=WORKER_STOPPED)
    drain_hooks.close_drain(ctx, worker, outcome=DrainOutcome.ERROR, reason=WORKER_STOPPED, actor=actor)


def end_lost_instances(ctx: Context, worker: Worker, *, actor: str, reason: str = WORKER_LOST) -> int:
    """End every instance still active on a worker that is gone; returns how many were ended."""
    ended = 0
    for instance in ctx.store.active_instances_of(worker.id):
        try:
            lost = ctx.store.end_instance(instance, InstanceState.TERMINATED, actor=actor, reason=reason)
            ended += 1
            drains.signal_if_drained(ctx, lost)  # it may have been a draining pool's last instance
        except Conflict:
            logger.info("instance already ended", instance_id=instance.id, worker_id=worker.id)
    return ended
