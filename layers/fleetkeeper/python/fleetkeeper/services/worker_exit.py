"""Ending a worker whose machine is gone: the worker, its instances and its open drain, in that order."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fleetkeeper.domain.errors import Unavailable
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, Worker
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services import drain_hooks, drains, instances

if TYPE_CHECKING:
    from fleetkeeper.services.context import Context

# The reason written on instances that were running on a machine that disappeared.
WORKER_LOST = "worker_lost"
# ... and on a machine that EC2 stopped outside fleetkeeper (console, spot stop).
WORKER_STOPPED = "worker_stopped"
# Sweeps over a gone worker's active instances before the rest is left to the next caller (a retry of
# the event, the reconciler's finish_retirement); each sweep retries its lost races itself.
MAX_SWEEPS = 3
METRIC_INSTANCES_LEFT_ACTIVE = "InstancesLeftActiveOnGoneWorker"


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
    """End every instance still active on a worker that is gone; returns how many this call ended.

    A lost race is not an end: an instance whose version moved (a state report) is read again and ended
    while it is still active. The worker's own list of active instances is read again after each sweep,
    until it is empty; on a worker that is no longer RUNNING or DRAINING nothing can add to it (placements
    need RUNNING, state reports RUNNING or DRAINING), so the sweeps converge.
    """
    ended = 0
    for _ in range(MAX_SWEEPS):
        active = ctx.store.active_instances_of(worker.id)
        if not active:
            return ended
        for instance in active:
            lost = instances.end_active_instance(
                ctx, instance, InstanceState.TERMINATED, actor=actor, reason=reason
            )
            if lost is None:
                logger.info("instance already ended", instance_id=instance.id, worker_id=worker.id)
                continue
            ended += 1
            drains.signal_if_drained(ctx, lost)  # it may have been a draining pool's last instance
    left = ctx.store.active_instances_of(worker.id)
    if not left:
        return ended
    metrics.add_metric(name=METRIC_INSTANCES_LEFT_ACTIVE, unit="Count", value=len(left))
    raise Unavailable(
        "end_lost_instances",
        f"{len(left)} instance(s) of worker {worker.id} still active after {MAX_SWEEPS} sweeps",
    )
