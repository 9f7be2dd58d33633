"""Acting on one worker: the transition a step names, its EC2 call (starts batched with the cycle's other
starts), and the persisted RETRY backoff."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from fleetkeeper.cloud.ec2 import INSTANCE_IDS_LIMIT, CapacityError
from fleetkeeper.cloud.retry import is_retryable
from fleetkeeper.domain.errors import Conflict, NotFound
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Drift, Worker, utcnow
from fleetkeeper.domain.reconcile import (
    BACKOFF_MAX_SECONDS,
    Ec2Call,
    Observation,
    Outcome,
    Step,
    capacity_backoff_seconds,
    next_attempt_at,
)
from fleetkeeper.domain.scale_down import Verdict
from fleetkeeper.observability import logger
from fleetkeeper.services import drain_hooks, lead_time
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.capacity import launch_refused
from fleetkeeper.services.worker_exit import release_stopped_worker, retire_worker

ACTOR = "reconciler"


@dataclass
class Work:
    """One due worker of a cycle: its step, what EC2 said, and what went wrong while planning it."""

    worker: Worker
    step: Step
    obs: Observation | None
    scale_down: Verdict | None = None
    # The worker as the door's admitting write left it, once its scale-down started (planning).
    admitted: Worker | None = None
    # Planning this worker failed (a bad record, a read that failed): it is backed off, nothing else.
    error: BaseException | None = None
    # The error is its region's failed EC2 read (counted once for the region), not the worker's own.
    region_unreadable: bool = False

    @property
    def planned(self) -> Worker:
        """The worker as its step leaves it: the status it moves to and the drift it writes."""
        step = self.step
        update: dict[str, Any] = {"status": step.target or self.worker.status}
        if "drift" in step.changes:
            drift = step.changes["drift"]
            update["drift"] = (
                drift if drift is None or isinstance(drift, Drift) else Drift.model_validate(drift)
            )
        return self.worker.model_copy(update=update)

    def needs_io(self) -> bool:
        step = self.step
        return (
            self.error is not None
            or step.target is not None
            or step.call is not None
            or step.drain_then is not None
            or step.outcome == Outcome.RETRY
            or self.scale_down is not None
            or "idle_since" in step.changes
            or "drift" in step.changes
            or (self.worker.reconcile_attempts > 0 and step.outcome != Outcome.SKIP)
        )


# A launch request that needs no repeating: it was answered (the machine is recorded), refused by EC2
# (no machine holds its token), or given up with its worker.
LAUNCH_FORGOTTEN: dict[str, Any] = {
    "launch_token": None,
    "launch_image_id": None,
    "launch_index": None,
    "launch_count": None,
}

# One worker's outcome in a cycle and the counters it adds.
Result = tuple[Outcome, Counter[str]]
# Runs a piece of one worker's work isolated, as the cycle runs every worker's step: what it raises is
# that worker's alone (logged, counted, backed off; services/reconcile/cycle.py).
Isolated = Callable[[Work, Callable[[Counter[str]], Outcome]], Result]


def merged(before: Result, after: Result) -> Result:
    """A worker's result once a later part of its work ran: the later outcome, every counter."""
    return after[0], before[1] + after[1]


def raising(error: BaseException) -> Callable[[Counter[str]], Outcome]:
    """A worker's part that meets `error`: what its batch's call raised, for each worker of the batch."""

    def step(counters: Counter[str]) -> Outcome:
        raise error

    return step


def reset_backoff(worker: Worker) -> dict[str, Any]:
    if worker.reconcile_attempts == 0 and worker.next_reconcile_at is None:
        return {}
    return {"reconcile_attempts": 0, "next_reconcile_at": None, "last_reconcile_error": None}


def start_desired_drain(
    ctx: Context, worker: Worker, step: Step, then: DrainThen, counters: Counter[str]
) -> Outcome:
    """A desired STOPPED/TERMINATED on a busy worker: drain it first, so no session is cut short."""
    started = drain_hooks.start_drain(ctx, worker.id, actor=ACTOR, reason=step.reason, then=then)
    counters["desired_status_drains" if started else "desired_status_drain_refused"] += 1
    return step.outcome


def apply_step(ctx: Context, worker: Worker, step: Step, counters: Counter[str]) -> Outcome:
    """The step's transition (conditional on the version read), then its EC2 call on the machine."""
    current = apply_transition(ctx, worker, step, counters)
    if step.call is not None and current.ec2_instance_id:
        call_ec2(ctx, current, step.call)
    return step.outcome


def is_start(item: Work) -> bool:
    """A STOPPED worker's start, which the cycle makes with the others of its region (`start_all`)."""
    return item.error is None and item.step.call is Ec2Call.START and item.scale_down is None


def start_all(
    ctx: Context, items: list[Work], *, pool: Executor, run: Isolated, finish: Isolated
) -> list[Result]:
    """Start the cycle's STOPPED workers: each moved to STARTING in its own conditional write (`run`, which
    may defer it), then one StartInstances per region and instance type for all of them
    (INSTANCE_IDS_LIMIT ids a call), a refusal met by each (`finish`). EC2 starts all of a call or none:
    one type without capacity refuses only the call of its own type, and a call refused for good (one
    machine IAM denies) is made again one machine a call."""
    results: dict[str, Result] = {}
    moved: dict[str, Worker] = {}

    def move(item: Work) -> None:
        def step(counters: Counter[str]) -> Outcome:
            moved[item.worker.id] = apply_transition(ctx, item.worker, item.step, counters)
            return item.step.outcome

        results[item.worker.id] = run(item, step)

    list(pool.map(move, items))
    alike: dict[tuple[str, str | None], list[Work]] = defaultdict(list)
    for item in items:
        current = moved.get(item.worker.id)
        if current is not None and current.ec2_instance_id:
            alike[(current.region, current.instance_type)].append(item)
    calls = [
        members[start : start + INSTANCE_IDS_LIMIT]
        for members in alike.values()
        for start in range(0, len(members), INSTANCE_IDS_LIMIT)
    ]

    def call(members: list[Work]) -> None:
        started = [moved[item.worker.id] for item in members]
        try:
            ctx.ec2(started[0].region).start([w.ec2_instance_id or "" for w in started])
        except CapacityError as refused:
            for item, worker in zip(members, started, strict=True):

                def back(
                    counters: Counter[str],
                    item: Work = item,
                    worker: Worker = worker,
                    refused: CapacityError = refused,
                ) -> Outcome:
                    return start_refused(ctx, worker, refused, item.worker.reconcile_attempts, counters)

                results[item.worker.id] = merged(results[item.worker.id], finish(item, back))
        except Exception as error:  # each worker meets it as its own start's failure
            if len(members) > 1 and not is_retryable(error):
                # EC2 refuses a whole call for one machine it will not start (IAM denies it, its id is
                # gone): each is started alone, so that machine holds back its own worker only.
                for item in members:
                    call([item])
                return
            for item in members:
                results[item.worker.id] = merged(results[item.worker.id], finish(item, raising(error)))

    list(pool.map(call, calls))
    return [results[item.worker.id] for item in items]


def start_refused(
    ctx: Context, worker: Worker, refused: CapacityError, attempts: int, counters: Counter[str]
) -> Outcome:
    """EC2 had no capacity to start the machine: it is still stopped, and so is the worker again (EC2's
    word), waiting out the capacity backoff before the next StartInstances."""
    reason = f"StartInstances refused: {refused.code}: {refused.aws_message}"[:500]
    now = utcnow()
    ctx.store.transition_worker(
        worker,
        WorkerStatus.STOPPED,
        cause=Cause.EC2,
        actor=ACTOR,
        reason=reason,
        changes={
            "status_reason": reason,
            "reconcile_attempts": attempts + 1,
            "next_reconcile_at": now + timedelta(seconds=capacity_backoff_seconds(attempts)),
            "last_reconcile_error": reason,
        },
    )
    counters["capacity_errors"] += 1
    counters["retries_scheduled"] += 1
    # A warm worker that cannot start is capacity the pool lacks, as a refused launch is.
    launch_refused(ctx, worker, refused.code, reason, now)
    logger.warning("start refused for capacity", worker_id=worker.id, code=refused.code)
    return Outcome.RETRY


def apply_transition(ctx: Context, worker: Worker, step: Step, counters: Counter[str]) -> Worker:
    changes: dict[str, Any] = dict(step.changes)
    if step.outcome != Outcome.RETRY:
        changes.update(reset_backoff(worker))
    if step.target is None:
        if not changes:
            return worker
        return ctx.store.update_worker(worker, changes, actor=ACTOR, action="Reconciled", reason=step.reason)
    changes["status_reason"] = step.reason
    if step.target == WorkerStatus.TERMINATED:
        updated = retire_worker(
            ctx, worker, cause=step.cause, actor=ACTOR, reason=step.reason, changes=changes
        )
    else:
        updated = ctx.store.transition_worker(
            worker, step.target, cause=step.cause, actor=ACTOR, reason=step.reason, changes=changes
        )
        if not lead_time.record(ctx, worker, updated):
            counters["lead_time_samples_lost"] += 1
        if step.cause == Cause.EC2:
            release_stopped_worker(ctx, updated, actor=ACTOR)
    if step.drift:
        counters["drift_corrections"] += 1
    if step.counter:
        counters[step.counter] += 1
    logger.info(
        "worker moved",
        worker_id=worker.id,
        from_status=str(worker.status),
        to_status=str(step.target),
        reason=step.reason,
    )
    return updated


def call_ec2(ctx: Context, worker: Worker, call: Ec2Call) -> None:
    gateway = ctx.ec2(worker.region)
    instance_id = worker.ec2_instance_id or ""
    if call is Ec2Call.STOP:
        gateway.stop(instance_id)
    elif call is Ec2Call.TERMINATE:
        gateway.terminate(instance_id)
    else:  # launches and starts are made in batches (provisioning.launch_all, start_all)
        raise ValueError(f"{call} is not made on one machine")


def back_off(
    ctx: Context,
    worker: Worker,
    now: datetime,
    error: str,
    counters: Counter[str],
    *,
    final: bool = False,
    capacity: bool = False,
) -> None:
    """Persist the RETRY backoff on the worker so the next invocation honours it.

    A final error (one that sending the same request again cannot clear) waits the longest backoff at
    once instead of climbing to it: the worker is looked at again, but not in a tight loop. A capacity
    error (final too) climbs the capacity backoff, minutes apart.
    """
    try:
        fresh = ctx.store.get_worker(worker.id)
        if fresh.version != worker.version and fresh.status != worker.status:
            return  # it moved on meanwhile; the backoff belongs to a state that is gone
        if capacity:
            retry_at = now + timedelta(seconds=capacity_backoff_seconds(fresh.reconcile_attempts))
        elif final:
            retry_at = now + timedelta(seconds=BACKOFF_MAX_SECONDS)
        else:
            retry_at = next_attempt_at(now, fresh.reconcile_attempts)
        ctx.store.update_worker(
            fresh,
            {
                "reconcile_attempts": fresh.reconcile_attempts + 1,
                "next_reconcile_at": retry_at,
                "last_reconcile_error": error[:500],
                "launch_claimed_at": None,
                # A refused launch started nothing: the next one picks the newest image afresh. Any
                # other failure may have lost a launch that went through: it is repeated as it was.
                **(LAUNCH_FORGOTTEN if final or capacity else {}),
            },
            actor=ACTOR,
            action="ReconcileRetry",
            reason=error[:500],
        )
        counters["retries_scheduled"] += 1
    except (Conflict, NotFound):
        counters["conflicts"] += 1


def fail(ctx: Context, worker: Worker, reason: str, counters: Counter[str]) -> Outcome:
    ctx.store.transition_worker(
        worker,
        WorkerStatus.FAILED,
        cause=Cause.CONTROL,
        actor=ACTOR,
        reason=reason,
        changes={"status_reason": reason[:500], "launch_claimed_at": None, **LAUNCH_FORGOTTEN},
    )
    counters["provision_failures"] += 1
    logger.warning("worker failed", worker_id=worker.id, reason=reason)
    return Outcome.REQUEUE
