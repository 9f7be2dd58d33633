"""Instance state changes reported by workloads, including retries on draining workers."""

from __future__ import annotations

from collections.abc import Callable

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.lifecycle import ACTIVE_INSTANCE_STATES, InstanceState, WorkerStatus
from fleetkeeper.domain.models import Instance
from fleetkeeper.observability import metrics
from fleetkeeper.services import drains
from fleetkeeper.services.context import Context

# An instance that fails on a draining worker is retried there up to this many times.
MAX_RETRIES_ON_DRAINING_WORKER = 3
# A state report keeps an instance alive only on a worker that can still run it; on a worker that is
# stopping or gone it is refused, so it can never resurrect an instance a retirement is ending.
REPORTING_WORKER_STATUSES = frozenset({WorkerStatus.RUNNING, WorkerStatus.DRAINING})

_Write = Callable[[Instance], Instance]


def change_instance_state(
    ctx: Context, instance_id: str, state: InstanceState, *, actor: str, reason: str | None = None
) -> Instance:
    """Apply a reported state; ending one frees its slot and may complete a waiting drain."""
    if state == InstanceState.SCHEDULED:
        raise InvalidInput(
            "state", "SCHEDULED is where instances start; report INSTANTIATING, RUNNING or an end"
        )
    instance = ctx.store.get_instance(instance_id)
    if state == InstanceState.FAILED:
        return _handle_failure(ctx, instance, actor=actor, reason=reason)
    if state in ACTIVE_INSTANCE_STATES:
        return _on_fresh_read(
            ctx,
            instance,
            lambda current: ctx.store.update_instance(
                current,
                {"state": state, "reason": reason},
                actor=actor,
                action=f"Instance{state.title()}",
                reason=reason,
                worker_in=REPORTING_WORKER_STATUSES,
            ),
        )
    return end_instance(ctx, instance, state, actor=actor, reason=reason)


def end_instance(
    ctx: Context, instance: Instance, state: InstanceState, *, actor: str, reason: str | None = None
) -> Instance:
    """End the instance; a lost race with a state report is retried on a fresh read.

    An instance that ended meanwhile is refused by the lifecycle table (IllegalTransition).
    """
    ended = _on_fresh_read(
        ctx, instance, lambda current: ctx.store.end_instance(current, state, actor=actor, reason=reason)
    )
    drains.signal_if_drained(ctx, ended)
    return ended


def end_active_instance(
    ctx: Context,
    instance: Instance,
    state: InstanceState,
    *,
    actor: str,
    reason: str | None = None,
    drain_generation: int | None = None,
) -> Instance | None:
    """End the instance if it is still active; None when it really is no longer active.

    A version that moved (a state report came in) is not an end: the instance is read again and the
    end retried while it is still active. With `drain_generation`, the end is conditional on that drain
    still running on the worker (DrainNoLongerActive otherwise). The caller signals a waiting drain.
    """
    first = True

    def attempt() -> Instance | None:
        nonlocal first
        current = instance if first else ctx.store.find_instance(instance.id)
        first = False
        if current is None or not current.is_active:
            return None
        return ctx.store.end_instance(
            current, state, actor=actor, reason=reason, drain_generation=drain_generation
        )

    return retry_conflicts(attempt)


def _on_fresh_read(ctx: Context, instance: Instance, write: _Write) -> Instance:
    """Run `write` on the instance as read, then on a fresh read after each lost race (bounded)."""
    first = True

    def attempt() -> Instance:
        nonlocal first
        current = instance if first else ctx.store.get_instance(instance.id)
        first = False
        return write(current)

    return retry_conflicts(attempt)


def _handle_failure(ctx: Context, instance: Instance, *, actor: str, reason: str | None) -> Instance:
    if instance.state == InstanceState.WAITING_FOR_CAPACITY:  # no worker to retry it on
        return end_instance(ctx, instance, InstanceState.FAILED, actor=actor, reason=reason)
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
    # It is already scheduled on this worker and keeps its slot: run it again in place, but only while
    # the worker still drains (a retry must not outlive a stop that committed meanwhile).
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
        worker_in={WorkerStatus.DRAINING},
    )
