"""EC2 events applied within seconds: state-change notifications, spot interruption warnings, rebalance
recommendations and AWS Health scheduled changes (retirements, stops, reboots, maintenance).

Events arrive at least once and out of order. Each worker remembers the newest EC2 evidence it has seen
(`ec2_state`, `ec2_observed_at`), whether the event moved it or not, so a duplicate changes nothing and a
late event never moves a worker backwards; every write is conditional, so a concurrent reconcile or API
call simply wins or loses (and the event is tried again on a fresh read).

A machine is recognised by one strongly consistent read of its key item (`find_worker_of`); an event
about any other machine in the account is dropped after that read, without a write: its outcome is an
EMF metric (`Ec2Events.events_<outcome>`), never an item that every event would update.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.domain.admission import Ask, Imposed
from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Worker, utcnow
from fleetkeeper.domain.reconcile import CONSISTENT_STATUSES, Observation, follow_ec2, is_stale_evidence
from fleetkeeper.domain.repair import HealthSource, HealthStatus, ScheduledEvent, Signal
from fleetkeeper.observability import emit_counters, logger
from fleetkeeper.services import drain_hooks, lead_time, repair
from fleetkeeper.services.context import Context
from fleetkeeper.services.worker_exit import finish_retirement, release_stopped_worker, retire_worker
from fleetkeeper.triggers import (
    Ec2RebalanceEvent,
    Ec2SpotWarningEvent,
    Ec2StateChangeEvent,
    HealthScheduledChangeEvent,
)

ACTOR = "ec2-events"
# EC2 gives a spot instance two minutes between the warning and the interruption.
SPOT_NOTICE = timedelta(minutes=2)
# A conditional write lost to a concurrent writer is retried on a fresh read this many times.
MAX_ATTEMPTS = 3


class EventOutcome(StrEnum):
    APPLIED = "applied"
    UNCHANGED = "unchanged"  # the worker already reflects it (a duplicate, or a consistent state)
    STALE = "stale"  # older than the evidence the worker reflects
    NOT_APPLICABLE = "not_applicable"  # the lifecycle has no such move; the reconciler sorts it out
    FOREIGN = "foreign"  # no worker has this instance
    DRAIN_STARTED = "drain_started"
    DRAIN_NOT_STARTED = "drain_not_started"
    CONFLICT = "conflict"
    DROPPED = "dropped"  # malformed or not an event we handle
    DISABLED = "disabled"  # a rebalance recommendation while rebalance drains are off


@dataclass(frozen=True)
class EventResult:
    outcome: EventOutcome
    worker_id: str | None = None
    detail: str = ""

    def as_dict(self) -> dict[str, str | None]:
        return {"outcome": str(self.outcome), "worker_id": self.worker_id, "detail": self.detail}


def apply_state_change(
    ctx: Context, *, instance_id: str, state: str, at: datetime, region: str
) -> EventResult:
    """Move the instance's worker to the status EC2 reports, unless that is old news."""
    result = EventResult(EventOutcome.CONFLICT)
    for _ in range(MAX_ATTEMPTS):
        worker = find_worker_of(ctx, instance_id, region)
        if worker is None:
            return _done(EventResult(EventOutcome.FOREIGN, detail=f"no worker has {instance_id}"))
        # A redelivered event is how a retirement or a stop cut short (crash, throttling) gets finished;
        # both steps are idempotent and do nothing when there is nothing left to do.
        finish_retirement(ctx, worker, actor=ACTOR)
        release_stopped_worker(ctx, worker, actor=ACTOR)
        if is_stale_evidence(worker, state, at):
            return _done(EventResult(EventOutcome.STALE, worker.id, f"{state} at {at.isoformat()}"))
        step = follow_ec2(worker, Observation(state=state, observed_at=at))
        if step is None:
            agrees = worker.status in CONSISTENT_STATUSES.get(state, frozenset())
            outcome = EventOutcome.UNCHANGED if agrees else EventOutcome.NOT_APPLICABLE
            ignored = EventResult(outcome, worker.id, f"{worker.status} with EC2 {state}")
            if not _remember(ctx, worker, state, at):
                continue  # the worker changed meanwhile: look at the event again on a fresh read
            return _done(ignored)
        changes = dict(step.changes)
        target = step.target
        if target == WorkerStatus.RUNNING:
            addresses = _addresses(ctx, region, instance_id)
            if addresses is not None:
                changes.update(addresses)
            elif worker.status == WorkerStatus.PROVISIONING:
                # Running, but placement needs an address: STARTING until the reconciler reads one.
                target = WorkerStatus.STARTING
            else:
                if not _remember(ctx, worker, state, at):
                    continue
                return _done(EventResult(EventOutcome.NOT_APPLICABLE, worker.id, "no address yet"))
        try:
            _move(ctx, worker, target, changes, reason=step.reason)
        except Conflict:
            result = EventResult(EventOutcome.CONFLICT, worker.id, "worker changed concurrently")
            continue
        logger.info(
            "EC2 event applied",
            worker_id=worker.id,
            from_status=str(worker.status),
            to_status=str(target),
            ec2_state=state,
        )
        return _done(EventResult(EventOutcome.APPLIED, worker.id, f"{worker.status} -> {target}"))
    return _done(result)


def find_worker_of(ctx: Context, instance_id: str, region: str) -> Worker | None:
    """The worker whose machine this is, or None for a machine fleetkeeper does not know.

    One strongly consistent GetItem of the machine's key item decides (store/machine_keys.py): it is
    written with the worker write that records the machine, so a machine is known the moment its worker
    holds the id. A foreign machine costs nothing more: no index query, no DescribeInstances, no write.
    Only in a region whose older machines discovery has not backfilled yet, a miss is looked up in the
    by_ec2_instance index as before.

    A machine launched a moment ago, whose RunInstances answer its worker has not recorded yet, is not
    known here: the reconciler owns it (it records the machine, or adopts it by its worker-id tag after a
    lost answer) and reads its state every cycle, so the event is only early, not lost.
    """
    return ctx.store.find_worker_by_ec2_instance(instance_id, region)


def _remember(ctx: Context, worker: Worker, state: str, at: datetime) -> bool:
    """Hold the newest EC2 evidence on the worker even when the event moves nothing.

    Without it a `stopping` delayed by retries would still look newer than anything the worker holds
    after a later `running` was ignored (e.g. while DRAINING), and would stop a healthy machine.
    False when the worker changed since it was read (the conditional write lost).
    """
    if worker.ec2_state == state and worker.ec2_observed_at == at:
        return True
    try:
        ctx.store.update_worker(
            worker,
            {"ec2_state": state, "ec2_observed_at": at},
            actor=ACTOR,
            action="Ec2Observed",
            reason=f"EC2 reports {state}",
        )
    except Conflict:
        return False
    return True


def _addresses(ctx: Context, region: str, instance_id: str) -> dict[str, Any] | None:
    """The instance's IPs (the event carries none), or None when EC2 cannot tell us right now."""
    try:
        found = ctx.ec2(region).describe([instance_id]).get(instance_id)
    except (ClientError, BotoCoreError) as error:
        logger.warning("instance addresses unavailable", instance_id=instance_id, error=str(error))
        return None
    if found is None or not (found.private_ip or found.public_ip):
        return None
    return {"private_ip": found.private_ip, "public_ip": found.public_ip}


def _move(
    ctx: Context, worker: Worker, target: WorkerStatus | None, changes: dict[str, Any], *, reason: str
) -> None:
    if target is None:
        return
    if target == WorkerStatus.TERMINATED:
        retire_worker(ctx, worker, cause=Cause.EC2, actor=ACTOR, reason=reason, changes=changes)
        return
    moved = ctx.store.transition_worker(
        worker,
        target,
        cause=Cause.EC2,
        actor=ACTOR,
        reason=reason,
        changes={**changes, "status_reason": reason},
    )
    lead_time.record(ctx, worker, moved)
    release_stopped_worker(ctx, moved, actor=ACTOR)


def apply_spot_warning(
    ctx: Context,
    *,
    instance_id: str,
    instance_action: str,
    at: datetime,
    region: str,
    now: datetime | None = None,
) -> EventResult:
    """Start a drain whose deadline is the interruption, about two minutes after the warning."""
    now = now or utcnow()
    worker = find_worker_of(ctx, instance_id, region)
    if worker is None:
        return _done(EventResult(EventOutcome.FOREIGN, detail=f"no worker has {instance_id}"))
    if worker.status != WorkerStatus.RUNNING:
        return _done(EventResult(EventOutcome.UNCHANGED, worker.id, f"worker is {worker.status}"))
    left = max(int((at + SPOT_NOTICE - now).total_seconds()), 1)
    then = DrainThen.STOP if instance_action in ("stop", "hibernate") else DrainThen.TERMINATE
    started = drain_hooks.start_drain(
        ctx,
        worker.id,
        actor=ACTOR,
        reason=f"spot interruption warning: {instance_action}",
        timeout_seconds=left,
        then=then,
        ask=Ask(Imposed.SPOT, ACTOR),
    )
    outcome = EventOutcome.DRAIN_STARTED if started else EventOutcome.DRAIN_NOT_STARTED
    logger.info("spot interruption warning", worker_id=worker.id, seconds_left=left, drain_started=started)
    return _done(EventResult(outcome, worker.id, f"{left}s left"))


def apply_rebalance_recommendation(
    ctx: Context, *, instance_id: str, at: datetime, region: str, now: datetime | None = None
) -> EventResult:
    """Drain the worker (then stop it) within the configured deadline, when rebalance drains are on.

    Harmless when repeated or late: a worker that is not RUNNING is left alone, a drain started at or
    after the recommendation already answered it (so a redelivery after a cancel does not drain again),
    and a recommendation older than the drain's deadline is old news.
    """
    now = now or utcnow()
    settings = ctx.settings
    if not settings.rebalance_drain_enabled:
        return _done(EventResult(EventOutcome.DISABLED, detail="rebalance drains are off"))
    timeout = timedelta(seconds=settings.rebalance_drain_timeout_seconds)
    if now - at > timeout:
        return _done(EventResult(EventOutcome.STALE, detail=f"recommendation of {at.isoformat()}"))
    worker = find_worker_of(ctx, instance_id, region)
    if worker is None:
        return _done(EventResult(EventOutcome.FOREIGN, detail=f"no worker has {instance_id}"))
    if worker.status != WorkerStatus.RUNNING:
        return _done(EventResult(EventOutcome.UNCHANGED, worker.id, f"worker is {worker.status}"))
    if worker.drain is not None and worker.drain.started_at >= at.replace(microsecond=0):
        return _done(EventResult(EventOutcome.UNCHANGED, worker.id, "a later drain already answered it"))
    started = drain_hooks.start_drain(
        ctx,
        worker.id,
        actor=ACTOR,
        reason="EC2 rebalance recommendation",
        timeout_seconds=int(timeout.total_seconds()),
        then=DrainThen.STOP,
        ask=Ask(Imposed.SPOT, ACTOR),
    )
    outcome = EventOutcome.DRAIN_STARTED if started else EventOutcome.DRAIN_NOT_STARTED
    logger.info("rebalance recommendation", worker_id=worker.id, drain_started=started)
    return _done(EventResult(outcome, worker.id, f"{int(timeout.total_seconds())}s to drain"))


def apply_scheduled_change(
    ctx: Context,
    *,
    instance_ids: list[str],
    region: str,
    code: str,
    not_before: datetime | None,
    closed: bool,
    event_id: str,
    at: datetime | None = None,
) -> EventResult:
    """Record an AWS Health scheduled change on each affected worker's health (services/repair.py): the
    reconciler replaces the worker before `not_before`; a closed change (completed or cancelled) ends a
    repair whose drain has not started. Harmless when repeated: an unchanged health is not written, and
    a word on the event no newer (`at`) than the worker last heard of it is stale."""
    event = ScheduledEvent(code=code, not_before=not_before, event_id=event_id)
    status = HealthStatus.HEALTHY if closed else HealthStatus.UNHEALTHY
    when = not_before.isoformat() if not_before is not None else "an unknown date"
    reason = f"{code}: {'closed' if closed else 'scheduled'}, not before {when}"
    signal = Signal(status, HealthSource.SCHEDULED_EVENT, reason, event, at=at)
    recorded: list[str] = []
    for instance_id in instance_ids:
        worker = find_worker_of(ctx, instance_id, region)
        if worker is None or worker.status == WorkerStatus.TERMINATED:
            continue
        try:
            repair.record_health(ctx, worker.id, [signal], actor=ACTOR)
        except Conflict:
            continue  # terminated since it was read: nothing left to repair
        recorded.append(worker.id)
    if not recorded:
        return _done(
            EventResult(EventOutcome.FOREIGN, detail=f"no live worker has {', '.join(instance_ids)}")
        )
    logger.info("scheduled change recorded", worker_ids=recorded, code=code, closed=closed)
    return _done(EventResult(EventOutcome.APPLIED, recorded[0], f"{code} on {len(recorded)} worker(s)"))


def drop(reason: str) -> EventResult:
    """A malformed or foreign event: logged and counted, never retried."""
    logger.warning("EC2 event dropped", reason=reason)
    return _done(EventResult(EventOutcome.DROPPED, detail=reason[:500]))


def _done(result: EventResult) -> EventResult:
    # A metric, not a counter item: a write per event (most of them foreign) would make one hot item
    # whose throttling has EventBridge deliver the event again.
    emit_counters("Ec2Events", {f"events_{result.outcome}": 1})
    return result


def handle(
    ctx: Context,
    event: Ec2StateChangeEvent | Ec2SpotWarningEvent | Ec2RebalanceEvent | HealthScheduledChangeEvent,
) -> EventResult:
    """Apply one parsed EC2 event."""
    if isinstance(event, HealthScheduledChangeEvent):
        return apply_scheduled_change(
            ctx,
            instance_ids=event.instance_ids,
            region=event.instance_region,
            code=event.detail.event_type_code,
            not_before=event.not_before,
            closed=event.detail.status_code == "closed",
            event_id=event.detail.event_arn,
            at=event.time,
        )
    if isinstance(event, Ec2RebalanceEvent):
        return apply_rebalance_recommendation(
            ctx, instance_id=event.detail.instance_id, at=event.time, region=event.region
        )
    if isinstance(event, Ec2SpotWarningEvent):
        return apply_spot_warning(
            ctx,
            instance_id=event.detail.instance_id,
            instance_action=event.detail.instance_action,
            at=event.time,
            region=event.region,
        )
    return apply_state_change(
        ctx,
        instance_id=event.detail.instance_id,
        state=event.detail.state,
        at=event.time,
        region=event.region,
    )
