"""A pool's disruption budgets at work: admitting one voluntary disruption through the ledger (exact
across concurrent cycles), what the budgets say now (GET /api/v1/pools/{name}/disruption), what an
operator's drain goes beyond, and the refusals that wait on them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleetkeeper.cloud.retry import CONFLICT_ATTEMPTS, pause_after_conflict
from fleetkeeper.domain.disruption import (
    ALL_REASONS,
    DISRUPTING,
    MEMBERS,
    DisruptionReason,
    Waiting,
    assess,
    blocked_until,
    budget_states,
    exceeded,
    next_change,
    pool_loads,
    still_waiting,
)
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Pool, Worker, utcnow
from fleetkeeper.domain.scale_down import Action, DisruptionBudget, Guard, scope_of
from fleetkeeper.domain.scale_down_ledger import (
    InFlight,
    Limits,
    Refusal,
    check,
    in_flight,
    pool_in_flight,
    still_needed,
    view_too_old,
)
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context

# The disruptions listed by id in the view; the count is always exact.
MAX_LISTED = 100
# Turns a caller takes at the ledger before leaving the disruption for its next try.
LEDGER_ATTEMPTS = CONFLICT_ATTEMPTS


def enter_ledger(
    ctx: Context,
    worker: Worker,
    action: Action,
    reason: DisruptionReason,
    *,
    until: datetime,
    view_read_at: datetime,
    decide: Callable[[list[InFlight]], Refusal | None],
    look: Callable[[set[str]], datetime] | None = None,
) -> Refusal | None:
    """Take a place in the ledger for one voluntary disruption, or say what refuses it.

    `decide` answers from the caller's view (read from `view_read_at` on) and the entries that view
    may miss; `until` is when the caller is gone (its invocation's deadline). The ledger's version
    condition makes concurrent callers take turns: a loser decides again with the winner's entry
    counted. A place whose write landed though its answer was lost is found and kept.

    With `look`, the view is read afresh before each read of the ledger (the counters and the statuses
    of the workers named, domain/scale_down_ledger.admit), and `look` says when: nothing but the
    decision lies between the ledger's read and its conditional write, so callers that enter together
    collide no more than they would from a view read once. It is asked for the candidate and the
    workers of the ledger as last seen; a ledger that names a worker the look did not cover is read
    again after a new look.
    """
    ledger = ctx.ledger
    known: set[str] = {worker.id}
    lost = 0
    # Each lost race costs a turn; a look that missed a worker of the ledger costs one more read.
    for _ in range(2 * LEDGER_ATTEMPTS):
        wall = utcnow()
        if view_too_old(view_read_at, wall):
            return Refusal(Guard.STALE_VIEW)
        seen_at = look(known) if look is not None else view_read_at
        current = ledger.read()
        if any(e.worker_id == worker.id and e.until == until for e in current.entries):
            return None  # our own write landed, though its answer was lost and the retry refused
        named = {e.worker_id for e in current.entries}
        if look is not None and not named <= known:
            known |= named
            continue  # the statuses of workers the ledger names now: look again, then decide
        refused = decide(in_flight(current, seen_at))
        if refused is not None:
            return refused
        entry = InFlight(
            worker_id=worker.id, scope=scope_of(worker), action=action, until=until, reason=reason
        )
        try:
            ledger.save(current, [*still_needed(current, wall), entry])
        except StaleWrite as race:
            lost += 1
            if lost == LEDGER_ATTEMPTS:
                break
            # Another caller entered first: decide again with its entry counted. The shards' cycles
            # start together and all write this one item: without a jittered pause they collide again
            # at once, and one can lose every turn.
            pause_after_conflict(race, lost - 1)
            continue
        return None
    logger.info("disruption ledger busy; the worker waits for the next try", worker_id=worker.id)
    return Refusal(Guard.IN_FLIGHT)


def admit(
    ctx: Context,
    worker_id: str,
    reason: DisruptionReason,
    *,
    action: Action = Action.DRAIN,
    now: datetime | None = None,
    within: timedelta = timedelta(minutes=5),
) -> Refusal | None:
    """Admit one voluntary disruption of `reason` for a worker, or say what refuses it: the pool's
    budget (its index, what it allows, what is in use, and until when) or the stage default.

    For an engine outside the reconcile cycle (rollouts, expiry): it reads its own view (the pool's
    workers, the fleet's drains) and holds its place until `within` from now, by when it must have
    started the disruption (a DRAINING worker then counts by its status).
    """
    now = now or utcnow()
    view_read_at = utcnow()
    worker = ctx.store.get_worker(worker_id)
    pool = ctx.store.find_pool(worker.pool) if worker.pool else None
    statuses: dict[str, WorkerStatus] = {worker.id: worker.status}
    loads = {}
    policies = {}
    if pool is not None:
        members = list(ctx.store.workers_in_pool(pool.name))
        statuses |= {w.id: w.status for w in members}
        policies[pool.name] = pool.disruption
        loads = pool_loads(FleetCounts.of(members).cells)
    fleet_size, draining = _fleet_drains(ctx)
    limits = Limits(
        at=now,
        default=stage_default(ctx),
        fleet_size=fleet_size,
        draining=draining,
        policies=policies,
        loads=loads,
    )
    return enter_ledger(
        ctx,
        worker,
        action,
        reason,
        until=view_read_at + within,
        view_read_at=view_read_at,
        decide=lambda entries: check(
            worker, action, reason, entries=entries, statuses=statuses, limits=limits
        ),
    )


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
    in_use: int = Field(description="workers draining fleet-wide")


class PoolDisruptionView(BaseModel):
    """Why a pool's voluntary disruptions go ahead or wait (docs/disruption.md)."""

    model_config = ConfigDict(extra="forbid")

    pool: str
    at: datetime
    members: int = Field(description="RUNNING workers and those being disrupted: the base of a percentage")
    in_use: int = Field(description="members being disrupted now, whatever the cause, with those chosen")
    disrupting: list[str] = Field(description=f"their worker ids (at most {MAX_LISTED})")
    budgets: list[BudgetView]
    reasons: list[ReasonView]
    stage_default: StageDefaultView
    next_change: datetime | None = Field(description="when a budget next starts or stops applying")
    waiting: list[Waiting] = Field(description="voluntary disruptions held back lately, newest first")


class BudgetExceeded(BaseModel):
    """The budget an operator's drain goes beyond. Nothing refuses the drain; voluntary disruptions of
    the pool wait until it is within its budgets again."""

    pool: str
    budget: int = Field(description="the budget's index in the pool's list")
    max: int | str
    allowed: int
    in_use: int = Field(description="the pool's members being disrupted, this drain included")
    until: datetime | None = Field(description="when the budget stops applying; null: it always applies")


def stage_default(ctx: Context) -> DisruptionBudget:
    return DisruptionBudget.parse(ctx.settings.max_concurrent_drains)


class _PoolCount:
    """The pool's members and disruptions as the status index shows them, with the ledger's entries the
    index may not show yet (the rule of domain/scale_down_ledger.pool_in_flight)."""

    def __init__(self, ctx: Context, pool: str, *, adding: Iterable[str] = ()) -> None:
        read_at = utcnow()
        workers = list(ctx.store.workers_in_pool(pool))
        statuses: dict[str, WorkerStatus] = {w.id: w.status for w in workers}
        # Workers an operator drains right now count as being disrupted, whatever the index shows.
        for worker_id in adding:
            statuses[worker_id] = WorkerStatus.DRAINING
        entries = pool_in_flight(pool, in_flight(ctx.ledger.read(), read_at), statuses)
        self.members = sum(1 for status in statuses.values() if status in MEMBERS)
        disrupting = sorted(w for w, status in statuses.items() if status in DISRUPTING)
        self.disrupting = disrupting + sorted({e.worker_id for e in entries} - set(disrupting))
        self.in_use = len(self.disrupting)
        self.statuses = statuses


def _fleet_drains(ctx: Context) -> tuple[int, int]:
    """The fleet's size for the stage default (RUNNING and DRAINING) and how many drain, from the
    exact counters (store/counters.py), not a read of every worker."""
    counts = ctx.store.fleet_counts()
    return counts.fleet_size, counts.draining


def pool_view(ctx: Context, name: str, now: datetime | None = None) -> PoolDisruptionView:
    """The pool's budgets, which apply now and until when, what they allow and what is in use, and
    the refusals waiting on them."""
    now = now or utcnow()
    pool = ctx.store.get_pool(name)
    count = _PoolCount(ctx, name)
    policy = pool.disruption
    states = budget_states(policy, now, count.members)
    default = stage_default(ctx)
    fleet_size, draining = _fleet_drains(ctx)
    reasons = []
    for reason in ALL_REASONS:
        found = assess(policy, reason, now, members=count.members, in_use=count.in_use)
        blocked = None
        if not found.admits:
            blocked = blocked_until(policy, reason, now, members=count.members, in_use=count.in_use)
        reasons.append(
            ReasonView(
                reason=reason,
                governed_by="pool" if found.allowed is not None else "stage_default",
                applying=list(found.applying),
                limiting=found.limiting,
                allowed=found.allowed,
                in_use=count.in_use,
                available=found.available,
                blocked_until=blocked,
            )
        )
    waiting = [
        w
        for w in still_waiting(ctx.waiting.read(name).entries, now)
        # Once admitted (or gone), a worker no longer waits, whatever its last refusal said.
        if count.statuses.get(w.worker_id) == WorkerStatus.RUNNING
    ]
    return PoolDisruptionView(
        pool=name,
        at=now,
        members=count.members,
        in_use=count.in_use,
        disrupting=count.disrupting[:MAX_LISTED],
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
            allowed=default.allowed(fleet_size),
            in_use=draining,
        ),
        next_change=next_change(states),
        waiting=waiting,
    )


def drain_exceeds(
    ctx: Context, pool: Pool, worker_ids: Sequence[str], now: datetime | None = None
) -> BudgetExceeded | None:
    """The most restrictive budget of the pool that draining `worker_ids` goes beyond, if any."""
    if not pool.disruption.budgets or not worker_ids:
        return None
    now = now or utcnow()
    count = _PoolCount(ctx, pool.name, adding=worker_ids)
    over = exceeded(pool.disruption, now, members=count.members, in_use=count.in_use)
    if over is None:
        return None
    return BudgetExceeded(
        pool=pool.name,
        budget=over.index,
        max=over.budget.max,
        allowed=over.allowed,
        in_use=count.in_use,
        until=over.window.until,
    )


def worker_drain_exceeds(ctx: Context, worker_id: str) -> BudgetExceeded | None:
    """What an operator's drain of this worker goes beyond (nothing when it has no pool)."""
    worker = ctx.store.get_worker(worker_id)
    pool = ctx.store.find_pool(worker.pool) if worker.pool else None
    return drain_exceeds(ctx, pool, [worker.id]) if pool else None


def pool_drain_exceeds(ctx: Context, pool: Pool) -> BudgetExceeded | None:
    """What draining every worker of the pool goes beyond; a pool drain that leaves its workers
    running (`then` none) disrupts none of them."""
    if pool.drain_then is None or pool.drain_then.value == "none":
        return None
    members = [w.id for w in ctx.store.workers_in_pool(pool.name) if w.status == WorkerStatus.RUNNING]
    return drain_exceeds(ctx, pool, members)


def record_waiting(ctx: Context, refusals: Mapping[str, Sequence[Waiting]], now: datetime) -> int:
    """Keep what each pool's budgets held back; how many pools could not be written (logged)."""
    missed = 0
    for pool, entries in sorted(refusals.items()):
        if entries and not ctx.waiting.add(pool, entries, now):
            missed += 1
            logger.info("disruption refusals not recorded: the pool's list stayed busy", pool=pool)
    return missed
