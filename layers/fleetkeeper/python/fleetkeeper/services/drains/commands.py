"""Worker drain commands: plan, start, cancel, close and status (what operators and hooks ask for)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.admission import Ask, Claim, Held, Imposed
from fleetkeeper.domain.drain_policy import (
    MAX_DEADLINE_MOVES,
    deadline_passed,
    drain_deadline,
    estimated_completion,
    moved,
    moved_deadline,
    worker_drain_timeout,
)
from fleetkeeper.domain.errors import (
    Conflict,
    DeadlinePassed,
    DisruptionHeld,
    DrainFinishing,
    DrainInProgress,
    TooManyDeadlineMoves,
    WorkflowUnavailable,
)
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import (
    DrainOutcome,
    DrainRecord,
    DrainThen,
    Owner,
    Worker,
    utcnow,
)
from fleetkeeper.observability import logger, metrics
from fleetkeeper.services import admission
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains._shared import drain_of, emit, worker_detail
from fleetkeeper.services.drains.contract import WORKFLOW_ACTOR, DrainInput, DrainStatus, execution_name
from fleetkeeper.services.drains.reschedule import plan_moves
from fleetkeeper.services.drains.signals import rearm_answer


def _refusal(worker: Worker) -> Conflict | None:
    if worker.status == WorkerStatus.DRAINING and (
        worker.drain is None or worker.drain.outcome == DrainOutcome.RUNNING
    ):
        return DrainInProgress("worker", worker.id)
    # A DRAINING worker whose drain ended in ERROR may be drained again: that is its way out.
    if worker.status not in (WorkerStatus.RUNNING, WorkerStatus.DRAINING):
        return Conflict(
            "worker",
            worker.id,
            worker.status,
            f"worker {worker.id} is {worker.status}; only a RUNNING worker can be drained",
        )
    return None


def status_of(ctx: Context, worker: Worker, now: datetime | None = None) -> DrainStatus:
    """The drain status view of a worker as read."""
    now = now or utcnow()
    record = worker.drain
    if record is None:
        return DrainStatus(
            worker_id=worker.id,
            status="NOT_RUN",
            worker_status=worker.status,
            active_instances=worker.active_instances,
        )
    estimate = None
    if record.outcome == DrainOutcome.RUNNING:
        estimate = estimated_completion(ctx.store.active_instances_of(worker.id), record.deadline, now)
    return DrainStatus(
        worker_id=worker.id,
        status=record.outcome.value,
        worker_status=worker.status,
        generation=record.generation,
        started_at=record.started_at,
        deadline=record.deadline,
        timeout_seconds=record.timeout_seconds,
        reason=record.reason,
        requested_by=record.requested_by,
        then=record.then,
        active_instances=worker.active_instances,
        forced_instances=record.forced_instances,
        reschedule=record.reschedule,
        moved_instances=record.moved_instances,
        left_instances=worker.active_instances,
        estimated_completion=estimate,
        execution_arn=record.execution_arn,
        finishing_at=record.finishing_at,
        finished_at=record.finished_at,
        cancelled_by=record.cancelled_by,
        error=record.error,
        deadline_moves=record.deadline_moves,
        forced_at=record.forced_at,
        forced_by=record.forced_by,
        force_reason=record.force_reason,
    )


def worker_drain_status(ctx: Context, worker_id: str) -> DrainStatus:
    return status_of(ctx, ctx.store.get_worker(worker_id))


def plan_worker_drain(
    ctx: Context,
    worker_id: str,
    *,
    timeout_seconds: int | None = None,
    then: DrainThen = DrainThen.STOP,
    reason: str | None = None,
    reschedule: bool = True,
    actor: str,
) -> DrainStatus:
    """What a drain would do now, without doing it (dry run)."""
    now = utcnow()
    worker = ctx.store.get_worker(worker_id)
    timeout = worker_drain_timeout(timeout_seconds, ctx.store.find_template(worker.template))
    deadline = drain_deadline(now, timeout)
    refusal = _refusal(worker)
    active = ctx.store.active_instances_of(worker.id)
    movable = {i.id for i in plan_moves(ctx, worker)} if reschedule and refusal is None else set()
    staying = [i for i in active if i.id not in movable]
    return DrainStatus(
        worker_id=worker.id,
        status="NOT_RUN",
        worker_status=worker.status,
        started_at=now,
        deadline=deadline,
        timeout_seconds=timeout,
        reason=reason,
        requested_by=actor,
        then=then,
        active_instances=worker.active_instances,
        reschedule=reschedule,
        moved_instances=len(movable),
        left_instances=max(worker.active_instances - len(movable), 0),
        estimated_completion=estimated_completion(staying, deadline, now),
        dry_run=True,
        may_start=refusal is None,
        refusal=refusal.message if refusal else None,
    )


def start_worker_drain(
    ctx: Context,
    worker_id: str,
    *,
    actor: str,
    reason: str | None = None,
    timeout_seconds: int | None = None,
    then: DrainThen = DrainThen.STOP,
    reschedule: bool = True,
    ask: Ask | None = None,
) -> DrainStatus:
    """Take the worker out of placement now (RUNNING → DRAINING) and start its drain workflow.

    The drain passes the door for disruption (services/admission.py) as `ask` says, by default an
    operator's command: it takes the worker over from any voluntary owner. A voluntary ask the door
    holds back raises DisruptionHeld (409, saying why).

    With `reschedule` (the default) the workflow's begin step moves the worker's SCHEDULED instances
    to other workers with room (services/drains/reschedule.py).

    The status change happens here, before the request returns, so no instance can land on the worker
    once the caller has its 202. The workflow's begin step accepts a worker that is already DRAINING
    for the same generation.
    """
    with admission.door(ctx) as door:
        opened = open_drain(
            ctx,
            door,
            worker_id,
            ask or Ask(Imposed.OPERATOR, actor),
            actor=actor,
            reason=reason,
            timeout_seconds=timeout_seconds,
            then=then,
            reschedule=reschedule,
        )
    if isinstance(opened, Held):
        raise DisruptionHeld(worker_id, str(opened.why), opened.detail)
    return status_of(ctx, opened)


def open_drain(
    ctx: Context,
    door: admission.Door,
    worker_id: str,
    ask: Ask,
    *,
    actor: str,
    reason: str | None = None,
    timeout_seconds: int | None = None,
    then: DrainThen = DrainThen.STOP,
    reschedule: bool = True,
    expect: admission.Expect | None = None,
) -> Worker | Held:
    """The drain of one worker through `door`: the worker as its drain started, or what holds it back.

    The write that admits the disruption is the one that starts the drain (RUNNING → DRAINING with its
    record and its owner), so no one else can take the worker in between; a worker that fails `expect`
    on that write's read is not drained (NoLongerDue)."""
    now = utcnow()

    def mark_draining(worker: Worker, owner: Owner, claim: Claim | None) -> Worker:
        refusal = _refusal(worker)
        if refusal is not None:
            raise refusal
        timeout = worker_drain_timeout(timeout_seconds, ctx.store.find_template(worker.template))
        generation = worker.next_drain_generation
        record = DrainRecord(
            generation=generation,
            started_at=now,
            deadline=drain_deadline(now, timeout),
            timeout_seconds=timeout,
            reason=reason,
            requested_by=actor,
            then=then,
            reschedule=reschedule,
            execution_arn=ctx.workflows.execution_arn(execution_name("drain", worker.id, generation)),
        )
        changes = {"drain": record, "owner": owner}
        if worker.status == WorkerStatus.RUNNING:
            return ctx.store.transition_worker(
                worker,
                WorkerStatus.DRAINING,
                cause=Cause.CONTROL,
                actor=actor,
                reason=reason,
                action="WorkerDrainStarted",
                changes=changes,
                claim=claim,
            )
        return ctx.store.update_worker(
            worker, changes, actor=actor, action="WorkerDrainRestarted", reason=reason, claim=claim
        )

    worker = door.admit(worker_id, ask, admission.expecting(mark_draining, expect))
    if isinstance(worker, Held):
        return worker
    record = drain_of(worker)
    # A crash right here leaves a DRAINING worker without an execution: the watchdog starts it.
    try:
        launch_worker_drain(ctx, worker.id, record)
    except Exception as exc:
        _undo_unstarted_drain(ctx, worker.id, record.generation, exc)
        raise WorkflowUnavailable(
            f"the drain workflow could not start ({exc}); worker {worker.id} is back to its previous state"
        ) from exc
    emit(
        ctx,
        "WorkerDrainStarted",
        worker_detail(worker, timeout_seconds=record.timeout_seconds),
        "DrainStarted",
    )
    logger.info("drain started", extra={"worker_id": worker.id, "generation": record.generation})
    return worker


def launch_worker_drain(ctx: Context, worker_id: str, record: DrainRecord) -> str:
    """Start the execution that serves this drain record; starting it twice is harmless.

    The name and input are derived from the record alone, so a retry (or the watchdog) that starts it
    again gets the same execution back rather than a second one.
    """
    drain_input = DrainInput.of_worker(ctx, worker_id, record)
    return ctx.workflows.start(drain_input.execution_name, drain_input.model_dump(mode="json"))


def _undo_unstarted_drain(ctx: Context, worker_id: str, generation: int, cause: Exception) -> None:
    """Put back a worker whose drain workflow never started, so it is not left draining for nothing."""

    def undo() -> None:
        worker = ctx.store.get_worker(worker_id)
        record = worker.drain
        if record is None or record.generation != generation or worker.status != WorkerStatus.DRAINING:
            return
        failed = record.model_copy(
            update={
                "outcome": DrainOutcome.ERROR,
                "finished_at": utcnow(),
                "error": f"workflow did not start: {cause}",
            }
        )
        ctx.store.transition_worker(
            worker,
            WorkerStatus.RUNNING,
            cause=Cause.CONTROL,
            actor=WORKFLOW_ACTOR,
            reason="drain workflow did not start",
            action="WorkerDrainFailed",
            changes={"drain": failed},
        )

    retry_conflicts(undo)
    metrics.add_metric(name="DrainFailed", unit="Count", value=1)


def cancel_worker_drain(ctx: Context, worker_id: str, *, actor: str, reason: str | None = None) -> Worker:
    """Admin cancel: DRAINING → RUNNING, and the waiting workflow fails with DrainCancelled.

    Refused (DrainFinishing, a 409) once the drain's Finish step has begun: see docs/drains.md, Cancel.
    """
    now = utcnow()

    def cancel() -> tuple[Worker, Worker]:
        worker = ctx.store.get_worker(worker_id)
        if worker.status != WorkerStatus.DRAINING:
            raise Conflict(
                "worker",
                worker.id,
                worker.status,
                f"worker {worker.id} is {worker.status}; only a DRAINING worker has a drain to cancel",
            )
        record = worker.drain
        if record is not None and record.finishing_at is not None:
            # Finish marked the drain (a conditional write, like this one) before it sent anything
            # irreversible: whichever of the two writes comes second sees the other.
            raise DrainFinishing(worker.id, record.generation, worker.status)
        changes: dict[str, Any] = {}
        audit_reason = "drain cancelled"
        if worker.desired_status in (WorkerStatus.STOPPED, WorkerStatus.TERMINATED):
            # A cancel means "keep this worker running": a desired STOPPED or TERMINATED would make the
            # next reconcile cycle drain it again, undoing the cancel. See docs/drains.md.
            changes["desired_status"] = None
            audit_reason = f"drain cancelled; desired status {worker.desired_status} cleared"
        if reason:
            audit_reason = f"{audit_reason}: {reason}"
        cancelled = None
        if record is not None:
            final = record.outcome if record.outcome != DrainOutcome.RUNNING else DrainOutcome.CANCELLED
            cancelled = record.model_copy(
                update={
                    "outcome": final,
                    "cancelled_by": actor,
                    "cancel_reason": reason,
                    "finished_at": record.finished_at or now,
                    "task_token": None,
                }
            )
        after = ctx.store.transition_worker(
            worker,
            WorkerStatus.RUNNING,
            cause=Cause.CONTROL,
            actor=actor,
            reason=audit_reason,
            action="WorkerDrainCancelled",
            changes={**changes, "drain": cancelled},
        )
        return worker, after

    before, after = retry_conflicts(cancel)
    # If the token is not stored yet, await-empty will find the drain cancelled and fail itself.
    token = before.drain.task_token if before.drain else None
    if token:
        ctx.workflows.fail(token, "DrainCancelled", f"drain cancelled by {actor}")
    emit(
        ctx,
        "WorkerDrainCancelled",
        worker_detail(after, cancelled_by=actor, cancel_reason=reason),
        "DrainCancelled",
    )
    return after


def close_drain(ctx: Context, worker: Worker, *, outcome: DrainOutcome, reason: str, actor: str) -> Worker:
    """End the open drain of a worker that went away (orphan GC, console termination).

    The worker's status is left as it is; only the drain record closes, and its workflow stops waiting.
    """

    def close() -> tuple[Worker, str | None]:
        current = ctx.store.get_worker(worker.id)
        record = current.drain
        if record is None or record.outcome != DrainOutcome.RUNNING:
            return current, None
        closed = record.model_copy(
            update={"outcome": outcome, "finished_at": utcnow(), "error": reason, "task_token": None}
        )
        updated = ctx.store.update_worker(
            current, {"drain": closed}, actor=actor, action="WorkerDrainClosed", reason=reason
        )
        return updated, record.task_token

    updated, token = retry_conflicts(close)
    if token:
        ctx.workflows.fail(token, "DrainCancelled", reason)
    return updated


# ---- moving a running drain's deadline, forcing it now (docs/drains.md, "Moving the deadline") ------


def _open_drain(worker: Worker, generation: int | None, *, verb: str, refused: str) -> DrainRecord:
    """The running drain a deadline move or a force acts on, or the 409 that says why there is none."""
    record = worker.drain
    if worker.status != WorkerStatus.DRAINING or record is None:
        raise Conflict(
            "worker",
            worker.id,
            worker.status,
            f"worker {worker.id} is {worker.status}; only a DRAINING worker has a drain to {verb}",
        )
    if generation is not None and record.generation != generation:
        raise Conflict(
            "worker",
            worker.id,
            worker.status,
            f"drain {generation} is not the current drain of worker {worker.id}: "
            f"drain {record.generation} is",
        )
    if record.finishing_at is not None:
        raise DrainFinishing(worker.id, record.generation, worker.status, refused)
    if record.outcome != DrainOutcome.RUNNING:
        raise Conflict(
            "worker",
            worker.id,
            worker.status,
            f"drain {record.generation} of worker {worker.id} ended {record.outcome}: no workflow waits on "
            "its deadline; cancel it, or drain the worker again",
        )
    return record


def _rearm(ctx: Context, worker_id: str, token: str | None) -> None:
    """End the wait armed for the old deadline, so the workflow arms the next one for the new deadline.

    The write that moved the deadline cleared the stored token, so nothing else answers it. Without a
    token (no wait under way, or it is between two waits) there is nothing to answer: the next wait
    finds its plan's deadline stale and re-arms itself (steps.await_empty). If this call fails after
    its retries, the old wait still ends at its heartbeat (no sweep heartbeats a cleared token) and the
    re-check that follows reads the new deadline.
    """
    if token:
        ctx.workflows.succeed(token, rearm_answer(worker_id))


def move_worker_drain_deadline(
    ctx: Context,
    worker_id: str,
    *,
    timeout_seconds: int,
    actor: str,
    reason: str | None = None,
    generation: int | None = None,
) -> DrainStatus:
    """Move the running drain's deadline, earlier or later, to its start plus `timeout_seconds`.

    The running execution honours it without a restart (its wait is answered with a re-arm). A deadline
    that would be past is now: the drain is forced at once, with reason `drain_timeout` as at any
    deadline. The same timeout again changes nothing. Refused (409) when the worker is not DRAINING,
    `generation` is not its current drain, the drain is finishing or ended, its deadline has passed, or
    it already moved MAX_DEADLINE_MOVES times.
    """

    def move() -> tuple[Worker, DrainRecord | None]:
        worker = ctx.store.get_worker(worker_id)
        record = _open_drain(worker, generation, verb="move the deadline of", refused="a deadline move")
        now = utcnow()
        if deadline_passed(record.deadline, now):
            if deadline_passed(drain_deadline(record.started_at, timeout_seconds), now):
                # Asked for a deadline that has passed too (a retried request that forced the drain):
                # the drain is being forced, as asked. Nothing to write or signal.
                return worker, None
            raise DeadlinePassed(worker.id, record.generation, worker.status, record.deadline.isoformat())
        deadline, timeout = moved_deadline(record.started_at, timeout_seconds, now)
        if deadline == record.deadline:
            return worker, None  # already so: a repeated request writes and signals nothing
        if record.deadline_moves >= MAX_DEADLINE_MOVES:
            raise TooManyDeadlineMoves(worker.id, record.generation, worker.status, MAX_DEADLINE_MOVES)
        after = _write_deadline(
            ctx,
            worker,
            record,
            (deadline, timeout, now),
            {"deadline_moves": record.deadline_moves + 1},
            actor=actor,
            action="WorkerDrainDeadlineMoved",
            reason=reason,
        )
        return after, record

    worker, before = retry_conflicts(move)
    if before is not None:
        _announce(
            ctx,
            worker,
            before,
            "WorkerDrainDeadlineMoved",
            moved_by=actor,
            move_reason=reason,
            deadline_moves=drain_of(worker).deadline_moves,
        )
        logger.info(
            "drain deadline moved",
            extra={
                "worker_id": worker.id,
                "from": before.deadline.isoformat(),
                "to": drain_of(worker).deadline.isoformat(),
            },
        )
    return status_of(ctx, worker)


def force_worker_drain(
    ctx: Context, worker_id: str, *, actor: str, reason: str | None = None, generation: int | None = None
) -> DrainStatus:
    """Force the running drain now: its deadline becomes now, and the workflow's force step ends every
    active instance with reason `forced`; the drain ends TIMED_OUT (SUCCESS if the worker emptied first).

    A drain already past its deadline (forced, or timed out) is being forced: the request changes
    nothing and answers its status. Refused (409) when the worker is not DRAINING, `generation` is not
    its current drain, or the drain is finishing or ended. A force is allowed however often the deadline
    moved.
    """

    def mark() -> tuple[Worker, DrainRecord | None]:
        worker = ctx.store.get_worker(worker_id)
        record = _open_drain(worker, generation, verb="force", refused="a force")
        now = utcnow()
        if record.forced_at is not None or deadline_passed(record.deadline, now):
            return worker, None  # its force is under way
        deadline, timeout = moved_deadline(record.started_at, 0, now)
        after = _write_deadline(
            ctx,
            worker,
            record,
            (deadline, timeout, now),
            {"forced_at": now, "forced_by": actor, "force_reason": reason},
            actor=actor,
            action="WorkerDrainForced",
            reason=reason,
        )
        return after, record

    worker, before = retry_conflicts(mark)
    if before is not None:
        _announce(ctx, worker, before, "WorkerDrainForced", forced_by=actor, force_reason=reason)
        logger.info("drain forced", extra={"worker_id": worker.id, "forced_by": actor})
    return status_of(ctx, worker)


def _write_deadline(
    ctx: Context,
    worker: Worker,
    record: DrainRecord,
    moved_to: tuple[datetime, int, datetime],
    extra: dict[str, object],
    *,
    actor: str,
    action: str,
    reason: str | None,
) -> Worker:
    """Write the drain's new deadline (with `extra` on its record) and drop its stored task token, audited.

    Conditional on the version read: a cancel, a completion, the workflow storing its token or a watchdog
    restart that commits first makes this write fail, and the caller tries again on a fresh read.
    `moved_to` is (deadline, timeout seconds, now).
    """
    deadline, timeout, now = moved_to
    changes = moved(record, deadline, timeout, now, ctx.settings.drain_heartbeat_seconds)
    update = {**changes, **extra, "task_token": None}
    return ctx.store.update_worker(
        worker,
        {"drain": record.model_copy(update=update)},
        actor=actor,
        action=action,
        reason=reason,
        details={
            "generation": record.generation,
            "from": record.deadline.isoformat(),
            "to": deadline.isoformat(),
        },
    )


def _announce(ctx: Context, worker: Worker, before: DrainRecord, event: str, **detail: object) -> None:
    """Answer the running execution's wait with a re-arm, so it honours the new deadline without a
    restart, and publish the change."""
    _rearm(ctx, worker.id, before.task_token)
    emit(ctx, event, worker_detail(worker, from_deadline=before.deadline.isoformat(), **detail))
