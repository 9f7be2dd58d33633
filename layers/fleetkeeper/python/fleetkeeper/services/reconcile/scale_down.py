"""Steady RUNNING workers: idle tracking from their metrics, then scale-down decisions and actions."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.disruption import (
    BudgetBlock,
    DisruptionPolicy,
    DisruptionReason,
    Waiting,
    assess,
    pool_loads,
)
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Worker, WorkerMetrics, utcnow
from fleetkeeper.domain.reconcile import Ec2Call, Outcome, Step
from fleetkeeper.domain.scale_down import (
    Action,
    DisruptionBudget,
    Guard,
    ScaleDownPolicy,
    Verdict,
    evaluate,
    next_idle_since,
    scope_of,
)
from fleetkeeper.domain.scale_down_ledger import (
    InFlight,
    Limits,
    Refusal,
    admit_scale_down,
    still_needed,
)
from fleetkeeper.observability import logger
from fleetkeeper.services import disruption, drain_hooks
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.actions import ACTOR, Work, call_ec2
from fleetkeeper.services.reconcile.provisioning import scaling_audit
from fleetkeeper.settings import Settings

SCALE_DOWN_ACTOR = "scale-down"
SCALE_DOWN_SCOPE = "scale-down"


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


@dataclass(frozen=True)
class FleetView:
    """What a cycle read of the fleet for the guards: its counts, when, and (when the read saw every
    worker) every worker's status; without them, each entry into the ledger reads what it needs."""

    counts: FleetCounts
    read_at: datetime
    statuses: Mapping[str, WorkerStatus] | None = None

    @classmethod
    def of(cls, workers: Sequence[Worker], read_at: datetime) -> FleetView:
        return cls(FleetCounts.of(workers), read_at, {w.id: w.status for w in workers})


def plan_steady_running(
    ctx: Context,
    work: list[Work],
    readings: Mapping[str, Mapping[str, float]],
    now: datetime,
    counters: Counter[str],
    *,
    view: FleetView | None = None,
    deadline: datetime | None = None,
) -> None:
    """Idle tracking for every steady RUNNING worker, then scale-down decisions, one at a time.

    Decisions are taken in one thread so the minimum per scope and the disruption budget account for
    the scale-downs already chosen in this cycle. A worker whose evaluation raises (a bad record, a
    failed read) gets the error on its work item and no scale-down; the others are decided as usual.

    `work` is this shard's workers and `view` what the cycle read of the whole fleet (by default, the
    workers of `work` as the whole fleet); the cycle's invocation ends by `deadline`. The guards count
    the whole fleet, and each chosen scale-down must then be admitted by the ledger
    (domain/scale_down_ledger.py), within the budgets (the pool's, else the stage default), which also
    counts what other cycles chose that this view cannot show yet, and win its scope's cooldown, so the
    limits hold exactly however many cycles decide at once.
    """
    policy = scale_down_policy(ctx.settings)
    wall = utcnow()
    view = view or FleetView.of([item.worker for item in work], wall)
    steady = [
        item
        for item in work
        if item.error is None
        and item.worker.status == WorkerStatus.RUNNING
        and item.step.target is None
        and item.step.call is None
        and item.step.drain_then is None
    ]
    counts = view.counts
    tally = _Tally(policy, Counter(counts.running_in_scope), counts.draining, counts.fleet_size)
    limits = Limits(
        at=now,
        default=policy.budget,
        fleet_size=counts.fleet_size,
        draining=counts.draining,
        policies=_policies(ctx, steady) if policy.enabled else {},
        loads=pool_loads(counts.cells),
    )
    claims = _Claims(
        ctx,
        policy,
        now=now,
        view=view,
        statuses=view.statuses or {},
        running_in_scope=counts.running_in_scope,
        limits=limits,
        deadline=deadline or wall + DEFAULT_INVOCATION,
    )
    if policy.enabled:
        for name, stamp in ctx.stats.read(SCALE_DOWN_SCOPE).timestamps.items():
            tally.last_by_scope[name] = datetime.fromisoformat(stamp)

    for item in steady:
        try:
            _plan_one(ctx, item, readings=readings, now=now, tally=tally, counters=counters, claims=claims)
            if item.scale_down is not None:
                refused_by = claims.take(item.worker, item.scale_down.action)
                if refused_by is not None:
                    counters[f"scale_down_refused_{refused_by}"] += 1
                    item.scale_down = None
        except Exception as error:  # one worker's failure is its own (see cycle.py)
            item.error = error
            item.scale_down = None
            continue
        if item.scale_down is not None:
            scope = scope_of(item.worker)
            tally.running_in_scope[scope] -= 1
            tally.last_by_scope[scope] = now
            if item.scale_down.action is Action.DRAIN:
                tally.draining += 1
    if claims.waiting:
        counters["disruption_waiting_unrecorded"] += disruption.record_waiting(ctx, claims.waiting, now)


def _policies(ctx: Context, steady: Sequence[Work]) -> dict[str, DisruptionPolicy]:
    """The budgets of the candidates' pools, read from the pool items (not an index) once a cycle."""
    names = sorted({item.worker.pool for item in steady if item.worker.pool})
    pools = (ctx.store.find_pool(name) for name in names)
    return {pool.name: pool.disruption for pool in pools if pool is not None and pool.disruption.budgets}


# Without a deadline from the caller (a test, a by-hand run), a cycle is taken to end within this.
DEFAULT_INVOCATION = timedelta(minutes=15)
LEDGER_ATTEMPTS = disruption.LEDGER_ATTEMPTS


@dataclass
class _Claims:
    """What a chosen scale-down must win before it is acted on: a place in the ledger, within the
    budgets (the pool's, else the stage default), then (with a cooldown) its scope's cooldown, a
    conditional write on the `scale-down` stats item.

    A decision is taken with the cycle's view when it saw every worker; with the counters as the view,
    each entry into the ledger reads the statuses it needs and the counts afresh (`_look`), and they
    replace `statuses`, `running_in_scope` and the counts in `limits`.

    The ledger comes first; a place won for a scale-down that then loses its cooldown is given back,
    so it does not hold the budget or the scope for nothing. A budget's refusals are kept as what
    waits on it (`waiting`, by pool), for GET /api/v1/pools/{name}/disruption.
    """

    ctx: Context
    policy: ScaleDownPolicy
    now: datetime
    view: FleetView
    statuses: Mapping[str, WorkerStatus]
    running_in_scope: Mapping[str, int]
    limits: Limits
    deadline: datetime
    # Once the ledger refused for a budget, no later disruption of this cycle that the same budget
    # counts can fit (a cycle only adds to what is in use): the stage default's drains (key None) or a
    # pool's scale-downs (key: the pool).
    spent: dict[str | None, BudgetBlock] = field(default_factory=dict)
    waiting: dict[str, list[Waiting]] = field(default_factory=dict)

    def take(self, worker: Worker, action: Action) -> Guard | None:
        """None when this scale-down may go ahead; else the guard that refused it."""
        refusal = self._spent(worker, action) or self._enter(worker, action)
        if refusal is not None:
            if refusal.block is not None:
                self.spent[None if refusal.guard is Guard.DISRUPTION_BUDGET else worker.pool] = refusal.block
                self.wait(worker, action, refusal.block)
            return refusal.guard
        if self.policy.cooldown > timedelta(0) and not self.ctx.stats.claim_timestamp(
            SCALE_DOWN_SCOPE, scope_of(worker), now=self.now, free_before=self.now - self.policy.cooldown
        ):
            self._leave(worker)
            return Guard.COOLDOWN
        return None

    def governed_by_pool(self, worker: Worker) -> bool:
        """Whether a budget of the worker's pool applies to scale-down now (the stage default does not)."""
        policy = self.limits.policies.get(worker.pool or "")
        if policy is None:
            return False
        return assess(policy, DisruptionReason.SCALE_DOWN, self.now, members=0, in_use=0).allowed is not None

    def wait(self, worker: Worker, action: Action, block: BudgetBlock) -> None:
        if worker.pool is not None:
            self.waiting.setdefault(worker.pool, []).append(
                Waiting.of(worker.id, str(action), block, self.now)
            )

    def _spent(self, worker: Worker, action: Action) -> Refusal | None:
        if self.governed_by_pool(worker):
            block = self.spent.get(worker.pool)
            return Refusal(Guard.POOL_BUDGET, block) if block else None
        block = self.spent.get(None)
        return Refusal(Guard.DISRUPTION_BUDGET, block) if block and action is Action.DRAIN else None

    def _mine(self, entry: InFlight, worker: Worker) -> bool:
        return entry.worker_id == worker.id and entry.until == self.deadline

    def _enter(self, worker: Worker, action: Action) -> Refusal | None:
        def decide(entries: list[InFlight]) -> Refusal | None:
            return admit_scale_down(
                worker,
                action,
                entries=entries,
                statuses=self.statuses,
                running_in_scope=self.running_in_scope,
                policy=self.policy,
                limits=self.limits,
            )

        return disruption.enter_ledger(
            self.ctx,
            worker,
            action,
            DisruptionReason.SCALE_DOWN,
            until=self.deadline,
            view_read_at=self.view.read_at,
            decide=decide,
            look=self._look if self.view.statuses is None else None,
        )

    def _look(self, worker_ids: set[str]) -> datetime:
        """Read these workers' statuses, then the counters (in that order: domain/scale_down_ledger.admit),
        as the view the next decision is taken with; when they were read."""
        read_at = utcnow()
        store = self.ctx.store
        self.statuses = store.worker_statuses(worker_ids)
        counts = store.fleet_counts()
        self.running_in_scope = counts.running_in_scope
        self.limits = replace(
            self.limits,
            fleet_size=counts.fleet_size,
            draining=counts.draining,
            loads=pool_loads(counts.cells),
        )
        return read_at

    def _leave(self, worker: Worker) -> None:
        """Give this cycle's place back; if the ledger stays busy, the place lapses at its deadline."""
        ledger = self.ctx.ledger

        def attempt() -> None:
            current = ledger.read()
            kept = [e for e in still_needed(current, utcnow()) if not self._mine(e, worker)]
            if len(kept) != len(current.entries):
                ledger.save(current, kept)

        with contextlib.suppress(StaleWrite):
            retry_conflicts(attempt, LEDGER_ATTEMPTS)


@dataclass
class _Tally:
    """What the guards count across one cycle's decisions."""

    policy: ScaleDownPolicy
    running_in_scope: Counter[str]
    draining: int
    fleet: int
    last_by_scope: dict[str, datetime] = field(default_factory=dict)


def _plan_one(
    ctx: Context,
    item: Work,
    *,
    readings: Mapping[str, Mapping[str, float]],
    now: datetime,
    tally: _Tally,
    counters: Counter[str],
    claims: _Claims,
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
    scope = scope_of(worker)
    verdict = evaluate(
        worker,
        now=now,
        policy=policy,
        running_in_scope=tally.running_in_scope[scope],
        last_scale_down_at=tally.last_by_scope.get(scope),
        draining_now=tally.draining,
        fleet_size=tally.fleet,
        timeslot_starts=partial(timeslot_starts, ctx, worker),
        # The pool's budgets, when one applies, are checked exactly at the ledger instead.
        stage_budget=not claims.governed_by_pool(worker),
    )
    if verdict.refused_by is Guard.DISRUPTION_BUDGET:
        allowed = policy.budget.allowed(tally.fleet)
        block = BudgetBlock(worker.pool, DisruptionReason.SCALE_DOWN, None, allowed, tally.draining)
        claims.wait(worker, Action.DRAIN, block)
    if verdict.refused_by is not None:
        counters[f"scale_down_refused_{verdict.refused_by}"] += 1
        logger.debug("scale-down refused", worker_id=worker.id, guard=str(verdict.refused_by))
    if verdict.action is Action.NONE:
        return
    logger.info("scale-down chosen", worker_id=worker.id, action=str(verdict.action), reason=verdict.reason)
    item.scale_down = verdict


def timeslot_starts(ctx: Context, worker: Worker) -> list[datetime]:
    return [i.timeslot_start for i in ctx.store.active_instances_of(worker.id) if i.timeslot_start]


def scale_down(ctx: Context, worker: Worker, verdict: Verdict, step: Step, counters: Counter[str]) -> Outcome:
    current = worker
    if step.changes:
        current = ctx.store.update_worker(worker, step.changes, actor=ACTOR, action="IdleTracked")
    if verdict.action is Action.STOP:
        # Conditional on the version just read: an instance placed meanwhile bumps it and wins.
        stopped = ctx.store.transition_worker(
            current,
            WorkerStatus.STOPPING,
            cause=Cause.CONTROL,
            actor=SCALE_DOWN_ACTOR,
            reason=f"scale-down: {verdict.reason}",
        )
        call_ec2(ctx, stopped, Ec2Call.STOP)
        counters["scale_down_stop_count"] += 1
    else:
        if not drain_hooks.start_drain(
            ctx,
            worker.id,
            actor=SCALE_DOWN_ACTOR,
            reason=f"scale-down: {verdict.reason}",
            then=DrainThen.STOP,
        ):
            counters["scale_down_drain_unavailable"] += 1
            return Outcome.REQUEUE
        counters["scale_down_drain_count"] += 1
    scaling_audit(
        ctx,
        "Worker Scaled Down",
        {"worker_id": worker.id, "action": str(verdict.action), "reason": verdict.reason},
    )
    return Outcome.SUCCESS
