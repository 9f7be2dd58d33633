"""Steady RUNNING workers: idle tracking from their metrics, then scale-down decisions and actions.

A worker of a pool without a capacity policy is scaled down when idle (reason `scale_down`); one of a
pool with a policy when the pool holds more than its policy wants (scale-in, reason `underutilized`,
docs/capacity.md "Scale-in"), and a STOPPED one when its warm set holds more than the policy's warm
target. Both only propose; the door decides.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Final

from fleetkeeper.domain.admission import Ask, Claim, Held, WaitReason, judge
from fleetkeeper.domain.capacity import warm_short
from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import Cause, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Owner, Worker, WorkerMetrics, WorkerSummary
from fleetkeeper.domain.reconcile import Ec2Call, Outcome, Step
from fleetkeeper.domain.scale_down import (
    Action,
    DisruptionBudget,
    Guard,
    ScaleDownPolicy,
    Verdict,
    booked_within,
    evaluate,
    next_idle_since,
    protected_from_disruption,
    scale_in,
    scope_of,
    warm_surplus,
)
from fleetkeeper.observability import logger
from fleetkeeper.services import admission, drains
from fleetkeeper.services.bookings import bookings_now
from fleetkeeper.services.capacity import PoolReads, assess_pool
from fleetkeeper.services.context import Context
from fleetkeeper.services.lead_time import lead_time
from fleetkeeper.services.reconcile.actions import Work, call_ec2
from fleetkeeper.services.reconcile.provisioning import scaling_audit
from fleetkeeper.settings import Settings

SCALE_DOWN_ACTOR = "scale-down"
SCALE_DOWN_SCOPE = "scale-down"
SCALE_IN_ACTOR = "scale-in"
# STOPPED workers scale-in terminates from one pool's warm set in one cycle at most: its EC2 calls
# stay bounded, and a policy mistake costs a few volumes, not the whole set at once.
MAX_WARM_TRIM_PER_CYCLE: Final = 10
# The workers scale-down looks at: RUNNING ones, and STOPPED ones for a capacity policy's warm set.
_STEADY: Final = frozenset({WorkerStatus.RUNNING, WorkerStatus.STOPPED})


def scale_down_policy(settings: Settings) -> ScaleDownPolicy:
    return ScaleDownPolicy(
        enabled=settings.scale_down_enabled,
        min_workers=settings.min_workers,
        cooldown=timedelta(seconds=settings.scale_down_cooldown_seconds),
        idle_window=timedelta(seconds=settings.idle_window_seconds),
        cpu_threshold=settings.idle_cpu_threshold,
        lookahead=timedelta(seconds=settings.scale_down_lookahead_seconds),
        budget=DisruptionBudget.parse(settings.max_concurrent_drains),
    )


def plan_steady_running(
    ctx: Context,
    work: list[Work],
    readings: Mapping[str, Mapping[str, float]],
    now: datetime,
    counters: Counter[str],
    *,
    counts: FleetCounts | None = None,
    reads: PoolReads | None = None,
) -> None:
    """Idle tracking for every steady RUNNING worker, then scale-down decisions, one at a time, and
    scale-in's of the steady STOPPED workers its pools' warm sets hold beyond their targets. What
    scale-in reads of a pool is kept in `reads` for the cycle's scale-out.

    Scale-down only proposes: each idle worker its guards let go (domain/scale_down.evaluate) passes the
    door for disruption (services/admission.py) with reason `scale_down` and the scope's minimum as its
    floor, and the door's admitting write starts it (the stop's STOPPING, or the drain), so the budgets
    and the minimum hold exactly however many cycles decide at once. Decisions are taken in one thread so
    each sees the ones before it. A worker whose evaluation raises (a bad record, a failed read) gets the
    error on its work item and no scale-down; the others are decided as usual.
    """
    policy = scale_down_policy(ctx.settings)
    # RUNNING workers first: a warm worker's trim takes a place in the budgets' counts while it
    # terminates, and must not hold back the RUNNING ones' scale-in of the same cycle.
    steady = sorted(
        (
            item
            for item in work
            if item.error is None
            and item.worker.status in _STEADY
            and item.step.target is None
            and item.step.call is None
            and item.step.drain_then is None
        ),
        key=lambda item: item.worker.status != WorkerStatus.RUNNING,
    )
    tally = _Tally(policy)
    if policy.enabled:
        for name, stamp in ctx.stats.read(SCALE_DOWN_SCOPE).timestamps.items():
            tally.last_by_scope[name] = datetime.fromisoformat(stamp)
    with admission.door(ctx, now) as door:
        pools = [i.worker.pool for i in steady]
        plans = _ScaleIn(ctx, door, now, counts, counters, pools=pools, reads=reads or PoolReads(ctx))
        for item in steady:
            try:
                _plan_one(ctx, item, readings=readings, now=now, tally=tally, counters=counters, plans=plans)
                if item.scale_down is not None:
                    refused_by = _admit(ctx, door, item, item.scale_down, policy=policy, now=now)
                    if refused_by is not None:
                        counters[f"{_kind(item.scale_down)}_refused_{refused_by}"] += 1
                        item.scale_down = None
            except Exception as error:  # one worker's failure is its own (see cycle.py)
                item.error = error
                item.scale_down = None
                continue
            if item.scale_down is not None and item.scale_down.cause is DisruptionReason.SCALE_DOWN:
                tally.last_by_scope[scope_of(item.worker)] = now


def _kind(verdict: Verdict) -> str:
    """The prefix of a decision's counters: `scale_down` (idle) or `scale_in` (a capacity policy's)."""
    return "scale_in" if verdict.cause is DisruptionReason.UNDERUTILIZED else "scale_down"


class _ScaleIn:
    """Scale-in of the pools with a capacity policy, planned once per pool and cycle, when the cycle
    first meets one of its steady workers: which RUNNING workers go (domain/scale_down.scale_in), each
    stopped back into the warm set while it is short of its target, else terminated; and which STOPPED
    workers the warm set holds beyond its target are terminated (domain/scale_down.warm_surplus)."""

    def __init__(
        self,
        ctx: Context,
        door: admission.Door,
        now: datetime,
        counts: FleetCounts | None,
        counters: Counter[str],
        *,
        pools: list[str | None],
        reads: PoolReads,
    ) -> None:
        self.ctx, self.door, self.now, self.counters = ctx, door, now, counters
        self._counts = counts
        self._reads = reads
        named = {p for p in pools if p is not None}
        # One listing per cycle, and none for a cycle whose steady workers are in no pool.
        listed = ctx.store.list_pools() if named else []
        self._governed = {p.name for p in listed if p.name in named and p.capacity.active}
        self._plans: dict[str, dict[str, Verdict]] = {}

    def governs(self, pool: str | None) -> bool:
        """Whether the pool's capacity policy, not idleness, decides its scale-down."""
        return pool in self._governed

    def verdict(self, worker: Worker) -> Verdict | None:
        pool = worker.pool or ""
        if pool not in self._plans:
            self._plans[pool] = self._plan(pool)
        return self._plans[pool].get(worker.id)

    def _plan(self, name: str) -> dict[str, Verdict]:
        ctx, now = self.ctx, self.now
        pool = ctx.store.get_pool(name)
        policy = pool.capacity
        template = ctx.store.find_template(policy.template) if policy.template else None
        if template is None or pool.status != PoolStatus.ACTIVE or not policy.active:
            return {}
        if self._counts is None:
            self._counts = ctx.store.fleet_counts()
        counts, reads = self._counts, self._reads
        # Bookings due hold their capacity too: scale-in never takes what the next placements need.
        due = bookings_now(ctx, pool, now, waiting=reads.member_counts(name, counts).bookings_waiting).due
        found = assess_pool(
            ctx, pool, template.capacity, counts, now, bookings=due, serving=reads.running(name, counts)
        )
        lead = timedelta(seconds=lead_time(template.name, ctx).launch_seconds)
        taken = scale_in(
            found.target, found.serving, cap=policy.max_workers, kept=lambda w: self._kept(w, lead)
        )
        # Every decider of the pool ranks the same read alike, so two racing choose the same workers, and
        # the worker's version and status on each write let only one of them terminate it.
        trimmed = warm_surplus(
            found.target,
            found.warm,
            running=found.running,
            launching=found.launching,
            stopping=found.stopping,
            refilling=found.refilling,
            template=policy.template,
            now=now,
            limit=MAX_WARM_TRIM_PER_CYCLE,
        )
        plans: dict[str, Verdict] = {
            w.id: Verdict(
                Action.TERMINATE,
                f"capacity policy keeps {found.target.warm} warm, the warm set holds "
                f"{len(found.warm) + found.stopping + found.refilling}: terminated, the newest kept",
                cause=DisruptionReason.UNDERUTILIZED,
                then=DrainThen.TERMINATE,
            )
            for w in trimmed
        }
        if not taken:
            return plans
        # The door holds the floor exactly: of each template's serving workers (the exact counters, as
        # the door reads them), only as many go as were taken here, however many deciders race.
        state = self.door.state(name)
        going = Counter(w.template for w in taken)
        warm_room = warm_short(
            found.target, stopped=len(found.warm), stopping=found.stopping, refilling=found.refilling
        )
        keep = len(found.serving) - len(taken)
        for n, worker in enumerate(taken):
            serving = state.members_by_template.get(worker.template, 0) - state.owned_by_template.get(
                worker.template, 0
            )
            then = DrainThen.STOP if n < warm_room else DrainThen.TERMINATE
            plans[worker.id] = Verdict(
                Action.STOP if worker.active_instances == 0 else Action.DRAIN,
                f"capacity policy keeps {keep} running with {found.target.headroom_slots} free slots; "
                + ("back to the warm set" if then is DrainThen.STOP else "terminated: the warm set is full"),
                cause=DisruptionReason.UNDERUTILIZED,
                then=then,
                floor=max(serving - going[worker.template], 0),
            )
        return plans

    def _kept(self, summary: WorkerSummary, lead: timedelta) -> Guard | None:
        """Why a worker scale-in could take must stay, read afresh: what the door would hold it for
        (so another worker goes in its place), or a timeslot booked on it within the lead time."""
        worker = self.ctx.store.get_worker(summary.id)
        guard: Guard | None = None
        if worker.status != WorkerStatus.RUNNING or self.door.holder(worker) is not None:
            guard = Guard.IN_FLIGHT
        elif protected_from_disruption(worker, self.now):
            guard = Guard.DO_NOT_DISRUPT
        elif booked_within(timeslot_starts(self.ctx, worker), self.now, lead) is not None:
            guard = Guard.UPCOMING_TIMESLOT
        if guard is not None:
            self.counters[f"scale_in_refused_{guard}"] += 1
            logger.info("scale-in keeps worker", worker_id=worker.id, guard=str(guard))
        return guard


# The door's reasons, as scale-down counts its refusals (`scale_down_refused_<guard>`).
_GUARDS: Final = {
    WaitReason.MIN_WORKERS: Guard.MIN_WORKERS,
    WaitReason.PROTECTED: Guard.DO_NOT_DISRUPT,
    WaitReason.OWNED: Guard.IN_FLIGHT,
    WaitReason.NOT_RUNNING: Guard.IN_FLIGHT,
    WaitReason.POOL_NOT_ACTIVE: Guard.POOL_NOT_ACTIVE,
}


def _guard(held: Held) -> Guard:
    if held.why in (WaitReason.BUDGET, WaitReason.WINDOW):
        return Guard.POOL_BUDGET if held.budget is not None else Guard.DISRUPTION_BUDGET
    return _GUARDS[held.why]


def _admit(
    ctx: Context,
    door: admission.Door,
    item: Work,
    verdict: Verdict,
    *,
    policy: ScaleDownPolicy,
    now: datetime,
) -> Guard | None:
    """Pass the idle worker's scale-down through the door, started by the admitting write; None when it
    is under way, else the guard that refused it.

    The cooldown is the scope's own (a conditional write on the `scale-down` stats item), claimed once the
    door would let the worker go: a cooldown never spent on a disruption the budgets hold back."""
    worker = item.worker
    idle = verdict.cause is DisruptionReason.SCALE_DOWN
    ask = (
        Ask(DisruptionReason.SCALE_DOWN, SCALE_DOWN_ACTOR, floor=policy.min_workers)
        if idle
        else Ask(verdict.cause, SCALE_IN_ACTOR, floor=verdict.floor)
    )
    if policy.enabled or not idle:
        looked = judge(ask, worker, door.state(worker.pool), now, active=door.active)
        if isinstance(looked, Held):
            # The door's own state already holds it back: recorded as waiting, with no read or write.
            door.record_held(worker, ask, looked, str(verdict.action))
            return _guard(looked)
    # A capacity policy's scale-in has no cooldown: the budgets pace it, and its headroom rule never
    # takes what scale-out would bring straight back.
    if (
        idle
        and policy.cooldown > timedelta(0)
        and not ctx.stats.claim_timestamp(
            SCALE_DOWN_SCOPE, scope_of(worker), now=now, free_before=now - policy.cooldown
        )
    ):
        return Guard.COOLDOWN
    reason = f"{ask.actor}: {verdict.reason}"
    gone = WorkerStatus.STOPPING if verdict.then is DrainThen.STOP else WorkerStatus.TERMINATING
    if verdict.action in (Action.STOP, Action.TERMINATE):

        def stop(current: Worker, owner: Owner, claim: Claim | None) -> Worker:
            # The door read the worker afresh: an instance placed since the cycle read it means it is no
            # longer idle and empty, and a status changed means it is not the worker proposed; scale-down
            # takes its proposal back (the write's version condition covers what lands after this read).
            if current.active_instances or current.status != worker.status:
                raise _NoLongerIdle(current.id)
            return ctx.store.transition_worker(
                current,
                gone,
                cause=Cause.CONTROL,
                actor=ask.actor,
                reason=reason,
                changes={**item.step.changes, "owner": owner},
                claim=claim,
            )

        try:
            started = door.admit(worker.id, ask, stop, action=str(verdict.action))
        except _NoLongerIdle:
            return Guard.IN_FLIGHT
    else:
        started = drains.open_drain(
            ctx, door, worker.id, ask, actor=ask.actor, reason=reason, then=verdict.then
        )
    if isinstance(started, Held):
        return _guard(started)
    item.admitted = started
    return None


class _NoLongerIdle(Exception):
    """A worker scale-down chose took an instance before the door's write."""


@dataclass
class _Tally:
    """What the guards count across one cycle's decisions: a first look, before the door's exact one."""

    policy: ScaleDownPolicy
    last_by_scope: dict[str, datetime] = field(default_factory=dict)


def _plan_one(
    ctx: Context,
    item: Work,
    *,
    readings: Mapping[str, Mapping[str, float]],
    now: datetime,
    tally: _Tally,
    counters: Counter[str],
    plans: _ScaleIn,
) -> None:
    policy = tally.policy
    worker = item.worker
    reading = readings.get(worker.ec2_instance_id or "")
    if reading is not None:
        counters["idle_detection_count"] += 1
        idle_since = next_idle_since(worker.idle_since, reading.get("cpu"), policy.cpu_threshold, now)
        if idle_since != worker.idle_since:
            # The snapshot rides along on the only writes idle tracking makes: when the verdict flips.
            snapshot = WorkerMetrics(
                cpu_utilization=reading.get("cpu"),
                memory_utilization=reading.get("memory"),
                disk_utilization=reading.get("disk"),
                collected_at=now,
            )
            item.step = Step(
                item.step.outcome,
                item.step.reason,
                changes={"idle_since": idle_since, "metrics": snapshot},
            )
            worker = worker.model_copy(update={"idle_since": idle_since})
    if plans.governs(worker.pool):
        proposed = plans.verdict(worker)
        if proposed is not None:
            logger.info(
                "scale-in chosen", worker_id=worker.id, action=str(proposed.action), then=str(proposed.then)
            )
        item.scale_down = proposed
        return
    if worker.status != WorkerStatus.RUNNING:
        return  # idle scale-down is of RUNNING workers only
    scope = scope_of(worker)
    verdict = evaluate(
        worker,
        now=now,
        policy=policy,
        last_scale_down_at=tally.last_by_scope.get(scope),
        timeslot_starts=partial(timeslot_starts, ctx, worker),
    )
    if verdict.refused_by is not None:
        counters[f"scale_down_refused_{verdict.refused_by}"] += 1
        logger.debug("scale-down refused", worker_id=worker.id, guard=str(verdict.refused_by))
    if verdict.action is Action.NONE:
        return
    logger.info("scale-down chosen", worker_id=worker.id, action=str(verdict.action), reason=verdict.reason)
    item.scale_down = verdict


def timeslot_starts(ctx: Context, worker: Worker) -> list[datetime]:
    return [i.timeslot_start for i in ctx.store.active_instances_of(worker.id) if i.timeslot_start]


def scale_down(
    ctx: Context, worker: Worker, verdict: Verdict, admitted: Worker, counters: Counter[str]
) -> Outcome:
    """What follows a scale-down the door admitted in planning: a stop's (or a terminate's) EC2 call
    (its drain's workflow already started), counted and audited."""
    kind = _kind(verdict)
    if verdict.action is Action.TERMINATE:
        call_ec2(ctx, admitted, Ec2Call.TERMINATE)
        counters[f"{kind}_warm_terminate_count"] += 1
    elif verdict.action is Action.STOP:
        terminate = verdict.then is DrainThen.TERMINATE
        call_ec2(ctx, admitted, Ec2Call.TERMINATE if terminate else Ec2Call.STOP)
        counters[f"{kind}_{'terminate' if terminate else 'stop'}_count"] += 1
    else:
        counters[f"{kind}_drain_count"] += 1
    scaling_audit(
        ctx,
        "Worker Scaled Down",
        {
            "worker_id": worker.id,
            "action": str(verdict.action),
            "then": str(verdict.then),
            "reason": verdict.reason,
            "disruption": str(verdict.cause),
        },
    )
    return Outcome.SUCCESS
