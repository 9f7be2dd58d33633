"""Instance state changes reported by workloads, including retries on draining workers (seed 000)."""

from __future__ import annotations

from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.lifecycle import ACTIVE_INSTANCE_STATES, InstanceState, WorkerStatus
from fleetkeeper.domain.models import Instance
from fleetkeeper.observability import metrics
from fleetkeeper.services import drains
from fleetkeeper.services.context import Context

# Seed 000: an instance that fails on a draining worker is retried there up to this many times.
MAX_RETRIES_ON_DRAINING_WORKER = 3


def change_instance_state(
    ctx: Context, instance_id: str, state: InstanceState, *, actor: str, reason: str | None = None
) -> Instance:
    """Apply a reported state; ending one frees its slot and may complete a waiting drain."""
    instance = ctx.store.get_instance(instance_id)
    if state == InstanceState.SCHEDULED:
        raise InvalidInput(
            "state", "SCHEDULED is where instances start; report INSTANTIATING, RUNNING or an end"
        )
    if state == InstanceState.FAILED:
        return _handle_failure(ctx, instance, actor=actor, reason=reason)
    if state in ACTIVE_INSTANCE_STATES:
        return ctx.store.update_instance(
            instance,
            {"state": state, "reason": reason},
            actor=actor,
            action=f"Instance{state.title()}",
            reason=reason,
        )
    return end_instance(ctx, instance, state, actor=actor, reason=reason)


def end_instance(
    ctx: Context, instance: Instance, state: InstanceState, *, actor: str, reason: str | None = None
) -> Instance:
    ended = ctx.store.end_instance(instance, state, actor=actor, reason=reason)
    drains.signal_if_drained(ctx, ended)
    return ended


def _handle_failure(ctx: Context, instance: Instance, *, actor: str, reason: str | None) -> Instance:
    worker = ctx.store.get_worker(instance.worker_id)
    if worker.status == WorkerStatus.RUNNING:
        return end_instance(ctx, instance, InstanceState.FAILED, actor=actor, reason=reason)
    if worker.status != WorkerStatus.DRAINING:
        return end_instance(
            ctx, instance, InstanceState.TERMINATED, actor=actor, reason="worker_stopped_during_retry"
        )
    if instance.retry_count >= MAX_RETRIES_ON_DRAINING_WORKER:
        return end_instance(
            ctx, instance, InstanceState.TERMINATED, actor=actor, reason="max_retries_exceeded"
        )
    # It is already scheduled on this worker and keeps its slot: run it again in place.
    metrics.add_metric(name="InstanceRetriedOnDrainingWorker", unit="Count", value=1)
    return ctx.store.update_instance(
        instance,
        {
            "state": InstanceState.INSTANTIATING,
            "retry_count": instance.retry_count + 1,
            "reason": f"retry {instance.retry_count + 1} after failure: {reason or 'unspecified'}",
        },
        actor=actor,
        action="InstanceRetried",
        reason=reason,
    )
