"""Workflow steps of a worker drain, and the one entry the drain_tasks Lambda calls for every Task state."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from botocore.exceptions import ClientError

from fleetkeeper.cloud.ec2 import is_missing_instance
from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.drain_policy import deadline_passed
from fleetkeeper.domain.errors import (
    DrainCancelled,
    DrainDeadlineMoved,
    DrainNoLongerActive,
    DrainNotEmpty,
    DrainNotStartable,
    StaleWrite,
)
from fleetkeeper.domain.lifecycle import Cause, ForceReason, InstanceState, WorkerStatus
from fleetkeeper.domain.models import (
    DrainOutcome,
    DrainRecord,
    DrainThen,
    Worker,
    utcnow,
)
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services import operations
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains._shared import current_drain, drain_of, emit, worker_detail
from fleetkeeper.services.drains.contract import WORKFLOW_ACTOR, DrainInput, StepRequest, worker_wait_plan
from fleetkeeper.services.drains.pools import pool_await_empty, pool_begin, pool_finish, record_pool_error
from fleetkeeper.services.drains.reschedule import reschedule
from fleetkeeper.services.drains.signals import rearm_answer, signal_if_drained


def begin(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    """RUNNING → DRAINING (unless the request already did it), move what has not started yet (unless the
    drain says not to); returns the wait plan."""

    def ensure_draining() -> Worker:
        worker = ctx.store.get_worker(drain.target)
        record = worker.drain
        if record is not None and record.generation >= drain.generation:
            current_drain(worker, drain.generation, drain.restart)
            if worker.status != WorkerStatus.DRAINING:
                raise DrainNotStartable(f"worker {worker.id} is {worker.status}, not DRAINING")
            return worker
        if worker.status != WorkerStatus.RUNNING:
            raise DrainNotStartable(
                f"worker {worker.id} is {worker.status}; only a RUNNING worker can be drained"
            )
        started = drain.record()
        return ctx.store.transition_worker(
            worker,
            WorkerStatus.DRAINING,
            cause=Cause.CONTROL,
            actor=drain.requested_by,
            reason=drain.reason,
            action="WorkerDrainStarted",
            changes={"drain": started},
        )

    worker = retry_conflicts(ensure_draining)
    record = drain_of(worker)
    # Moves happen here, not in the request: this step is retried until it succeeds, and moving again
    # after a crash only finds what is still on the worker. The count left decides whether to wait.
    if record.reschedule and worker.active_instances > 0 and reschedule(ctx, worker, drain.generation):
        worker = ctx.store.get_worker(drain.target)
        current_drain(worker, drain.generation, drain.restart)
    # Reporting emptiness here lets the state machine skip the wait for a worker that is already empty.
    return {
        **worker_wait_plan(ctx, record),
        "empty": worker.active_instances == 0,
    }


def await_empty(
    ctx: Context, drain: DrainInput, task_token: str, armed_deadline: datetime | None = None
) -> None:
    """Store the callback token on the worker; answer it at once if the worker is already empty.

    `armed_deadline` is the deadline this wait's timeout was computed for. If the drain's deadline moved
    since (a move or a force that found no token to answer), the wait would end at the wrong time: its
    token is answered with a re-arm at once, without storing it, and the re-check arms the next wait for
    the new deadline (or forces).
    """

    def register() -> Worker | None:
        worker = ctx.store.get_worker(drain.target)
        # A cancel that came before the token was stored wins here: raising fails the waiting task with
        # DrainCancelled at once, without the token.
        record = current_drain(worker, drain.generation, drain.restart)
        if worker.status != WorkerStatus.DRAINING:
            raise DrainNotStartable(f"worker {worker.id} is {worker.status}, not DRAINING")
        # The write below is conditional on this read: a move that commits after it finds the token and
        # answers it; one that committed before it is seen here.
        if armed_deadline is not None and armed_deadline != record.deadline:
            return None
        return ctx.store.update_worker(
            worker,
            {"drain": record.model_copy(update={"task_token": task_token})},
            actor=WORKFLOW_ACTOR,
            action="WorkerDrainAwaitingEmpty",
        )

    worker = retry_conflicts(register)
    if worker is None:
        ctx.workflows.succeed(task_token, rearm_answer(drain.target))
        return
    # The write above succeeded against this very count (its version matched), so if it is zero no
    # instance is left to send the token later: send it now.
    if worker.active_instances == 0:
        ctx.workflows.succeed(task_token, {"worker_id": worker.id, "empty": True})


def recheck(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    """Heartbeat safety net: is the worker empty, or the deadline passed, although no signal came?"""
    worker = ctx.store.get_worker(drain.target)
    record = current_drain(worker, drain.generation, drain.restart)
    return {
        **worker_wait_plan(ctx, record),
        "empty": worker.active_instances == 0,
    }


# Rounds of "read what is active, end it" before force gives up and lets Step Functions retry the step.
# Each round ends every instance it read; only an instance that changed under it (a state report) is
# left for the next round, so a few rounds settle any realistic race.
FORCE_ROUNDS = 10
# A round that found the counter above zero but no active instance through the index waits this long
# for the index (eventually consistent on AWS) before reading again.
_INDEX_PAUSE_SECONDS = 0.2


def force(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    """The deadline passed: terminate what still runs, tell the operators, then let finish stop the worker.

    Every end is conditional on this drain generation still being active on the worker, so a cancel
    that commits mid-way stops the terminations at once (DrainCancelled). An instance whose version
    changed under us (a state report) is still active: the next round reads it again and ends it. Force
    returns only when the worker's own counter says nothing is active.

    An operator's force (POST .../drain/force) made the deadline now: its instances end with reason
    `forced`, the deadline's with `drain_timeout`.
    """
    forced: list[str] = []
    record = current_drain(ctx.store.get_worker(drain.target), drain.generation, drain.restart)
    if not deadline_passed(record.deadline, utcnow()):
        # A move refuses a deadline that has passed, so this is a clock disagreement between the re-check
        # and here, or a replayed step: nothing is ended before the deadline.
        raise DrainDeadlineMoved(
            f"the deadline of drain {drain.generation} of worker {drain.target} is "
            f"{record.deadline.isoformat()}, not passed; waiting again"
        )
    reason = ForceReason.OPERATOR if record.forced_at else ForceReason.DEADLINE
    # The deadline takes the drain over before it ends anything: a cancel that committed first is seen
    # here (DrainCancelled, nothing forced); one that comes after the mark is refused (DrainFinishing).
    take_over(ctx, drain, "the deadline passed: the drain is forced and can no longer be cancelled")
    for _ in range(FORCE_ROUNDS):
        worker = ctx.store.get_worker(drain.target)
        current_drain(worker, drain.generation, drain.restart)
        if worker.active_instances == 0:
            break
        active = ctx.store.active_instances_of(worker.id)
        if not active:
            time.sleep(_INDEX_PAUSE_SECONDS)
        for instance in active:
            try:
                ended = ctx.store.end_instance(
                    instance,
                    InstanceState.TERMINATED,
                    actor=WORKFLOW_ACTOR,
                    reason=reason,
                    drain_generation=drain.generation,
                )
            except DrainNoLongerActive as cancelled:
                # A cancel (or a close) won the race: not one more instance may be terminated.
                _record_forced(ctx, drain, forced)
                raise DrainCancelled(
                    f"drain {drain.generation} of worker {worker.id} ended while forcing: {cancelled.message}"
                ) from cancelled
            except StaleWrite:
                continue  # changed since it was read (a state report, or it ended): the next round reads it
            signal_if_drained(ctx, ended)  # it may have been its pool's last instance
            forced.append(instance.id)
            emit(
                ctx,
                "InstanceForceTerminated",
                {"instance_id": instance.id, "worker_id": worker.id, "reason": reason},
                "InstanceForceTerminated",
            )
    else:
        left = ctx.store.get_worker(drain.target).active_instances
        if left:
            # Step Functions retries the step; every round above was progress or a lost race.
            _record_forced(ctx, drain, forced)
            raise DrainNotEmpty(f"worker {drain.target} still has {left} active instances after forcing")

    timed_out = _record_forced(ctx, drain, forced)
    detail = worker_detail(timed_out, forced_instances=forced, deadline=record.deadline.isoformat())
    if record.forced_at:
        detail.update(forced_by=record.forced_by, force_reason=record.force_reason)
        subject = f"fleetkeeper: drain of worker {drain.target} forced by {record.forced_by}"
    else:
        subject = f"fleetkeeper: drain of worker {drain.target} timed out"
    ctx.notifier.notify(subject, detail)
    emit(ctx, "WorkerDrainTimedOut", detail, "DrainTimedOut")
    return {"forced_instances": len(forced)}


def _record_forced(ctx: Context, drain: DrainInput, forced: list[str]) -> Worker:
    """Add what this attempt forced to the drain record, and mark it timed out (once)."""

    def mark_timed_out() -> Worker:
        current = ctx.store.get_worker(drain.target)
        record = current.drain
        if record is None or record.generation != drain.generation or record.outcome != DrainOutcome.RUNNING:
            return current  # ended meanwhile (a close): what ended it stands
        if not forced and record.timed_out_at is not None:
            return current  # an earlier attempt recorded it; nothing new to add
        update = {
            "forced_instances": record.forced_instances + len(forced),
            "timed_out_at": record.timed_out_at or utcnow(),
        }
        why = f"drain forced by {record.forced_by}" if record.forced_at else "drain deadline passed"
        return ctx.store.update_worker(
            current,
            {"drain": record.model_copy(update=update)},
            actor=WORKFLOW_ACTOR,
            action="WorkerDrainTimedOut",
            reason=why,
        )

    return retry_conflicts(mark_timed_out)


def take_over(ctx: Context, drain: DrainInput, why: str) -> None:
    """Mark the drain as finishing, in one conditional write, before anything irreversible (a force, the
    before-stop operations, the stop). A cancel is a conditional write on the same item: if it committed
    first, this read sees it (DrainCancelled, nothing done); if this one did, the cancel's read sees the
    mark and refuses (DrainFinishing). A retry or a restarted execution finds the mark and goes on."""

    def mark() -> None:
        worker = ctx.store.get_worker(drain.target)
        record = current_drain(worker, drain.generation, drain.restart)
        if record.finishing_at is not None:
            return
        ctx.store.update_worker(
            worker,
            {"drain": record.model_copy(update={"finishing_at": utcnow()})},
            actor=WORKFLOW_ACTOR,
            action="WorkerDrainFinishing",
            reason=why,
        )

    retry_conflicts(mark)


def finish(ctx: Context, drain: DrainInput) -> dict[str, Any]:
    """DRAINING → STOPPING (then=stop) or TERMINATING (then=terminate), and ask EC2 to do it.

    Only an empty worker is finished. A success answer that came while work still runs (a re-arm after
    the deadline moved, a replayed or forged token, a race) raises DrainNotEmpty, which the state machine
    routes back to its re-check: it waits again before the deadline and forces after it.
    """

    def finishable() -> tuple[Worker, DrainRecord | None]:
        """The worker as read, and its drain record when this step still has to finish it (None: an
        earlier attempt of this step did)."""
        worker = ctx.store.get_worker(drain.target)
        record = worker.drain
        if (
            record is not None
            and record.generation == drain.generation
            and record.finished_at
            and record.outcome in (DrainOutcome.SUCCESS, DrainOutcome.TIMED_OUT)
        ):
            return worker, None
        record = current_drain(worker, drain.generation, drain.restart)
        if worker.status != WorkerStatus.DRAINING:
            raise DrainNotStartable(f"worker {worker.id} is {worker.status}, not DRAINING")
        if worker.active_instances > 0:
            # The writes below are conditional on this very read (version), so no instance can slip in
            # between the check and the write.
            raise DrainNotEmpty(
                f"worker {worker.id} still has {worker.active_instances} active instances; waiting again"
            )
        return worker, record

    def mark_finishing() -> None:
        _, record = finishable()
        if record is not None and record.finishing_at is None:
            take_over(
                ctx, drain, "before-stop operations and the stop follow; the drain can no longer be cancelled"
            )

    def complete() -> Worker:
        worker, record = finishable()
        if record is None:
            return worker  # finished by an earlier attempt of this step
        target = WorkerStatus.TERMINATING if record.then == DrainThen.TERMINATE else WorkerStatus.STOPPING
        outcome = DrainOutcome.TIMED_OUT if record.timed_out_at else DrainOutcome.SUCCESS
        done = record.model_copy(update={"outcome": outcome, "finished_at": utcnow(), "task_token": None})
        return ctx.store.transition_worker(
            worker,
            target,
            cause=Cause.CONTROL,
            actor=WORKFLOW_ACTOR,
            reason=f"drain {outcome.value.lower()}",
            action="WorkerDrainCompleted",
            changes={"drain": done},
        )

    retry_conflicts(mark_finishing)
    # The template's before_stop operations run on the emptied worker, before it may stop; their failure
    # is audited and alarmed there, and never keeps the worker from stopping.
    operations.run_before_stop(ctx, drain.target, drain.generation, actor=WORKFLOW_ACTOR)
    worker = retry_conflicts(complete)
    record = drain_of(worker)
    if worker.ec2_instance_id:
        # If this call fails the step is retried; if it never succeeds the reconciler's STOPPING and
        # TERMINATING handlers repeat it, so the worker cannot stay half-stopped.
        gateway = ctx.ec2(worker.region)
        try:
            if record.then == DrainThen.TERMINATE:
                gateway.terminate(worker.ec2_instance_id)
            else:
                gateway.stop(worker.ec2_instance_id)
        except ClientError as exc:
            if not is_missing_instance(exc):
                raise
            # The machine is already gone: the drain still succeeded; discovery records the orphan.
            logger.warning(
                "drained worker has no EC2 instance any more",
                extra={"worker_id": worker.id, "ec2_instance_id": worker.ec2_instance_id},
            )
    duration = (record.finished_at or utcnow()) - record.started_at
    metrics.add_metric(name="DrainDurationSeconds", unit="Seconds", value=duration.total_seconds())
    emit(
        ctx,
        "WorkerDrainCompleted",
        worker_detail(worker, duration_seconds=duration.total_seconds()),
        "DrainCompleted",
    )
    return {"worker_status": str(worker.status), "outcome": str(record.outcome)}


def record_error(ctx: Context, drain: DrainInput, error: dict[str, Any] | None) -> dict[str, Any]:
    """The final catch: record ERROR on the drain so it never fails silently."""
    text = _error_text(error)
    if drain.kind == "pool":
        return record_pool_error(ctx, drain, text)

    def mark() -> Worker:
        worker = ctx.store.get_worker(drain.target)
        record = worker.drain
        if record is not None and record.generation > drain.generation:
            return worker  # a newer drain owns the worker now; this stale execution must not touch it
        if record is not None and record.generation == drain.generation:
            if record.outcome != DrainOutcome.RUNNING:
                return worker  # already ended (e.g. finished, then EC2 refused): keep that outcome
            if record.restarts != drain.restart:
                return worker  # the watchdog replaced this execution; the replacement owns the drain
            failed = record.model_copy(
                update={
                    "outcome": DrainOutcome.ERROR,
                    "error": text,
                    "finished_at": utcnow(),
                    "task_token": None,
                }
            )
        else:
            failed = drain.record(outcome=DrainOutcome.ERROR, error=text, finished_at=utcnow())
        marked = ctx.store.update_worker(
            worker, {"drain": failed}, actor=WORKFLOW_ACTOR, action="WorkerDrainFailed", reason=text
        )
        # Only the attempt whose write ended the drain audits its before-stop operations: a retried
        # step finds the drain already ended and says nothing twice.
        failed_here.append(True)
        return marked

    failed_here: list[bool] = []
    worker = retry_conflicts(mark)
    if failed_here:
        try:
            # A drain marked finishing that ends here is stopped by the reconciler without its
            # before-stop operations (a transient failure that outlasted the step's retries).
            operations.abandon_before_stop(ctx, worker, drain.generation, text)
        except Exception:  # the DrainFailed alarm below still fires
            logger.exception("before-stop operations of a failed drain not audited", worker_id=worker.id)
    emit(ctx, "WorkerDrainFailed", worker_detail(worker, error=text), "DrainFailed")
    logger.error("drain failed", extra={"worker_id": worker.id, "error": text})
    return {"outcome": "ERROR"}


def _error_text(error: dict[str, Any] | None) -> str:
    if not error:
        return "unknown error"
    return f"{error.get('Error', 'Error')}: {str(error.get('Cause', ''))[:500]}"


def run_step(ctx: Context, request: StepRequest) -> dict[str, Any]:
    """Run one workflow step; named errors (DrainCancelled, DrainNotStartable) steer the state machine."""
    drain = request.drain
    match request.step:
        case "begin":
            return begin(ctx, drain)
        case "await_empty" | "pool_await_empty":
            if not request.task_token:
                raise DrainNotStartable(f"{request.step} needs the task token")
            if request.step == "await_empty":
                await_empty(ctx, drain, request.task_token, request.armed_deadline)
            else:
                pool_await_empty(ctx, drain, request.task_token)
            return {"registered": True}
        case "recheck":
            return recheck(ctx, drain)
        case "force":
            return force(ctx, drain)
        case "finish":
            return finish(ctx, drain)
        case "record_error":
            return record_error(ctx, drain, request.error)
        case "pool_begin" | "pool_recheck":
            # Both report the time left and whether the pool is already empty.
            return pool_begin(ctx, drain)
        case "pool_finish":
            return pool_finish(ctx, drain, timed_out=request.timed_out)
