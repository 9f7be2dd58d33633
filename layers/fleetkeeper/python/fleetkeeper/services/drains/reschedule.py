"""Rescheduling: a worker drain moves the worker's SCHEDULED instances to other workers with room.

An instance that has not started yet (SCHEDULED: placed, not instantiating) loses nothing by moving, so
the drain need not wait for its timeslot. Targets are chosen as placement chooses them
(services/placement.py, domain/placement.py): RUNNING workers of the same pool and template, packed.
Each move is one transaction (store/slots.py `move_instance`) whose conditions are the truth; the
candidate list is read through indexes and may lag.

The begin step of the drain workflow runs this, and Step Functions retries that step, so it must be safe
to run again after dying half-way: it reads the worker's active instances afresh, and an instance moved
by the earlier attempt is simply no longer on the worker. See docs/drains.md, "Rescheduling".
"""

from __future__ import annotations

from fleetkeeper.domain.errors import (
    Conflict,
    DrainCancelled,
    DrainNoLongerActive,
    NotFound,
    StaleWrite,
    Unavailable,
)
from fleetkeeper.domain.lifecycle import InstanceState, PoolStatus
from fleetkeeper.domain.models import Instance, Worker, WorkerSummary
from fleetkeeper.domain.placement import PlacementStrategy, rank_candidates
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains._shared import emit
from fleetkeeper.services.drains.contract import WORKFLOW_ACTOR
from fleetkeeper.services.placement import candidate_workers

# Moves tried per instance: each lost race (the target filled up, the instance changed) re-reads what it
# lost to before the next try. After that the instance stays and the drain waits for it.
MOVE_TRIES = 4
# Packing fills the fullest workers first, so idle workers stay idle and scale-down can take them.
STRATEGY = PlacementStrategy.PACK


def scheduled_instances(ctx: Context, worker: Worker) -> list[Instance]:
    """The worker's SCHEDULED instances, read exactly (the worker item names them), in id order."""
    return [i for i in ctx.store.active_instances_of(worker.id) if i.state == InstanceState.SCHEDULED]


def targets_for(ctx: Context, worker: Worker) -> dict[str, WorkerSummary]:
    """Workers that may take the draining worker's instances: same pool (or none) and template.

    None while the pool is closed (a pool drain): every move would be refused by the pool's condition.
    """
    if worker.pool:
        pool = ctx.store.find_pool(worker.pool)
        if pool is None or pool.status != PoolStatus.ACTIVE:
            return {}
    found = [
        w
        for w in candidate_workers(ctx.store, template=worker.template, pool=worker.pool)
        if w.id != worker.id and w.pool == worker.pool
    ]
    # A sick worker takes no moved instance either; the move's condition refuses one that fell sick since.
    sick = ctx.store.unhealthy_workers([w.id for w in found]) if found else set()
    return {w.id: w for w in found if w.id not in sick}


def plan_moves(ctx: Context, worker: Worker) -> list[Instance]:
    """The instances a drain starting now would move (dry run): as many SCHEDULED as there is room."""
    scheduled = scheduled_instances(ctx, worker)
    if not scheduled:
        return []
    room = sum(w.free_slots for w in rank_candidates(targets_for(ctx, worker).values(), STRATEGY))
    return scheduled[:room]


def reschedule(ctx: Context, worker: Worker, generation: int) -> int:
    """Move what can move off `worker` (DRAINING for `generation`); returns how many moved in this call.

    Raises DrainCancelled as soon as a move finds the drain over (cancelled, superseded): not one more
    instance may leave a worker that is back in service.
    """
    scheduled = scheduled_instances(ctx, worker)
    if not scheduled:
        return 0
    targets = targets_for(ctx, worker)
    moved = 0
    for instance in scheduled:
        if _move(ctx, instance, worker.id, targets, generation):
            moved += 1
    logger.info(
        "drain rescheduled instances",
        extra={"worker_id": worker.id, "moved": moved, "stayed": len(scheduled) - moved},
    )
    return moved


def _move(
    ctx: Context, instance: Instance, source_id: str, targets: dict[str, WorkerSummary], generation: int
) -> bool:
    """Move one instance to the best target, re-reading after each lost race; False if it stays."""
    current = instance
    for _ in range(MOVE_TRIES):
        ranked = rank_candidates(targets.values(), STRATEGY)
        if not ranked:
            return False
        target = ranked[0]
        try:
            moved = ctx.store.move_instance(
                current, target, actor=WORKFLOW_ACTOR, drain_generation=generation
            )
        except DrainNoLongerActive as over:
            raise DrainCancelled(
                f"drain {generation} of worker {source_id} ended while moving instances: {over.message}"
            ) from over
        except StaleWrite:
            # The instance changed (it started, ended, or an earlier attempt moved it): read it again.
            fresh = ctx.store.find_instance(current.id)
            if fresh is None or fresh.state != InstanceState.SCHEDULED or fresh.worker_id != source_id:
                return False
            current = fresh
        except Conflict:
            # The target filled up, left RUNNING or its pool closed: judge it again on its item.
            fresh_target = ctx.store.find_worker(target.id)
            if fresh_target is None or fresh_target == target:
                targets.pop(target.id, None)
            else:
                targets[target.id] = fresh_target
        except NotFound as gone:
            # The target worker was deleted since it was listed (or the instance itself is gone).
            if gone.kind != "worker":
                return False
            targets.pop(target.id, None)
        except Unavailable:
            # Conflicts or throttling that outlasted the store's backoff. The transaction is all or
            # nothing, so the instance is whole wherever it is; the drain's `moved_instances`, written
            # with each move, stays exact even if a lost answer hid a move from us. The drain waits.
            logger.warning(
                "instance not moved: the table stayed unavailable",
                extra={"instance_id": instance.id, "worker_id": source_id},
            )
            return False
        else:
            targets[target.id] = target.model_copy(update={"active_instances": target.active_instances + 1})
            emit(
                ctx,
                "InstanceMoved",
                {
                    "instance_id": moved.id,
                    "from_worker_id": source_id,
                    "worker_id": target.id,
                    "generation": generation,
                },
                "InstanceMoved",
            )
            return True
    return False
