"""A pool's disruption budgets, seen from outside: what they say now (GET
/api/v1/pools/{name}/disruption), what an operator's drain goes beyond, and what the door for disruption
holds back (services/admission.py decides; this module only shows).

The counts are the door's own (store/disruption.py): `in_use` is the pool's workers with a counted
owner, exact, the same number a rollout's `blocked` quotes.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetkeeper.domain.admission import counted
from fleetkeeper.domain.disruption import (
    ALL_REASONS,
    DISRUPTING,
    DisruptionReason,
    Waiting,
    assess,
    blocked_until,
    budget_states,
    exceeded,
    next_change,
    still_waiting,
)
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Pool, utcnow
from fleetkeeper.services import repair
from fleetkeeper.services.admission import Door, stage_default
from fleetkeeper.services.context import Context

# The disruptions listed by id in the view; the count is always exact.
MAX_LISTED = 100


class BudgetView(BaseModel):
    """One budget as configured, and what it says now."""

    index: int = Field(description="its place in the pool's list, which refusals name")
    max: int | str
    reasons: list[DisruptionReason] = Field(description="the reasons it holds back (all when left out)")
    schedule: str | None
    duration: str | None
    timezone: str | None
    active: bool = Field(description="whether it applies now")
    allowed: int = Field(description="how many of the pool's members it lets be disrupted at once")
    until: datetime | None = Field(description="when it stops applying; null: it always applies, or not now")
    next_start: datetime | None = Field(description="when it applies next, if not now")


class ReasonView(BaseModel):
    """What the budgets say about one reason now."""

    reason: DisruptionReason
    governed_by: Literal["pool", "stage_default"] = Field(
        description="pool: some budget of the pool applies; stage_default: none does, MAX_CONCURRENT_DRAINS "
        "bounds its drains fleet-wide"
    )
    applying: list[int] = Field(description="the indexes of the budgets that apply to it now")
    limiting: int | None = Field(description="the most restrictive of them")
    allowed: int | None
    in_use: int
    available: int | None
    blocked_until: datetime | None = Field(
        description="when blocked, the first window change that lets one more through; null: when "
        "disruptions in progress end"
    )


class StageDefaultView(BaseModel):
    """MAX_CONCURRENT_DRAINS: the drains allowed fleet-wide for reasons no pool budget governs."""

    max: str
    allowed: int
    in_use: int = Field(description="workers being disrupted fleet-wide")


class PoolDisruptionView(BaseModel):
    """Why a pool's voluntary disruptions go ahead or wait (docs/disruption.md)."""

    model_config = ConfigDict(extra="forbid")

    pool: str
    at: datetime
    members: int = Field(description="RUNNING workers and those being disrupted: the base of a percentage")
    in_use: int = Field(
        description="members being disrupted now, whatever the cause, with those admitted ahead of their "
        "drain (a surge's old worker while its replacement launches)"
    )
    disrupting: list[str] = Field(
        description=f"the ids of those draining, stopping or terminating (at most {MAX_LISTED})"
    )
    budgets: list[BudgetView]
    reasons: list[ReasonView]
    stage_default: StageDefaultView
    next_change: datetime | None = Field(description="when a budget next starts or stops applying")
    waiting: list[Waiting] = Field(
        description="voluntary disruptions the door held back lately, whatever their reason, newest first"
    )
    repair: RepairView


class RepairView(BaseModel):
    """The pool's repair brake as the reconciler's last cycle judged it (docs/repair.md)."""

    max_unhealthy_percent: int
    blocked: str | None = Field(
        description="when the brake held a repair of the pool in the last reconcile cycle: `repair brake, "
        "N of M unhealthy`; null: it held none"
    )


class BudgetExceeded(BaseModel):
    """The budget an operator's drain goes beyond. Nothing refuses the drain; voluntary disruptions of
    the pool wait until it is within its budgets again."""

    pool: str
    budget: int = Field(description="the budget's index in the pool's list")
    max: int | str
    allowed: int
    in_use: int = Field(description="the pool's members being disrupted, this drain included")
    until: datetime | None = Field(description="when the budget stops applying; null: it always applies")


def pool_view(ctx: Context, name: str, now: datetime | None = None) -> PoolDisruptionView:
    """The pool's budgets, which apply now and until when, what they allow and what is in use, and
    what the door holds back."""
    now = now or utcnow()
    pool = ctx.store.get_pool(name)
    state = Door(ctx, now).state(name)
    policy = pool.disruption
    states = budget_states(policy, now, state.members)
    default = stage_default(ctx)
    members = list(ctx.store.workers_in_pool(name))
    reasons = []
    for reason in ALL_REASONS:
        found = assess(policy, reason, now, members=state.members, in_use=state.in_use)
        blocked = None
        if not found.admits:
            blocked = blocked_until(policy, reason, now, members=state.members, in_use=state.in_use)
        reasons.append(
            ReasonView(
                reason=reason,
                governed_by="pool" if found.allowed is not None else "stage_default",
                applying=list(found.applying),
                limiting=found.limiting,
                allowed=found.allowed,
                in_use=state.in_use,
                available=found.available,
                blocked_until=blocked,
            )
        )
    running = {w.id for w in members if w.status == WorkerStatus.RUNNING}
    waiting = [
        w
        for w in still_waiting(ctx.waiting.read(name).entries, now)
        # Once admitted (or gone), a worker no longer waits, whatever its last refusal said.
        if w.worker_id in running
    ]
    return PoolDisruptionView(
        pool=name,
        at=now,
        members=state.members,
        in_use=state.in_use,
        disrupting=sorted(w.id for w in members if w.status in DISRUPTING)[:MAX_LISTED],
        budgets=[
            BudgetView(
                index=s.index,
                max=s.budget.max,
                reasons=list(s.budget.reasons or ALL_REASONS),
                schedule=s.budget.schedule,
                duration=s.budget.duration,
                timezone=s.budget.timezone,
                active=s.active,
                allowed=s.allowed,
                until=s.window.until,
                next_start=s.window.next_start,
            )
            for s in states
        ],
        reasons=reasons,
        stage_default=StageDefaultView(
            max=ctx.settings.max_concurrent_drains.strip(),
            allowed=default.allowed(state.fleet_size),
            in_use=state.fleet_in_use,
        ),
        next_change=next_change(states),
        waiting=waiting,
        repair=RepairView(
            max_unhealthy_percent=pool.repair.max_unhealthy_percent,
            blocked=repair.blocked(ctx, name),
        ),
    )


def drain_exceeds(
    ctx: Context, pool: Pool, adding: int, now: datetime | None = None
) -> BudgetExceeded | None:
    """The most restrictive budget of the pool that its disruptions go beyond, with `adding` more that
    are not counted yet, if any."""
    if not pool.disruption.budgets:
        return None
    now = now or utcnow()
    state = Door(ctx, now).state(pool.name)
    in_use = state.in_use + adding
    over = exceeded(pool.disruption, now, members=state.members, in_use=in_use)
    if over is None:
        return None
    return BudgetExceeded(
        pool=pool.name,
        budget=over.index,
        max=over.budget.max,
        allowed=over.allowed,
        in_use=in_use,
        until=over.window.until,
    )


def worker_drain_exceeds(ctx: Context, worker_id: str) -> BudgetExceeded | None:
    """What an operator's drain of this worker goes beyond, counted with the others (nothing when it has
    no pool)."""
    worker = ctx.store.get_worker(worker_id)
    pool = ctx.store.find_pool(worker.pool) if worker.pool else None
    if pool is None:
        return None
    return drain_exceeds(ctx, pool, 0 if counted(worker.owner) else 1)


def pool_drain_exceeds(ctx: Context, pool: Pool) -> BudgetExceeded | None:
    """What draining every worker of the pool goes beyond; a pool drain that leaves its workers
    running (`then` none) disrupts none of them."""
    if pool.drain_then is None or pool.drain_then.value == "none":
        return None
    running = sum(1 for w in ctx.store.workers_in_pool(pool.name) if w.status == WorkerStatus.RUNNING)
    return drain_exceeds(ctx, pool, running) if running else None
