"""Steady RUNNING workers: idle tracking from their metrics, then scale-down decisions and actions."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Worker, WorkerMetrics
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
from fleetkeeper.domain.sharding import WHOLE_FLEET, Shard
from fleetkeeper.observability import logger
from fleetkeeper.services import drain_hooks
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.actions import ACTOR, Work, call_ec2
from fleetkeeper.services.reconcile.provisioning import scaling_audit
from fleetkeeper.settings import Settings

SCALE_DOWN_ACTOR = "scale-down"
SCALE_DOWN_SCOPE = "scale-down"
# Beside each scope's last scale-down time in that stats item: the sharded cycles' drain ticket.
DRAIN_TICKET = "drain-ticket"


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
    shard: Shard = WHOLE_FLEET,
) -> None:
    """Idle tracking for every steady RUNNING worker, then scale-down decisions, one at a time.

    Decisions are taken in one thread so the minimum per scope and the disruption budget account for
    the scale-downs already chosen in this cycle. A worker whose evaluation raises (a bad record, a
    failed read) gets the error on its work item and no scale-down; the others are decided as usual.

    With shards, `work` is this shard's and `fleet` every worker read: the guards count the whole
    fleet, and each chosen scale-down must first win its claims (`_claims`), which keep the limits
    exact although the shards decide at the same time.
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
    tally = _Tally(policy, running_in_scope, draining, fleet_size)
    claims = _Claims(ctx, policy, shard, now)
    if policy.enabled:
        for name, stamp in ctx.stats.read(SCALE_DOWN_SCOPE).timestamps.items():
            if name != DRAIN_TICKET:
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


@dataclass(frozen=True)
class _Claims:
    """The conditional writes a scale-down wins before it is acted on.

    Each shard decides from a view of the fleet read at the start of its cycle, and acts on its choice
    later in the same invocation: a choice reaches the other shards' views within two reconcile
    periods (an invocation ends before its period does). A claim held for that long therefore
    guarantees that the next claimer's view already shows the previous claimer's scale-down:

    - the scope's cooldown, held for max(cooldown, two periods) when sharded: one scale-down per scope
      at a time, so the minimum per scope, counted over the whole fleet, holds across shards;
    - with shards, one fleet-wide drain ticket, held for two periods: at most one scale-down drain
      starts across the shards per ticket, and each sees every earlier one, so the drains counted
      against the disruption budget are exact.

    Unsharded, the one cycle counts its own choices and the lease keeps cycles apart: the cooldown is
    claimed only when it is set (with no cooldown there is nothing to hold), and no ticket is needed.
    """

    ctx: Context
    policy: ScaleDownPolicy
    shard: Shard
    now: datetime

    @property
    def _two_periods(self) -> timedelta:
        return timedelta(seconds=2 * self.ctx.settings.reconcile_period_seconds)

    def take(self, worker: Worker, action: Action) -> Guard | None:
        """None when this scale-down may go ahead; else the guard whose claim another cycle holds.

        The ticket goes first: a ticket won for nothing idles the budget for two periods, a cooldown
        won for nothing idles the scope for a whole cooldown.
        """
        sharded = self.shard.count > 1
        if sharded and action is Action.DRAIN and not self._claim(DRAIN_TICKET, self._two_periods):
            return Guard.DISRUPTION_BUDGET
        hold = max(self.policy.cooldown, self._two_periods) if sharded else self.policy.cooldown
        if hold > timedelta(0) and not self._claim(scope_of(worker), hold):
            return Guard.COOLDOWN
        return None

    def _claim(self, name: str, hold: timedelta) -> bool:
        return self.ctx.stats.claim_timestamp(
            SCALE_DOWN_SCOPE, name, now=self.now, free_before=self.now - hold
        )


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
