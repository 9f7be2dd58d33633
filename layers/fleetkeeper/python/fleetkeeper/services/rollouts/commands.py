"""Rollouts: start one (or plan it with dry_run), read them, pause, resume, cancel and roll them back
(docs/rollouts.md). The reconcile cycle advances the running ones (services/rollouts/engine.py) and the
rollbacks (services/rollouts/rollbacks.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, Field

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.errors import InvalidInput, PoolNotActive, StaleWrite, listed
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Worker, new_id, utcnow
from fleetkeeper.domain.rollouts import (
    MAX_ROLLOUT_WORKERS,
    Blocked,
    Rollout,
    RolloutCovered,
    RolloutRequest,
    RolloutStatus,
    RolloutStrategy,
    WorkerPhase,
    check_move,
    event_detail,
    percent_done,
    plan_waves,
    resolve_max_unavailable,
)
from fleetkeeper.observability import metrics
from fleetkeeper.services import admission
from fleetkeeper.services.context import Context
from fleetkeeper.services.rollouts.step import CLAIMS_PER_STEP, Step
from fleetkeeper.store.rollouts import RolloutStore
from fleetkeeper.store.table import Page

# The audit events that also count as EMF metrics of the same name (infra/metrics.py, the dashboard's
# "Rollouts" widget): a rollout's start and its ends, wherever they happen (here or in the engine).
METRIC_EVENTS: Final = (
    "RolloutStarted",
    "RolloutWaveStarted",
    "RolloutCheckpointReached",
    "RolloutSucceeded",
    "RolloutFailed",
    "RolloutCancelled",
    "RolloutRollbackStarted",
    "RolloutRolledBack",
)


# A dry run lists the ids of its first waves up to this many workers; the waves after answer their count:
# 10,000 ids would make a body of hundreds of KB nobody reads.
PLAN_LISTED_WORKERS: Final = 1000


def store_of(ctx: Context) -> RolloutStore:
    return ctx.rollouts


class RollbackView(BaseModel):
    """Where a rollback stands."""

    total: int = Field(description="the workers of the waves the rollout reached")
    rolled_back: int = Field(description="workers whose replacement is undone")
    skipped: int = Field(
        description="workers with nothing to undo, or whose replacement's drain was cancelled"
    )
    in_progress: int
    wave: int
    waves: int
    started_by: str | None
    started_at: datetime | None
    reason: str | None

    @classmethod
    def of(cls, rollout: Rollout) -> RollbackView:
        done = {WorkerPhase.DONE, WorkerPhase.SKIPPED}
        return cls(
            total=rollout.rollback_total,
            rolled_back=rollout.rolled_back,
            skipped=rollout.rollback_skipped,
            in_progress=sum(1 for p in rollout.rollback_progress.values() if p.phase not in done),
            wave=rollout.rollback_wave,
            waves=rollout.rollback_wave_count,
            started_by=rollout.rollback_started_by,
            started_at=rollout.rollback_started_at,
            reason=rollout.rollback_reason,
        )


class RolloutView(BaseModel):
    """A rollout as the API shows it."""

    id: str
    status: RolloutStatus
    template: str | None
    pool: str | None
    strategy: RolloutStrategy
    max_unavailable: int = Field(description="resolved against the scope's size at the start")
    total: int = Field(description="the workers the rollout covers")
    replaced: int
    in_progress: int = Field(description="workers of the current wave not finished yet")
    remaining: int = Field(description="workers no wave has reached yet")
    skipped: int = Field(description="workers gone or not drainable when their wave came")
    percent: int = Field(description="the share of the scope replaced, rounded down")
    wave: int = Field(description="the wave in progress, from 0")
    waves: int
    checkpoint: int | None = Field(description="the checkpoint it waits at, if paused at one")
    checkpoints: list[int]
    replace: bool
    started_by: str
    reason: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    blocked: Blocked | None = Field(description="why it is not progressing now; null when it is")
    rollback_on_alarms: list[str]
    rollback: RollbackView | None = Field(description="the rollback, once one has started")

    @classmethod
    def of(cls, rollout: Rollout) -> RolloutView:
        return cls(
            id=rollout.id,
            status=rollout.status,
            template=rollout.template,
            pool=rollout.pool,
            strategy=rollout.strategy,
            max_unavailable=rollout.max_unavailable,
            total=rollout.total,
            replaced=rollout.replaced,
            in_progress=rollout.in_progress,
            remaining=rollout.remaining,
            skipped=rollout.skipped,
            percent=percent_done(rollout.replaced, rollout.total),
            wave=rollout.wave,
            waves=rollout.wave_count,
            checkpoint=rollout.paused_at_checkpoint,
            checkpoints=rollout.checkpoints,
            replace=rollout.replace,
            started_by=rollout.started_by,
            reason=rollout.reason,
            created_at=rollout.created_at,
            updated_at=rollout.updated_at,
            finished_at=rollout.finished_at,
            blocked=rollout.blocked,
            rollback_on_alarms=rollout.rollback_on_alarms,
            rollback=None if rollout.rollback_through_wave is None else RollbackView.of(rollout),
        )


class RolloutWave(BaseModel):
    index: int
    count: int = Field(description="the workers of the wave")
    worker_ids: list[str] | None = Field(
        description=f"the wave's workers, sorted; null past the first {PLAN_LISTED_WORKERS} workers of the "
        "plan (the waves after those answer their count only)"
    )


class RolloutPlan(BaseModel):
    """dry_run: the rollout that would start; nothing was written."""

    template: str | None
    pool: str | None
    strategy: RolloutStrategy
    max_unavailable: int
    total: int
    waves: list[RolloutWave]
    checkpoints: list[int]


def _scope(ctx: Context, request: RolloutRequest) -> list[str]:
    """The RUNNING workers the request covers, sorted; InvalidInput naming the field that is wrong."""
    return _read_scope(ctx, request)[0]


def _read_scope(ctx: Context, request: RolloutRequest) -> tuple[list[str], list[Worker]]:
    """The scope's ids, sorted, and the workers read for it (those named by `worker_ids`; none for a
    template's, which the index lists)."""
    if request.worker_ids is not None:
        if request.template is not None or request.pool is not None:
            field = "template" if request.template is not None else "pool"
            raise InvalidInput(field, "name either worker_ids or a template (and pool), not both")
        found = {w.id: w for w in ctx.store.get_workers(request.worker_ids)}
        unknown = [w for w in request.worker_ids if w not in found]
        if unknown:
            raise InvalidInput("worker_ids", f"unknown workers: {listed(unknown, 10)}")
        not_running = [w for w in request.worker_ids if found[w].status != WorkerStatus.RUNNING]
        if not_running:
            first = found[not_running[0]]
            raise InvalidInput(
                "worker_ids", f"worker {first.id} is {first.status}; a rollout replaces RUNNING workers"
            )
        return sorted(request.worker_ids), list(found.values())
    if request.template is None:
        raise InvalidInput("template", "required unless worker_ids names the workers")
    if ctx.store.find_template(request.template) is None:
        raise InvalidInput("template", f"unknown template '{request.template}'")
    if request.pool is not None and ctx.store.find_pool(request.pool) is None:
        raise InvalidInput("pool", f"unknown pool '{request.pool}'")
    found_ids = sorted(
        {w.id for w in ctx.store.placement_candidates(template=request.template, pool=request.pool)}
    )
    field = "pool" if request.pool is not None else "template"
    if not found_ids:
        raise InvalidInput(field, "no RUNNING worker of this template (in this pool) to replace")
    if len(found_ids) > MAX_ROLLOUT_WORKERS:
        raise InvalidInput(
            field,
            f"{len(found_ids)} workers in scope; a rollout covers at most {MAX_ROLLOUT_WORKERS}: narrow it "
            "with pool or worker_ids",
        )
    return found_ids, []


def _refuse_covered(ctx: Context, request: RolloutRequest, read: list[Worker]) -> None:
    """409 for a start that an active rollout covers: its pool is not active, an active rollout of the
    same template covers the same pool, or one already holds a worker named. A first look: the engine
    claims each worker through the door, which holds the rule (a worker two rollouts reach is the one's
    that claims it first)."""
    door = admission.Door(ctx)
    pools = {request.pool} if request.pool is not None else {w.pool for w in read}
    for name in sorted(p for p in pools if p is not None):
        pool = ctx.store.find_pool(name)
        if pool is not None and pool.status != PoolStatus.ACTIVE:
            raise PoolNotActive(name, str(pool.status))
    for worker in read:
        holder = door.holder(worker)
        if holder is not None and holder.rollout_id is not None:
            found = store_of(ctx).find(holder.rollout_id)
            raise RolloutCovered(
                holder.rollout_id, str(found.status) if found else None, f"worker {worker.id}", worker.id
            )
    if request.template is None:
        return
    for other in store_of(ctx).active():
        if other.template == request.template and (
            other.pool is None or request.pool is None or other.pool == request.pool
        ):
            where = f" in pool {request.pool}" if request.pool else ""
            raise RolloutCovered(other.id, str(other.status), f"template {request.template}{where}")


def plan(ctx: Context, request: RolloutRequest) -> RolloutPlan:
    workers = _scope(ctx, request)
    limit = resolve_max_unavailable(request.max_unavailable, len(workers))
    return RolloutPlan(
        template=request.template,
        pool=request.pool,
        strategy=request.strategy,
        max_unavailable=limit,
        total=len(workers),
        waves=[
            RolloutWave(
                index=i,
                count=len(wave),
                worker_ids=wave if i * limit + len(wave) <= max(PLAN_LISTED_WORKERS, limit) else None,
            )
            for i, wave in enumerate(plan_waves(workers, limit))
        ],
        checkpoints=request.checkpoints,
    )


def start(ctx: Context, request: RolloutRequest, *, actor: str, claim: int = CLAIMS_PER_STEP) -> Rollout:
    """Store a RUNNING rollout over the request's scope and claim its first `claim` workers as its own
    (the engine claims the rest, a step's worth a cycle: services/rollouts/step.py); 409 when its pool is
    not active or an active rollout covers it."""
    workers, read = _read_scope(ctx, request)
    _refuse_covered(ctx, request, read)
    now = utcnow()
    rollout = Rollout(
        id=new_id("ro"),
        template=request.template,
        pool=request.pool,
        total=len(workers),
        max_unavailable=resolve_max_unavailable(request.max_unavailable, len(workers)),
        max_unavailable_requested=request.max_unavailable,
        strategy=request.strategy,
        checkpoints=request.checkpoints,
        checkpoint_delay_seconds=request.checkpoint_delay_seconds,
        bake_seconds=request.bake_seconds,
        drain_timeout_seconds=request.drain_timeout_seconds,
        replace=request.replace,
        reason=request.reason,
        rollback_on_alarms=request.rollback_on_alarms,
        started_by=actor,
        created_at=now,
        updated_at=now,
    )
    stored = store_of(ctx).start(rollout, workers, actor=actor)
    emit(ctx, "RolloutStarted", stored, actor=actor)
    with admission.door(ctx, now) as door:
        first = Step(ctx, stored, now, door)
        first.claim_ahead(stop=claim)
    # What is claimed is recorded for the engine; a start that loses this write to a fast operator
    # (a pause, a cancel) leaves the claims to be found again by its steps.
    with contextlib.suppress(StaleWrite):
        stored = store_of(ctx).save(stored, {"claimed": first.claimed}, actor=actor)
    return stored


def get(ctx: Context, rollout_id: str) -> Rollout:
    return store_of(ctx).get(rollout_id)


def page(ctx: Context, *, limit: int, next_token: str | None) -> Page[Rollout]:
    return store_of(ctx).page(limit=limit, next_token=next_token)


def emit(ctx: Context, detail_type: str, rollout: Rollout, **extra: Any) -> None:
    """The audit event of a rollout's status change, and its metric when it has one."""
    ctx.audit.publish(detail_type, event_detail(rollout, **extra))
    if detail_type in METRIC_EVENTS:
        metrics.add_metric(name=detail_type, unit=MetricUnit.Count, value=1)


def _move(
    ctx: Context,
    rollout_id: str,
    target: RolloutStatus,
    *,
    actor: str,
    action: str,
    reason: str | None,
    changes: Sequence[tuple[str, Any]] = (),
) -> Rollout:
    def write() -> Rollout:
        current = store_of(ctx).get(rollout_id)
        check_move(current.id, current.status, target)
        now = utcnow()
        update: dict[str, Any] = {"status": target, **dict(changes)}
        if target == RolloutStatus.PAUSED:
            update |= {"paused_at": now}
            if current.paused_at_checkpoint is None:
                update["blocked"] = Blocked(reason="paused", detail=f"paused by {actor}", since=now)
        elif target == RolloutStatus.RUNNING:
            # A resume passes the checkpoint it waited at.
            passed = current.checkpoints_passed
            if current.paused_at_checkpoint is not None and current.paused_at_checkpoint not in passed:
                passed = [*passed, current.paused_at_checkpoint]
            update |= {
                "paused_at": None,
                "paused_at_checkpoint": None,
                "blocked": None,
                "checkpoints_passed": passed,
            }
        else:
            update |= {"finished_at": now, "blocked": None}
        return store_of(ctx).save(current, update, actor=actor, action=action, reason=reason)

    saved = retry_conflicts(write)
    emit(ctx, action, saved, actor=actor, reason=reason)
    return saved


def pause(ctx: Context, rollout_id: str, *, actor: str, reason: str | None = None) -> Rollout:
    return _move(ctx, rollout_id, RolloutStatus.PAUSED, actor=actor, action="RolloutPaused", reason=reason)


def resume(ctx: Context, rollout_id: str, *, actor: str, reason: str | None = None) -> Rollout:
    return _move(ctx, rollout_id, RolloutStatus.RUNNING, actor=actor, action="RolloutResumed", reason=reason)


def cancel(ctx: Context, rollout_id: str, *, actor: str, reason: str | None = None) -> Rollout:
    """No new wave starts; drains and replacements already started go on by themselves."""
    return _move(
        ctx, rollout_id, RolloutStatus.CANCELLED, actor=actor, action="RolloutCancelled", reason=reason
    )


def begin_rollback(ctx: Context, current: Rollout, *, actor: str, reason: str | None) -> Rollout:
    """Move a rollout read just now to ROLLING_BACK (409 naming its status unless it may; StaleWrite when
    it moved meanwhile); the reconcile cycle then undoes its replacements wave by wave."""
    check_move(current.id, current.status, RolloutStatus.ROLLING_BACK)
    now = utcnow()
    through = min(current.wave, current.wave_count - 1)
    changes: dict[str, Any] = {
        "status": RolloutStatus.ROLLING_BACK,
        "rollback_through_wave": through,
        "rollback_wave": 0,
        "rollback_progress": {},
        "rolled_back": 0,
        "rollback_skipped": 0,
        "rollback_started_at": now,
        "rollback_started_by": actor,
        "rollback_reason": reason,
        # The forward wave stops where it is: the rollback reads every worker as it is now.
        "progress": {},
        "paused_at": None,
        "paused_at_checkpoint": None,
        "finished_at": None,
        "blocked": None,
    }
    saved = store_of(ctx).save(current, changes, actor=actor, action="RolloutRollbackStarted", reason=reason)
    emit(ctx, "RolloutRollbackStarted", saved, actor=actor, reason=reason)
    return saved


def rollback(ctx: Context, rollout_id: str, *, actor: str, reason: str | None = None) -> Rollout:
    """Undo a rollout's replacements (from RUNNING, PAUSED, SUCCEEDED, FAILED or CANCELLED)."""
    return retry_conflicts(
        lambda: begin_rollback(ctx, store_of(ctx).get(rollout_id), actor=actor, reason=reason)
    )
