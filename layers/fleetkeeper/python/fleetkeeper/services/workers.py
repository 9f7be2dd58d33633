"""Creating workers and moving them through their lifecycle."""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Any

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.errors import Conflict, InvalidInput, PoolNotActive
from fleetkeeper.domain.lifecycle import Cause, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Owner, Worker, new_id
from fleetkeeper.services import lead_time
from fleetkeeper.services.context import Context
from fleetkeeper.services.worker_exit import finish_retirement, retire_worker
from fleetkeeper.store.repository import FleetStore


def create_worker(
    store: FleetStore,
    *,
    template: str,
    region: str,
    pool: str | None = None,
    actor: str,
    worker_id: str | None = None,
    regions: Collection[str] | None = None,
    pinned_image_id: str | None = None,
    pinned_instance_type: str | None = None,
    owner: Owner | None = None,
    desired_status: WorkerStatus | None = None,
    reason: str | None = None,
) -> Worker:
    """The one door for new workers: a new PENDING worker of a known template, in a known pool that is
    ACTIVE (PoolNotActive, 409, otherwise; checked again by the write itself); the reconciler launches
    it (from `pinned_image_id` and as `pinned_instance_type` when given, else as the template says).
    `owner` holds it for whoever made it (a rollout's replacement), so nothing else disrupts it.
    A pool with a capacity policy takes it only below its `max_workers` (PoolFull, 409, checked by the
    write on the pool's exact member count); `desired_status` STOPPED makes a warm worker.

    `regions` are those the stage manages (settings.regions): a worker anywhere else would stay PENDING
    for ever, its launch refused every cycle (on AWS the role may only launch in those regions)."""
    if regions is not None and region not in regions:
        managed = ", ".join(sorted(regions))
        raise InvalidInput("region", f"'{region}' is not a region this stage manages; it manages {managed}")
    known_template = store.find_template(template)
    if known_template is None:
        raise InvalidInput("template", f"unknown template '{template}'")
    max_members: int | None = None
    if pool is not None:
        found = store.find_pool(pool)
        if found is None:
            raise InvalidInput("pool", f"unknown pool '{pool}'")
        if found.status != PoolStatus.ACTIVE:
            raise PoolNotActive(pool, str(found.status))
        max_members = found.capacity.max_workers
    worker = Worker(
        id=worker_id or new_id("w"),
        template=template,
        region=region,
        pool=pool,
        status=WorkerStatus.PENDING,
        capacity=known_template.capacity,
        pinned_image_id=pinned_image_id,
        pinned_instance_type=pinned_instance_type,
        owner=owner,
        desired_status=desired_status,
    )
    return store.create_worker(worker, actor=actor, reason=reason, active_pool=True, max_members=max_members)


def set_desired_status(store: FleetStore, worker_id: str, desired: WorkerStatus, *, actor: str) -> Worker:
    """Record what the operator wants; the reconciler moves the worker there."""
    return _update_live_worker(
        store,
        worker_id,
        {"desired_status": desired},
        actor=actor,
        action="WorkerDesiredStatusSet",
        reason=f"desired {desired}",
        refusal="it has no future",
    )


def set_do_not_disrupt_until(
    store: FleetStore, worker_id: str, until: datetime | None, *, actor: str
) -> Worker:
    """Protect the worker from scale-down until `until` (None lifts it); it lapses by itself."""
    return _update_live_worker(
        store,
        worker_id,
        {"do_not_disrupt_until": until},
        actor=actor,
        action="WorkerDoNotDisruptSet",
        reason=f"do not disrupt until {until.isoformat()}" if until else "do-not-disrupt lifted",
        refusal="nothing to protect",
    )


def _update_live_worker(
    store: FleetStore,
    worker_id: str,
    changes: dict[str, Any],
    *,
    actor: str,
    action: str,
    reason: str,
    refusal: str,
) -> Worker:
    """An operator's change to a worker that is not TERMINATED (409 saying `refusal` if it is), written
    on the worker's version and retried on a fresh read when another write came first."""

    def update() -> Worker:
        worker = store.get_worker(worker_id)
        if worker.status == WorkerStatus.TERMINATED:
            raise Conflict("worker", worker.id, worker.status, f"worker {worker.id} is TERMINATED; {refusal}")
        return store.update_worker(worker, changes, actor=actor, action=action, reason=reason)

    return retry_conflicts(update)


def record_observed_status(
    ctx: Context,
    worker_id: str,
    status: WorkerStatus,
    *,
    actor: str,
    reason: str | None = None,
    terminated_by: str | None = None,
) -> Worker:
    """Apply a status that EC2 (or tooling reading EC2) observed, e.g. an orphan found terminated.

    A TERMINATED worker keeps its record (soft delete) with who and why; its active instances end with
    reason worker_lost and an open drain is closed, so nothing waits on a machine that is gone.
    """

    def apply() -> Worker:
        worker = ctx.store.get_worker(worker_id)
        if worker.status == status:
            # A repeat is how a retirement cut short gets finished: both of its steps are idempotent.
            finish_retirement(ctx, worker, actor=actor)
            return worker
        if status == WorkerStatus.TERMINATED:
            changes = {"terminated_by": terminated_by} if terminated_by else None
            return retire_worker(
                ctx,
                worker,
                cause=Cause.EC2,
                actor=actor,
                reason=reason or "worker terminated",
                changes=changes,
            )
        moved = ctx.store.transition_worker(
            worker, status, cause=Cause.EC2, actor=actor, reason=reason, changes={"status_reason": reason}
        )
        lead_time.record(ctx, worker, moved)
        return moved

    retry_conflicts(apply)
    return ctx.store.get_worker(worker_id)
