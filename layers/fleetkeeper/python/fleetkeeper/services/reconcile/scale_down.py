"""Steady RUNNING workers: idle tracking from their metrics, then scale-down decisions and actions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from fleetkeeper.domain.errors import StaleWrite
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
from fleetkeeper.domain.scale_down_ledger import InFlight, admit, in_flight, still_needed, view_too_old
from fleetkeeper.observability import logger
from fleetkeeper.services import drain_hooks
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


def plan_steady_running(
    ctx: Context,
    work: list[Work],
    readings: Mapping[str, Mapping[str, float]],
    now: datetime,
    counters: Counter[str],
    *,
    fleet: Sequence[Worker] | None = None,
    view_read_at: datetime | None = None,
    deadline: datetime | None = None,
) -> None:
    """Idle tracking for every steady RUNNING worker, then scale-down decisions, one at a time.

    Decisions are taken in one thread so the minimum per scope and the disruption budget account for
    the scale-downs already chosen in this cycle. A worker whose evaluation raises (a bad record, a
    failed read) gets the error on its work item and no scale-down; the others are decided as usual.

    `work` is this shard's workers and `fleet` every worker the cycle read (its view), read from
    `view_read_at` on; the cycle's invocation ends by `deadline`. The guards count the whole fleet,
    and each chosen scale-down must then be admitted by the ledger (domain/scale_down_ledger.py),
    which also counts what other cycles chose that this view cannot show yet, and win its scope's
    cooldown, so the limits hold exactly however many cycles decide at once.
    """
    policy = scale_down_policy(ctx.settings)
    view = list(fleet) if fleet is not None else [item.worker for item in work]
    steady = [
        item
        for item in work
        if item.error is None
        and item.worker.status == WorkerStatus.RUNNING
        and item.step.target is None
        and item.step.call is None
        and item.step.drain_then is None
    ]
    running_in_scope: Counter[str] = Counter(scope_of(w) for w in view if w.status == WorkerStatus.RUNNING)
    draining = sum(1 for w in view if w.status == WorkerStatus.DRAINING)
    fleet_size = sum(1 for w in view if w.status in (WorkerStatus.RUNNING, WorkerStatus.DRAINING))
    tally = _Tally(policy, Counter(running_in_scope), draining, fleet_size)
    wall = utcnow()
    claims = _Claims(
        ctx,
        policy,
        now=now,
        statuses={w.id: w.status for w in view},
        running_in_scope=running_in_scope,
        fleet_size=fleet_size,
        view_read_at=view_read_at or wall,
        deadline=deadline or wall + DEFAULT_INVOCATION,
    )
    if policy.enabled:
        for name, stamp in ctx.stats.read(SCALE_DOWN_SCOPE).timestamps.items():
            tally.last_by_scope[name] = datetime.fromisoformat(stamp)

    for item in steady:
        try:
            _plan_one(ctx, item, readings=readings, now=now, tally=tally, counters=counters)
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


# Without a deadline from the caller (a test, a by-hand run), a cycle is taken to end within this.
DEFAULT_INVOCATION = timedelta(minutes=15)
# Turns a cycle takes at the ledger before leaving the worker for the next cycle.
LEDGER_ATTEMPTS = 5


@dataclass
class _Claims:
    """What a chosen scale-down must win before it is acted on: a place in the ledger, then (with a
    cooldown) its scope's cooldown, a conditional write on the `scale-down` stats item.

    The ledger comes first; a place won for a scale-down that then loses its cooldown is given back,
    so it does not hold the budget or the scope for nothing.
    """

    ctx: Context
    policy: ScaleDownPolicy
    now: datetime
    statuses: Mapping[str, WorkerStatus]
    running_in_scope: Mapping[str, int]
    fleet_size: int
    view_read_at: datetime
    deadline: datetime
    # Once the ledger refused a drain for the budget, no later drain of this cycle can fit.
    budget_spent: bool = False

    def take(self, worker: Worker, action: Action) -> Guard | None:
        """None when this scale-down may go ahead; else the guard that refused it."""
        if action is Action.DRAIN and self.budget_spent:
            return Guard.DISRUPTION_BUDGET
        refused = self._enter(worker, action)
        if refused is Guard.DISRUPTION_BUDGET:
            self.budget_spent = True
        if refused is not None:
            return refused
        if self.policy.cooldown > timedelta(0) and not self.ctx.stats.claim_timestamp(
            SCALE_DOWN_SCOPE, scope_of(worker), now=self.now, free_before=self.now - self.policy.cooldown
        ):
            self._leave(worker)
            return Guard.COOLDOWN
        return None

    def _mine(self, entry: InFlight, worker: Worker) -> bool:
        return entry.worker_id == worker.id and entry.until == self.deadline

    def _enter(self, worker: Worker, action: Action) -> Guard | None:
        ledger = self.ctx.ledger
        for _ in range(LEDGER_ATTEMPTS):
            wall = utcnow()
            if view_too_old(self.view_read_at, wall):
                return Guard.STALE_VIEW
            current = ledger.read()
            if any(self._mine(e, worker) for e in current.entries):
                return None  # our own write landed, though its answer was lost and the retry refused
            refused = admit(
                worker,
                action,
                entries=in_flight(current, self.view_read_at),
                statuses=self.statuses,
                running_in_scope=self.running_in_scope,
                policy=self.policy,
                fleet_size=self.fleet_size,
            )
            if refused is not None:
                return refused
            entry = InFlight(worker_id=worker.id, scope=scope_of(worker), action=action, until=self.deadline)
            try:
                ledger.save(current, [*still_needed(current, wall), entry])
            except StaleWrite:
                continue  # another cycle entered first: decide again with its entry counted
            return None
        logger.info("scale-down ledger busy; the worker waits for the next cycle", worker_id=worker.id)
        return Guard.IN_FLIGHT

    def _leave(self, worker: Worker) -> None:
        """Give this cycle's place back; if the ledger stays busy, the place lapses at its deadline."""
        ledger = self.ctx.ledger
        for _ in range(LEDGER_ATTEMPTS):
            current = ledger.read()
            kept = [e for e in still_needed(current, utcnow()) if not self._mine(e, worker)]
            if len(kept) == len(current.entries):
                return
            try:
                ledger.save(current, kept)
            except StaleWrite:
                continue
            return


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
