"""Bookings: a placement with a future timeslot that finds no room waits for capacity (domain/bookings.py,
docs/capacity.md "Bookings and lead time").

`place_or_book` is `POST /api/v1/instances`: an ordinary placement, or, where that finds no room and the
pool books, a booking WAITING_FOR_CAPACITY. `serve_bookings` is the reconcile cycle's part, per pool
before its scale-out: the bookings due are placed on RUNNING workers with room (the same placement
transaction as any), those whose timeslot started unplaced fail and are alerted, and the number still
due raises the pool's target. `bookings_now` is what the capacity view shows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Final

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from fleetkeeper.domain.bookings import (
    NO_CAPACITY_BY_TIMESLOT,
    Phase,
    bookable,
    booking_room,
    due_until,
    expected_ready_by,
    phase,
    takes,
)
from fleetkeeper.domain.capacity import NOT_MEMBERS
from fleetkeeper.domain.errors import CapacityUnavailable, IllegalTransition, StaleWrite
from fleetkeeper.domain.lifecycle import InstanceState, PoolStatus
from fleetkeeper.domain.models import Instance, Pool, WorkerSummary, new_id, utcnow
from fleetkeeper.domain.placement import PlacementStrategy
from fleetkeeper.observability import NAMESPACE, SERVICE, logger
from fleetkeeper.services import placement
from fleetkeeper.services.context import Context
from fleetkeeper.services.lead_time import launch_lead

ACTOR: Final = "capacity"
# Bookings one pool's cycle looks at, earliest first: its writes stay bounded; the rest wait a cycle.
MAX_BOOKINGS_PER_CYCLE: Final = 100
# Per-pool gauges (dimension `pool`); the bookings-at-risk alarm watches the second.
METRIC_WAITING: Final = "BookingsWaiting"
METRIC_AT_RISK: Final = "BookingsAtRisk"
METRIC_FAILED: Final = "BookingsFailed"
DETAIL_FAILED: Final = "InstanceBookingFailed"
# The cycle's counter of bookings at risk (published as Reconcile.bookings_at_risk): the alarm's metric.
COUNTER_AT_RISK: Final = "bookings_at_risk"


def place_or_book(
    ctx: Context,
    *,
    actor: str,
    template: str | None,
    pool: str | None,
    worker_id: str | None,
    strategy: PlacementStrategy,
    timeslot_start: datetime | None,
    timeslot_end: datetime | None,
) -> Instance:
    """Place the instance; where no worker has room, book it instead if its pool waits for capacity
    (SCHEDULED or WAITING_FOR_CAPACITY); otherwise the placement's own refusal."""
    instance_id = new_id("i")
    try:
        return placement.place_instance(
            ctx.store,
            actor=actor,
            template=template,
            pool=pool,
            worker_id=worker_id,
            strategy=strategy,
            timeslot_start=timeslot_start,
            timeslot_end=timeslot_end,
            instance_id=instance_id,
        )
    except CapacityUnavailable:
        if worker_id is not None or pool is None or timeslot_start is None:
            raise
        booked = _book(
            ctx,
            instance_id=instance_id,
            pool_name=pool,
            template=template,
            timeslot_start=timeslot_start,
            timeslot_end=timeslot_end,
            actor=actor,
        )
        if booked is None:
            raise
        return booked


def _book(
    ctx: Context,
    *,
    instance_id: str,
    pool_name: str,
    template: str | None,
    timeslot_start: datetime,
    timeslot_end: datetime | None,
    actor: str,
) -> Instance | None:
    """The booking, or None when the pool does not book this one (the placement's 409 stands)."""
    pool = ctx.store.find_pool(pool_name)
    if pool is None or pool.status != PoolStatus.ACTIVE or not pool.capacity.bookings:
        return None
    policy = pool.capacity
    if policy.template is None or template not in (None, policy.template):
        return None  # it waits only for the workers the policy brings up
    kind = ctx.store.find_template(policy.template)
    lead = launch_lead(policy.template, ctx)
    if kind is None or not bookable(timeslot_start, lead, utcnow()):
        return None
    occupied = sum(
        w.active_instances for w in ctx.store.workers_in_pool(pool_name) if w.status not in NOT_MEMBERS
    )
    room = booking_room(policy.max_workers, kind.capacity, occupied)
    if room <= 0:
        return None
    booking = Instance(
        id=instance_id,
        worker_id="",
        pool=pool_name,
        # As asked: a booking for the pool alone goes on whatever template the policy brings up then.
        template=template,
        timeslot_start=timeslot_start,
        timeslot_end=timeslot_end,
        expected_ready_by=expected_ready_by(timeslot_start, lead),
    )
    return ctx.store.book_instance(booking, room=room, actor=actor)


# ---- the cycle ------------------------------------------------------------------------------------


def serve_bookings(
    ctx: Context,
    pool: Pool,
    now: datetime,
    counters: Counter[str],
    *,
    waiting: int,
    running: Callable[[], list[WorkerSummary]],
) -> int:
    """Place the pool's due bookings where RUNNING workers have room, fail those whose timeslot began
    unplaced, publish the pool's booking gauges; the number still due that the policy's template can
    take (what the target adds: workers of another template would bring a booking of its own nothing).

    `waiting` is the pool's exact count of bookings waiting; `running` lists its RUNNING workers, asked
    only when a booking is to be placed, and the list it gives follows what is placed on them."""
    # The count is exact: a pool with none waiting costs the cycle nothing more.
    found, due = _due(ctx, pool.name, launch_lead(pool.capacity.template, ctx), now) if waiting else ([], 0)
    at_risk = 0
    candidates: list[WorkerSummary] | None = None
    for booking, where in found:
        if where == Phase.OVERDUE:
            _fail(ctx, booking, counters)
            waiting -= 1
            continue
        if candidates is None:
            candidates = running()
        if _place(ctx, booking, candidates, counters):
            waiting -= 1
            continue
        due += takes(booking.template, pool.capacity.template)
        at_risk += where == Phase.AT_RISK
    counters["bookings_due"] += due
    counters[COUNTER_AT_RISK] += at_risk
    _gauges(pool.name, waiting=max(waiting, 0), at_risk=at_risk)
    return due


def _due(ctx: Context, pool: str, lead: timedelta, now: datetime) -> tuple[list[tuple[Instance, Phase]], int]:
    """The first MAX_BOOKINGS_PER_CYCLE bookings due or overdue, with their phases, and how many more
    are due behind them: those wait for a later cycle's placement, but the target counts them now."""
    waiting, behind = ctx.store.waiting_bookings(
        pool, starting_before=due_until(now, lead), limit=MAX_BOOKINGS_PER_CYCLE
    )
    found = [
        (b, phase(b.timeslot_start, lead, now))
        for b in waiting
        if b.timeslot_start is not None and phase(b.timeslot_start, lead, now) != Phase.WAITING
    ]
    return found, behind


def _place(ctx: Context, booking: Instance, candidates: list[WorkerSummary], counters: Counter[str]) -> bool:
    """Place the booking on a candidate with room that may take it; the candidates' counts follow what
    was placed."""
    room = [c for c in candidates if c.free_slots > 0 and takes(booking.template, c.template)]
    if not room:
        return False
    try:
        placed = placement.place_on(
            ctx.store,
            booking,
            room,
            strategy=PlacementStrategy.PACK,
            actor=ACTOR,
            scope=f"pool {booking.pool}",
        )
    except StaleWrite:  # ended (or placed) since it was listed: nothing to do
        counters["bookings_stale"] += 1
        return True
    except CapacityUnavailable:
        return False
    for n, candidate in enumerate(candidates):
        if candidate.id == placed.worker_id:
            candidates[n] = candidate.model_copy(update={"active_instances": candidate.active_instances + 1})
    counters["bookings_placed"] += 1
    return True


def _fail(ctx: Context, booking: Instance, counters: Counter[str]) -> None:
    """FAILED: no worker took it by its timeslot's start. Audited by the write, then published and
    sent to the operators; a booking ended meanwhile is left as it is."""
    try:
        failed = ctx.store.end_instance(
            booking, InstanceState.FAILED, actor=ACTOR, reason=NO_CAPACITY_BY_TIMESLOT
        )
    except (StaleWrite, IllegalTransition):
        counters["bookings_stale"] += 1
        return
    counters["bookings_failed"] += 1
    detail = {
        "instance_id": failed.id,
        "pool": failed.pool,
        "template": failed.template,
        "timeslot_start": failed.timeslot_start,
        "reason": NO_CAPACITY_BY_TIMESLOT,
    }
    _count(METRIC_FAILED, failed.pool or "", 1)
    try:
        ctx.audit.publish(DETAIL_FAILED, detail)
        ctx.notifier.notify(
            f"fleetkeeper: booking {failed.id} in pool {failed.pool} found no capacity", detail
        )
    except Exception:  # the booking is FAILED and audited in the table; the alarm still fires on the metric
        logger.exception("booking failure not published", instance_id=failed.id)


def _gauges(pool: str, *, waiting: int, at_risk: int) -> None:
    _count(METRIC_WAITING, pool, waiting)
    _count(METRIC_AT_RISK, pool, at_risk)


def _count(metric: str, pool: str, value: int) -> None:
    with single_metric(
        name=metric,
        unit=MetricUnit.Count,
        value=value,
        namespace=NAMESPACE,
        default_dimensions={"service": SERVICE},
    ) as single:
        single.add_dimension(name="pool", value=pool)


# ---- the view -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BookingsNow:
    """A pool's bookings at an instant: waiting (exact, from the pool's count), due (all of them the
    policy's template can take) and at risk (of the first MAX_BOOKINGS_PER_CYCLE due, as the cycle sees
    them)."""

    waiting: int
    due: int
    at_risk: int


def bookings_now(ctx: Context, pool: Pool, now: datetime, *, waiting: int) -> BookingsNow:
    """The pool's bookings waiting (its exact count, `waiting`), due and at risk at `now`."""
    if not waiting:
        return BookingsNow(waiting=0, due=0, at_risk=0)  # exact: a pool with none waiting costs no read
    found, behind = _due(ctx, pool.name, launch_lead(pool.capacity.template, ctx), now)
    return BookingsNow(
        waiting=waiting,
        due=behind
        + sum(
            1
            for booking, where in found
            if where != Phase.OVERDUE and takes(booking.template, pool.capacity.template)
        ),
        at_risk=sum(1 for _, where in found if where == Phase.AT_RISK),
    )
