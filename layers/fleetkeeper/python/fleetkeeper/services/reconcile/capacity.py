"""Scale-out: each cycle brings every pool with a capacity policy up to its target (docs/capacity.md).

Per pool, in the shard that owns the pool's name: its due bookings placed or failed (services/bookings.py),
the pool's exact counts by status (store/counters.py), the free slots of its RUNNING workers, the target
(domain/capacity.capacity_target, raised by the bookings still due); then warm workers
are woken first (desired RUNNING on a STOPPED worker: the worker's own step starts it), and new workers
of the template are created for the rest through the one door for new workers, whose write holds
`max_workers` exactly. A pool whose launches EC2 refused for capacity waits until its `retry_at`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime
from typing import Final

from aws_lambda_powertools.metrics import MetricUnit, single_metric

from fleetkeeper.domain.capacity import (
    NOT_MEMBERS,
    CapacityState,
    LastCycle,
    Rule,
    Target,
    blocked_after,
    blocked_reason,
    shortfall,
)
from fleetkeeper.domain.errors import Conflict, PoolFull
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Pool, Worker
from fleetkeeper.observability import NAMESPACE, SERVICE, logger
from fleetkeeper.services.bookings import serve_bookings
from fleetkeeper.services.capacity import PoolReads, assess_pool, pool_counts
from fleetkeeper.services.context import Context
from fleetkeeper.services.workers import create_worker

ACTOR: Final = "capacity"
# Workers one pool is given in one cycle at most: the EC2 calls of a cycle stay bounded, and a
# policy mistake costs a few launches before anyone looks, not hundreds.
MAX_NEW_PER_CYCLE: Final = 20
# Per-pool gauges, with a `pool` dimension, and the alarm's metric (1 per refused launch).
METRIC_TARGET: Final = "CapacityTarget"
METRIC_FREE_SLOTS: Final = "CapacityFreeSlots"
METRIC_WARM: Final = "CapacityWarm"
METRIC_BLOCKED: Final = "CapacityBlocked"


def scale_out(
    ctx: Context,
    now: datetime,
    counters: Counter[str],
    *,
    owns: Callable[[str], bool],
    time_left: Callable[[], float],
    margin_seconds: float,
    reads: PoolReads | None = None,
) -> None:
    """Bring each pool this shard owns up to its target, each pool isolated. A pool without a policy
    costs nothing: none of its bookings waits, since bookings cannot be turned off while some do
    (store/catalog.save_pool).

    The counts are read here, after the cycle's other steps, not taken from the cycle's first read: a
    worker that scale-in stopped this cycle is then warm, not RUNNING, and a replacement made this
    cycle launching, so neither is asked for again. What scale-in read of a pool (`reads`) is taken
    again when these counts show one of the pool's workers moved since."""
    reads = reads or PoolReads(ctx)
    counts: FleetCounts | None = None
    for listed in ctx.store.list_pools():
        if not owns(listed.name):
            continue
        if time_left() < margin_seconds:
            counters["capacity_deferred"] += 1
            return
        try:
            if not listed.capacity.active:
                continue
            if counts is None:
                counts = ctx.store.fleet_counts()
            members = reads.member_counts(listed.name, counts).members
            recount_members(ctx, listed.name, counts, members, counters)
            _scale_pool(ctx, listed.name, counts, now, counters, reads=reads)
        except Exception:  # one pool's failure waits a cycle; the others go on
            logger.exception("scale-out failed", pool=listed.name)
            counters["capacity_errors"] += 1


def recount_members(
    ctx: Context, name: str, counts: FleetCounts, members: int, counters: Counter[str]
) -> None:
    """Correct the pool's member count (`members`, as read) when it differs from what the cycle's
    counters say: workers from before member counts existed (store/capacity.py, "Recount"). A
    difference that is only a write between the two reads recounts to no correction."""
    counted = sum(n for status, n in pool_counts(counts, name).items() if status not in NOT_MEMBERS)
    if members == counted:
        return
    correction = ctx.capacity.recount_members(name)
    if correction is None:
        counters["capacity_recounts_deferred"] += 1
    elif correction:
        counters["capacity_members_recounted"] += 1
        logger.warning("pool member count corrected", pool=name, correction=correction)


def _scale_pool(
    ctx: Context, name: str, counts: FleetCounts, now: datetime, counters: Counter[str], *, reads: PoolReads
) -> None:
    # Read from the item, not the index: the cap written with each new worker is the one stored now.
    pool = ctx.store.get_pool(name)
    policy = pool.capacity
    template = ctx.store.find_template(policy.template) if policy.template else None
    due = serve_bookings(
        ctx,
        pool,
        now,
        counters,
        waiting=reads.member_counts(name, counts).bookings_waiting,
        running=lambda: reads.running(name, counts),
    )
    if template is None or pool.status != PoolStatus.ACTIVE:
        why = f"pool is {pool.status}" if template is not None else f"no template '{policy.template}'"
        _record(ctx, pool, None, now, note=why)
        return
    found = assess_pool(
        ctx, pool, template.capacity, counts, now, bookings=due, serving=reads.running(name, counts)
    )
    target, warm = found.target, found.warm
    _gauges(name, target, found.free_slots, len(warm))
    need = shortfall(
        target,
        running=found.running,
        launching=found.launching,
        refilling=found.refilling,
        stopping=found.stopping,
        stopped=len(warm),
    )
    state = ctx.capacity.state(name)
    blocked = state.blocked
    if blocked is not None and now < blocked.retry_at:
        counters["capacity_blocked_pools"] += 1
        _record(
            ctx, pool, target, now, note=f"blocked ({blocked.reason}) until {blocked.retry_at.isoformat()}"
        )
        return
    started = 0
    for worker in warm[: need.start]:
        try:
            ctx.store.update_worker(
                worker,
                {"desired_status": WorkerStatus.RUNNING},
                actor=ACTOR,
                action="WorkerWokenForCapacity",
                reason=_why(target),
            )
            started += 1
        except Conflict:  # changed since it was read: looked at again next cycle
            counters["capacity_conflicts"] += 1
    created = refused = 0
    for n in range(min(need.create, MAX_NEW_PER_CYCLE)):
        to_warm = n >= need.create - need.warm
        try:
            create_worker(
                ctx.store,
                template=template.name,
                region=ctx.settings.regions[0],
                pool=name,
                actor=ACTOR,
                regions=ctx.settings.regions,
                desired_status=WorkerStatus.STOPPED if to_warm else None,
                reason=("warm set: " if to_warm else "") + _why(target),
            )
            created += 1
        except PoolFull:
            refused += 1
            break
    counters["capacity_workers_woken"] += started
    counters["capacity_workers_created"] += created
    counters["capacity_refused_at_cap"] += refused
    # At its target once the workers are RUNNING and warm, not merely asked for: a worker still
    # waiting on EC2's refusal covers the shortfall, yet the pool stays blocked.
    at_target = found.running >= target.workers and len(warm) >= target.warm
    _record(
        ctx,
        pool,
        target,
        now,
        started=started,
        created=created,
        refused=refused,
        clear_blocked=at_target,
        note="at target" if at_target else None,
    )


def _why(target: Target) -> str:
    rule = f"schedule {target.schedule}" if target.schedule is not None else str(target.rule)
    if target.rule == Rule.BOOKINGS:
        rule = f"{target.bookings} bookings due"
    return f"capacity target {target.workers} running, {target.warm} warm ({rule})"


def _record(
    ctx: Context,
    pool: Pool,
    target: Target | None,
    now: datetime,
    *,
    started: int = 0,
    created: int = 0,
    refused: int = 0,
    clear_blocked: bool = False,
    note: str | None = None,
) -> None:
    last = LastCycle(
        at=now,
        target=target.workers if target else 0,
        warm_target=target.warm if target else 0,
        rule=target.rule if target else None,
        schedule=target.schedule if target else None,
        started=started,
        created=created,
        refused_at_cap=refused,
        note=note,
    )

    def change(state: CapacityState) -> CapacityState:
        # Cleared only once its backoff has run out and the pool reached its target meanwhile.
        ended = clear_blocked and state.blocked is not None and now >= state.blocked.retry_at
        return state.model_copy(update={"last_cycle": last, "blocked": None if ended else state.blocked})

    ctx.capacity.update_state(pool.name, change)


def _gauges(pool: str, target: Target, free_slots: int, warm: int) -> None:
    for metric, value in (
        (METRIC_TARGET, target.workers),
        (METRIC_FREE_SLOTS, free_slots),
        (METRIC_WARM, warm),
    ):
        with single_metric(
            name=metric,
            unit=MetricUnit.Count,
            value=value,
            namespace=NAMESPACE,
            default_dimensions={"service": SERVICE},
        ) as single:
            single.add_dimension(name="pool", value=pool)


def launch_refused(ctx: Context, worker: Worker, aws_error: str | None, message: str, now: datetime) -> bool:
    """Record that EC2 refused `worker`'s launch (or a warm worker's start) for want of capacity, a quota
    or its rate: its pool's scale-out backs off (docs/capacity.md, "Blocked"). False when the error
    blocks nothing."""
    if worker.pool is None or aws_error is None or blocked_reason(aws_error) is None:
        return False
    ctx.capacity.update_state(
        worker.pool,
        lambda state: state.model_copy(
            update={"blocked": blocked_after(state.blocked, aws_error, message, now)}
        ),
    )
    with single_metric(
        name=METRIC_BLOCKED,
        unit=MetricUnit.Count,
        value=1,
        namespace=NAMESPACE,
        default_dimensions={"service": SERVICE},
    ):
        pass
    logger.warning("launch refused for capacity", pool=worker.pool, worker_id=worker.id, aws_error=aws_error)
    return True
