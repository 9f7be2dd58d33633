"""What a pool's capacity policy sees and wants now: read once, for scale-out and for its view."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Final, TypeVar

from pydantic import BaseModel, Field

from fleetkeeper.domain.capacity import (
    Blocked,
    CapacityPolicy,
    LastCycle,
    Rule,
    Target,
    capacity_target,
    warm_short,
)
from fleetkeeper.domain.disruption import pool_of_scope
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Pool, Worker, WorkerSummary, utcnow
from fleetkeeper.services.bookings import bookings_now
from fleetkeeper.services.context import Context
from fleetkeeper.services.lead_time import launch_lead
from fleetkeeper.store.capacity import MemberCounts

T = TypeVar("T")

LAUNCHING: Final = frozenset({WorkerStatus.PENDING, WorkerStatus.PROVISIONING, WorkerStatus.STARTING})
_STAYS_STOPPED: Final = frozenset({None, WorkerStatus.STOPPED})
# The workers whose items scale-out reads: what the counters cannot say is what each will become.
_READ: Final = LAUNCHING | {WorkerStatus.STOPPED}


def pool_counts(counts: FleetCounts, pool: str) -> Counter[WorkerStatus]:
    """The pool's workers by status, whatever their template."""
    found: Counter[WorkerStatus] = Counter()
    for (scope, status), count in counts.cells.items():
        if pool_of_scope(scope) == pool:
            found[status] += count
    return found


class PoolReads:
    """What one reconcile cycle read of its policy pools: scale-in plans a pool on its member item and
    its RUNNING workers, and scale-out, later in the cycle, takes them from here.

    A read is kept with the pool's exact counts by status it was taken under, and taken again when a
    step's counts differ: a worker of the pool moved meanwhile (this cycle's stops, launches and
    replacements among them). Bookings and placements move no count: scale-out sees those others made
    meanwhile next cycle, and its own placements of due bookings update the list it was given."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._members: dict[str, tuple[Counter[WorkerStatus], MemberCounts]] = {}
        self._running: dict[str, tuple[Counter[WorkerStatus], list[WorkerSummary]]] = {}

    def member_counts(self, pool: str, counts: FleetCounts) -> MemberCounts:
        """The pool's member item (members, bookings waiting)."""
        return _kept(self._members, pool, counts, lambda: self._ctx.capacity.member_counts(pool))

    def running(self, pool: str, counts: FleetCounts) -> list[WorkerSummary]:
        """The pool's RUNNING workers, as its index lists them."""
        listing = self._ctx.store.placement_candidates
        return _kept(self._running, pool, counts, lambda: listing(template=None, pool=pool))


def _kept(
    reads: dict[str, tuple[Counter[WorkerStatus], T]], pool: str, counts: FleetCounts, read: Callable[[], T]
) -> T:
    under = pool_counts(counts, pool)
    kept = reads.get(pool)
    if kept is None or kept[0] != under:
        kept = reads[pool] = (under, read())
    return kept[1]


@dataclass(frozen=True)
class PoolCapacity:
    """A pool's workers as its policy counts them, and the target now.

    `launching` counts workers being launched or started to run, STOPPED ones already asked to start
    among them; `refilling` those launched to refill the warm set (desired STOPPED: they stop once
    RUNNING), empty RUNNING ones not stopped yet among them; `warm` the STOPPED workers asked neither
    to start nor to terminate, and held by no one; `serving` the RUNNING workers as the pool's index
    lists them (to rank, never to decide)."""

    running: int
    launching: int
    refilling: int
    stopping: int
    warm: list[Worker]
    free_slots: int
    target: Target
    serving: list[WorkerSummary]


def assess_pool(
    ctx: Context,
    pool: Pool,
    slots_per_worker: int,
    counts: FleetCounts,
    now: datetime,
    *,
    bookings: int = 0,
    serving: list[WorkerSummary] | None = None,
) -> PoolCapacity:
    """The pool's exact counts by status (store/counters.py), the free slots of its RUNNING workers
    (`serving`, or listed here), its launching and STOPPED workers read from their items (what each is
    meant to become), and its target at `now` with `bookings` due."""
    by_status = pool_counts(counts, pool.name)
    running = by_status[WorkerStatus.RUNNING]
    if serving is None:
        serving = ctx.store.placement_candidates(template=None, pool=pool.name)
    free_slots = sum(w.free_slots for w in serving)
    read: list[Worker] = []
    # The exact counts say whether any worker is launching or STOPPED: a steady pool lists none of them.
    if any(by_status[s] for s in _READ):
        ids = [w.id for w in ctx.store.workers_in_pool(pool.name) if w.status in _READ]
        read = [w for w in ctx.store.get_workers(ids) if w.status in _READ and w.pool == pool.name]
    stopped = [w for w in read if w.status == WorkerStatus.STOPPED]
    waking = sum(1 for w in stopped if w.desired_status == WorkerStatus.RUNNING)
    launching = sum(by_status[s] for s in LAUNCHING)
    # Of the launches the counters hold, those the items say will stop: the warm set's, not the target's.
    refilling = min(
        sum(1 for w in read if w.status in LAUNCHING and w.desired_status == WorkerStatus.STOPPED), launching
    )
    # A STOPPED worker someone wants TERMINATED is leaving: waking it would undo that wish.
    warm = [w for w in stopped if w.desired_status in _STAYS_STOPPED and w.owner is None]
    stopping = by_status[WorkerStatus.STOPPING]
    target = capacity_target(
        pool.capacity,
        now,
        running=running,
        free_slots=free_slots,
        slots_per_worker=slots_per_worker,
        bookings=bookings,
    )
    stopping_soon = 0
    if warm_short(target, stopped=len(warm), stopping=stopping, refilling=refilling):
        # A refill is RUNNING for a cycle before its stop, which the counters cannot tell from a serving
        # worker: read the empty RUNNING ones, only while the warm set looks short, lest it be made twice.
        empty = [w.id for w in serving if w.active_instances == 0]
        stopping_soon = sum(
            1
            for w in ctx.store.get_workers(empty)
            if w.status == WorkerStatus.RUNNING and w.desired_status == WorkerStatus.STOPPED
        )
    return PoolCapacity(
        running=running,
        launching=launching - refilling + waking,
        refilling=refilling + stopping_soon,
        stopping=stopping,
        warm=warm,
        free_slots=free_slots,
        target=target,
        serving=serving,
    )


class TargetView(BaseModel):
    workers: int = Field(description="RUNNING workers wanted now, capped by max_workers")
    warm: int = Field(description="STOPPED workers wanted now, within what max_workers leaves")
    rule: Rule = Field(
        description="the rule that sets `workers`: min_workers, headroom, schedule or bookings"
    )
    schedule: int | None = Field(default=None, description="the schedule's index when `rule` is schedule")
    active_schedules: list[int] = Field(description="the schedules whose window applies now")
    headroom_slots: int = Field(description="free slots wanted now (the policy's, raised by its schedules)")
    wanted: int = Field(description="what the rule asked before the cap")
    capped: bool = Field(description="max_workers cut the target")
    bookings_due: int = Field(
        default=0, description="bookings due: their worker should be coming up now (none placed yet)"
    )


class PoolCapacityView(BaseModel):
    """`GET /api/v1/pools/{name}/capacity`: what its capacity policy sees and does (docs/capacity.md)."""

    pool: str
    policy: CapacityPolicy
    at: datetime
    running: int
    launching: int = Field(
        description="being launched or started to run (STOPPED workers asked to start included)"
    )
    refilling: int = Field(default=0, description="launched to refill the warm set and not stopped yet")
    stopping: int
    warm: int = Field(description="STOPPED workers ready to start")
    members: int = Field(
        description="the pool's workers max_workers counts: every status but TERMINATED and FAILED"
    )
    free_slots: int = Field(description="free slots on the pool's RUNNING workers")
    lead_time_seconds: int = Field(
        description="how long before it is needed a worker is asked for: the template's measured launch "
        "lead time (p95), or the stated default"
    )
    bookings_waiting: int = Field(description="bookings waiting for capacity, due or not")
    bookings_due: int = Field(description="waiting bookings whose worker should be coming up now")
    bookings_at_risk: int = Field(description="due bookings with less than the lead time left")
    target: TargetView | None = Field(description="null while the pool has no policy or its template is gone")
    last_cycle: LastCycle | None = Field(description="what the last reconcile cycle's scale-out did")
    blocked: Blocked | None = Field(
        description="scale-out waits: EC2 refused launches for capacity, quota or rate"
    )


def pool_view(ctx: Context, name: str) -> PoolCapacityView:
    """The pool's capacity now (NotFound for no such pool)."""
    pool = ctx.store.get_pool(name)
    now = utcnow()
    policy = pool.capacity
    template = ctx.store.find_template(policy.template) if policy.template else None
    member_counts = ctx.capacity.member_counts(name)
    booked = bookings_now(ctx, pool, now, waiting=member_counts.bookings_waiting)
    found = assess_pool(
        ctx, pool, template.capacity if template else 1, ctx.store.fleet_counts(), now, bookings=booked.due
    )
    state = ctx.capacity.state(name)
    target = found.target
    return PoolCapacityView(
        pool=name,
        policy=policy,
        at=now,
        running=found.running,
        launching=found.launching,
        refilling=found.refilling,
        stopping=found.stopping,
        warm=len(found.warm),
        members=member_counts.members,
        free_slots=found.free_slots,
        lead_time_seconds=int(launch_lead(policy.template, ctx).total_seconds()),
        bookings_waiting=booked.waiting,
        bookings_due=booked.due,
        bookings_at_risk=booked.at_risk,
        target=None
        if template is None
        else TargetView(
            workers=target.workers,
            warm=target.warm,
            rule=target.rule,
            schedule=target.schedule,
            active_schedules=list(target.schedules),
            headroom_slots=target.headroom_slots,
            wanted=target.wanted,
            capped=target.capped,
            bookings_due=target.bookings,
        ),
        last_cycle=state.last_cycle,
        blocked=state.blocked,
    )
