"""Repair: recording what the signals say about a worker's health, and replacing the workers that are
sick for longer than their pool tolerates (docs/repair.md; the rules are domain/repair.py).

The signals come from the EC2 events function (AWS Health scheduled changes), discovery's sweep of
DescribeInstanceStatus and of DescribeInstanceInformation (the SSM agents of the workers that use
operations), and the worker's agent (`POST /api/v1/workers/{id}/health`); each goes through
`record_health`, which writes only a change. The reconcile cycle then proposes the due repairs to the
door, surge-first, as expiry does (services/reconcile/repair.py): a voluntary disruption of reason
`repair`, counted by the pool's budgets and stopped by the pool's brake; a scheduled event passes the
brake, and from its latest start on is imposed (`scheduled_event`), so that neither the budgets nor
`do_not_disrupt` hold it back (domain/repair.plan_repair).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Final

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.admission import Ask, Imposed
from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.repair import RepairPlan, Signal, observe_all
from fleetkeeper.domain.sharding import Shard
from fleetkeeper.observability import logger
from fleetkeeper.services import admission
from fleetkeeper.services.context import Context
from fleetkeeper.services.stats import reconcile_scope

# Repairs are the reconciler's (services/reconcile/actions.ACTOR): it owns the worker from the admission
# to the drain.
REPAIR_ACTOR: Final = "reconciler"
# The owner reasons a repair writes (an admission ahead, then its drain).
_REPAIR_REASONS: Final = frozenset({str(DisruptionReason.REPAIR), str(Imposed.SCHEDULED_EVENT)})
# The note each reconcile cycle keeps in its own stats scope: the pools whose brake held a repair in
# that cycle, each with the brake's words. It is replaced whole every cycle, so it never outlives one.
BRAKE_NOTE: Final = "repair_blocked"


def blocked(ctx: Context, pool: str) -> str | None:
    """The brake's words on the pool as of each shard's last cycle, if it held a repair there."""
    count = ctx.settings.reconcile_shards
    for index in range(count):
        found = ctx.stats.read(reconcile_scope(Shard(index, count))).notes.get(BRAKE_NOTE, {}).get(pool)
        if found is not None:
            return found
    return None


def ask_for(plan: RepairPlan) -> Ask:
    """The door's question for a repair: imposed by AWS's date, or an ordinary `repair`."""
    reason = Imposed.SCHEDULED_EVENT if plan.imposed else DisruptionReason.REPAIR
    return Ask(reason, REPAIR_ACTOR, ahead=True)


def repairing(worker: Worker) -> bool:
    """Whether a repair owns the worker now: admitted ahead of its drain, or draining it."""
    owner = worker.owner
    return owner is not None and owner.actor == REPAIR_ACTOR and owner.reason in _REPAIR_REASONS


def record_health(
    ctx: Context, worker_id: str, signals: Sequence[Signal], *, actor: str, now: datetime | None = None
) -> Worker:
    """Fold the signals into the worker's health and write it when it changed; a repair admitted ahead
    whose worker is healthy again (its event cancelled, its report withdrawn) gives its place back
    before its drain starts. A TERMINATED worker has no health to record (Conflict)."""
    now = now or utcnow()

    def write() -> Worker:
        worker = ctx.store.get_worker(worker_id)
        if worker.status == WorkerStatus.TERMINATED:
            raise Conflict("worker", worker.id, worker.status, f"worker {worker.id} is TERMINATED")
        health = observe_all(worker.health, signals, now)
        if health == worker.health or health is None:
            return worker
        return ctx.store.update_worker(
            worker,
            {"health": health},
            actor=actor,
            action="WorkerHealthChanged",
            reason=f"{health.status} ({health.source}): {health.reason or '-'}"[:500],
        )

    worker = retry_conflicts(write)
    health, owner = worker.health, worker.owner
    if (
        health is not None
        and not health.unhealthy
        and worker.status == WorkerStatus.RUNNING
        and owner is not None
        and repairing(worker)
    ):
        scheduled = owner.reason == Imposed.SCHEDULED_EVENT
        reason = Imposed.SCHEDULED_EVENT if scheduled else DisruptionReason.REPAIR
        admission.Door(ctx, now).release(worker.id, Ask(reason, REPAIR_ACTOR, ahead=True))
        logger.info("repair ended before its drain: the worker is healthy again", worker_id=worker.id)
        worker = ctx.store.get_worker(worker.id)
    return worker
