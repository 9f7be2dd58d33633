"""Worker operations through SSM Run Command: request, run, observe, retry, and the before-stop hook.

- `request` stores a PENDING operation and takes the worker's one-at-a-time lock (store/operations.py).
- `advance` moves one operation a step, always from a fresh read: a due PENDING one is claimed (a
  conditional write: of two reconcilers only one sends) and sent with SendCommand to the worker's
  machine; a RUNNING one's invocation is read with GetCommandInvocation and its result recorded. A
  failed attempt is retried after a backoff until the catalogue's max_attempts are spent.
- `reconcile_operations` is the reconciler's hook: every open operation one step, each isolated (a bad
  record is logged and counted, nothing else waits for it), then the system-information schedule.
- `run_before_stop` runs the template's before_stop operations on a drained worker, bounded by a
  timeout; a failure is audited and alarmed but never keeps the worker from stopping.

Operation parameters are references (a parameter name, a version), never secrets: the documents read
secrets from SSM Parameter Store on the machine. Nothing here logs parameter values. docs/operations.md.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from aws_lambda_powertools.metrics import MetricUnit, single_metric
from botocore.exceptions import BotoCoreError, ClientError
from pydantic import ValidationError

from fleetkeeper.cloud import ssm
from fleetkeeper.cloud.fleet_reads import NOMINAL_CYCLE_SECONDS
from fleetkeeper.cloud.retry import is_retryable, retry_conflicts
from fleetkeeper.domain.errors import Conflict, InvalidInput, NotFound, StaleWrite, Unavailable
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import AuditEvent, Worker, utcnow
from fleetkeeper.domain.operations import (
    CLAIM_GRACE_SECONDS,
    SYSTEM_INFO_OPERATION,
    Operation,
    OperationInFlight,
    OperationOrigin,
    OperationStatus,
    after_failed_attempt,
    excerpt,
    new_operation_id,
    parse_system_info,
    system_info_due,
)
from fleetkeeper.observability import NAMESPACE, SERVICE, logger, metrics
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.services.context import Context
from fleetkeeper.store.table import Page

ACTOR: Final = "operations"
# Metric names (infra/metrics.py holds the same list). Per-operation ones carry an `operation` dimension.
METRIC_SUCCEEDED: Final = "OperationSucceeded"
METRIC_FAILED: Final = "OperationFailed"
METRIC_RETRIED: Final = "OperationRetried"
METRIC_BEFORE_STOP_FAILED: Final = "BeforeStopOperationFailed"
# The finish step looks at its before-stop operations soon after sending (short commands finish in
# about a second), then less often, at most this far apart.
BEFORE_STOP_POLL_SECONDS: Final = 2.0
BEFORE_STOP_FIRST_POLL_SECONDS: Final = 0.25
# Operations stepped at once by a reconcile cycle (each step is one or two SSM calls).
PARALLELISM: Final = 8
# A drain's before-stop step reads the worker's operations since the drain started, at most this many:
# on a DRAINING worker only cleanup operations run, one at a time, so a drain has a handful. The margin
# covers the clocks of the function that started the drain and the one that requested the operations.
BEFORE_STOP_READ_LIMIT: Final = 100
BEFORE_STOP_CLOCK_SKEW: Final = timedelta(minutes=5)


def request(
    ctx: Context,
    worker_id: str,
    name: str,
    parameters: Mapping[str, str],
    *,
    actor: str,
    origin: OperationOrigin = OperationOrigin.REQUEST,
    drain_generation: int | None = None,
) -> Operation:
    """A new PENDING operation on the worker: 422 for a name or parameter the catalogue refuses, 404 for
    no worker, 409 for a worker in the wrong status or one with an operation in flight."""
    catalogue = ctx.settings.operations_catalogue
    spec = catalogue.spec(name)
    resolved = catalogue.parameters_for(name, parameters)
    now = utcnow()
    op = Operation(
        id=new_operation_id(now),
        worker_id=worker_id,
        name=name,
        document=spec.document,
        parameters=resolved,
        origin=origin,
        requested_by=actor,
        drain_generation=drain_generation,
        max_attempts=spec.max_attempts,
        timeout_seconds=spec.timeout_seconds,
        created_at=now,
        updated_at=now,
    )
    try:
        return ctx.store.request_operation(op, spec.allowed_statuses, actor=actor)
    except OperationInFlight as busy:
        stale = _stale_lock(ctx, worker_id, busy.operation_id)
        if stale is None:
            raise
        # A lock no live operation holds would refuse every request for ever: it is released (if it
        # still names that operation) and the request tried once more.
        ctx.store.release_operation_lock(worker_id, str(busy.operation_id), actor=actor, reason=stale)
        return ctx.store.request_operation(op, spec.allowed_statuses, actor=actor)


def _stale_lock(ctx: Context, worker_id: str, holder: str | None) -> str | None:
    """Why the worker's lock holds no live operation, or None when it does."""
    if not holder:
        return "the lock names no operation"
    try:
        held = ctx.store.find_operation(worker_id, holder)
    except ValidationError:
        return f"operation {holder} is unreadable"
    if held is None:
        return f"operation {holder} does not exist"
    if held.finished:
        return f"operation {holder} is {held.status}"
    return None


def page(ctx: Context, worker_id: str, *, limit: int, next_token: str | None) -> Page[Operation]:
    """One page of the worker's operations, newest first; NotFound for an unknown worker."""
    ctx.store.get_worker(worker_id)
    return ctx.store.list_operations(worker_id, limit=limit, next_token=next_token)


# ---- one step of one operation ----------------------------------------------------------------------


def advance(ctx: Context, op: Operation, now: datetime) -> Operation:
    """Move the operation (as read from the table) one step; returns it as it is now."""
    if op.finished:
        return op
    worker = ctx.store.find_worker(op.worker_id)
    spec = ctx.settings.operations_catalogue.operations.get(op.name)
    gone = _why_not_runnable(op, worker, spec is not None)
    if gone is not None or worker is None:
        return _cancel(ctx, op, worker, gone or "the worker is gone", now)
    if op.status == OperationStatus.PENDING:
        if not op.due(now):
            return op
        if spec is not None and not spec.runs_on(worker.status):
            return _cancel(
                ctx, op, worker, f"the worker is {worker.status}; '{op.name}' runs on RUNNING", now
            )
        return _send(ctx, op, worker, now)
    gateway = ssm.CommandGateway(ctx.ssm(worker.region))
    if op.command_id is None or op.target_instance_id is None:
        if op.attempt_started_at and now - op.attempt_started_at > timedelta(seconds=CLAIM_GRACE_SECONDS):
            return _recover_claim(ctx, gateway, op, now)
        return op  # its sender is (probably) still at it
    try:
        invocation = gateway.invocation(op.command_id, op.target_instance_id)
    except (ClientError, BotoCoreError, Unavailable) as error:
        if isinstance(error, Unavailable) or not ssm.is_final(error):
            raise  # read again next cycle
        return _attempt_failed(ctx, op, ssm.describe(error), now)
    if invocation is None or invocation.in_progress:
        if op.attempt_expired(now):
            gateway.cancel(op.command_id, op.target_instance_id)
            return _attempt_failed(ctx, op, f"timed out after {op.timeout_seconds} s", now)
        return op
    if not invocation.succeeded:
        return _attempt_failed(
            ctx, op, invocation.failure(), now, output=excerpt(invocation.stdout, invocation.stderr)
        )
    if op.name == SYSTEM_INFO_OPERATION:
        try:
            info = parse_system_info(invocation.stdout)
        except ValueError as bad:
            return _attempt_failed(ctx, op, f"system information unreadable: {bad}", now)
        _store_system_info(ctx, op.worker_id, info, now)
    done = ctx.store.save_operation(
        op,
        {
            "status": OperationStatus.SUCCESS,
            "finished_at": now,
            "output": excerpt(invocation.stdout, invocation.stderr),
            "error": None,
        },
        actor=ACTOR,
        action="OperationSucceeded",
    )
    _count(METRIC_SUCCEEDED, op.name)
    logger.info("operation succeeded", operation_id=op.id, worker_id=op.worker_id, operation=op.name)
    return done


def _why_not_runnable(op: Operation, worker: Worker | None, known: bool) -> str | None:
    if worker is None:
        return "the worker is gone"
    if not known:
        return f"'{op.name}' is no longer in the stage's catalogue"
    if worker.status not in (WorkerStatus.RUNNING, WorkerStatus.DRAINING) or not worker.ec2_instance_id:
        return f"the worker is {worker.status}"
    if op.target_instance_id and op.target_instance_id != worker.ec2_instance_id:
        return "the worker's machine was replaced"
    return None


def _send(ctx: Context, op: Operation, worker: Worker, now: datetime) -> Operation:
    instance_id = str(worker.ec2_instance_id)
    # Claimed before sending: a concurrent reconciler's claim of the same read fails (StaleWrite).
    claimed = ctx.store.save_operation(
        op,
        {
            "status": OperationStatus.RUNNING,
            "attempts": op.attempts + 1,
            "attempt_started_at": now,
            "command_id": None,
            "target_instance_id": instance_id,
            "next_attempt_at": None,
        },
        actor=ACTOR,
    )
    try:
        command_id = ssm.CommandGateway(ctx.ssm(worker.region)).send(
            instance_id, op.document, op.parameters, comment=_comment(op)
        )
    except ssm.SendOutcomeUnknown as unknown:
        # The command may have gone out: the claim stays, and after its grace the command is looked up
        # by its comment and adopted, or the attempt counted as failed (_recover_claim).
        logger.warning("SendCommand outcome unknown", operation_id=op.id, error=str(unknown))
        return claimed
    except (ClientError, BotoCoreError, Unavailable) as error:
        # Throttling that outlasted the retries and a refusal (unmanaged or offline machine) alike
        # cost this attempt; the backoff spaces the next one.
        why = ssm.describe(error) if not isinstance(error, Unavailable) else error.message
        return _attempt_failed(ctx, claimed, f"SendCommand failed: {why}", now)
    return ctx.store.save_operation(claimed, {"command_id": command_id}, actor=ACTOR)


def _comment(op: Operation) -> str:
    """What the command carries to be found again: the operation id (ids are unique)."""
    return f"fleetkeeper {op.id} {op.name}"


def _recover_claim(ctx: Context, gateway: ssm.CommandGateway, op: Operation, now: datetime) -> Operation:
    """A claim whose sender died before recording the command: adopt the command if it was sent (so it
    is not sent twice), else count the attempt as failed."""
    if op.target_instance_id and op.attempt_started_at:
        sent = gateway.find_command(
            op.target_instance_id, _comment(op), sent_after=op.attempt_started_at - timedelta(minutes=1)
        )
        if sent is not None:
            logger.info("operation command recovered", operation_id=op.id, command_id=sent)
            return ctx.store.save_operation(op, {"command_id": sent}, actor=ACTOR)
    return _attempt_failed(ctx, op, "the attempt was claimed but never sent", now)


def _attempt_failed(
    ctx: Context, op: Operation, reason: str, now: datetime, *, output: str | None = None
) -> Operation:
    changes = after_failed_attempt(op, reason, now, ctx.settings.operation_retry_base_seconds)
    if output is not None:
        changes["output"] = output
    final = changes["status"] == OperationStatus.FAILED
    saved = ctx.store.save_operation(
        op,
        changes,
        actor=ACTOR,
        action="OperationFailed" if final else "OperationAttemptFailed",
        reason=reason,
    )
    _count(METRIC_FAILED if final else METRIC_RETRIED, op.name)
    logger.warning(
        "operation attempt failed",
        operation_id=op.id,
        worker_id=op.worker_id,
        operation=op.name,
        attempts=op.attempts,
        final=final,
        error=reason,
    )
    return saved


def _cancel(ctx: Context, op: Operation, worker: Worker | None, reason: str, now: datetime) -> Operation:
    if op.command_id and op.target_instance_id and worker is not None:
        ssm.CommandGateway(ctx.ssm(worker.region)).cancel(op.command_id, op.target_instance_id)
    cancelled = ctx.store.save_operation(
        op,
        {"status": OperationStatus.CANCELLED, "finished_at": now, "error": reason[:500]},
        actor=ACTOR,
        action="OperationCancelled",
        reason=reason,
    )
    logger.info("operation cancelled", operation_id=op.id, worker_id=op.worker_id, reason=reason)
    return cancelled


def _store_system_info(ctx: Context, worker_id: str, info: dict[str, Any], now: datetime) -> None:
    def write() -> Worker:
        worker = ctx.store.get_worker(worker_id)
        return ctx.store.update_worker(
            worker,
            {"system_info": info, "system_info_at": now},
            actor=ACTOR,
            action="WorkerSystemInfoCollected",
        )

    retry_conflicts(write)


def _count(metric: str, operation: str) -> None:
    with single_metric(
        name=metric,
        unit=MetricUnit.Count,
        value=1,
        namespace=NAMESPACE,
        default_dimensions={"service": SERVICE},
    ) as single:
        single.add_dimension(name="operation", value=operation)


# ---- the reconciler's hook --------------------------------------------------------------------------


def reconcile_operations(
    ctx: Context,
    workers: Sequence[Worker],
    now: datetime,
    counters: Counter[str],
    *,
    time_left: Callable[[], float] = lambda: 900.0,
    margin_seconds: float = 10.0,
    owns: Callable[[str], bool] = lambda worker_id: True,
) -> None:
    """Step every open operation once, each isolated, then ask due RUNNING workers for system info.

    `owns(worker_id)` narrows the operations to this cycle's share of the fleet (a reconciler that
    shards the fleet passes its shard's test); every worker must be owned by some cycle.
    """

    refs = sorted({ref for ref in ctx.store.open_operations() if owns(ref[0])})
    # A worker with an operation this cycle is not asked for system information until the next one:
    # the worker list was read before that operation finished.
    busy = {worker_id for worker_id, _ in refs}

    def step(ref: tuple[str, str]) -> Counter[str]:
        found: Counter[str] = Counter()
        if time_left() < margin_seconds:
            found["operations_deferred"] += 1
            return found
        worker_id, operation_id = ref
        try:
            op = ctx.store.find_operation(worker_id, operation_id)
            if op is None or op.finished:
                return found  # the index lagged behind a finish
            after = advance(ctx, op, now)
            if after.version != op.version:
                found[f"operations_{after.status.lower()}"] += 1
        except Conflict:
            found["operation_conflicts"] += 1  # someone else moved it; it is read again next cycle
        except Exception:  # a bad operation record affects only itself
            logger.exception("operation step failed", worker_id=worker_id, operation_id=operation_id)
            found["operation_errors"] += 1
        return found

    with ContextThreadPool(max_workers=PARALLELISM) as pool:
        for found in pool.map(step, refs):
            counters.update(found)

    settings = ctx.settings
    interval = settings.system_info_interval_seconds
    if not settings.operations_catalogue.collects_system_info(interval):
        return
    for worker in workers:
        if time_left() < margin_seconds:
            break
        if worker.status != WorkerStatus.RUNNING or not worker.ec2_instance_id or worker.id in busy:
            continue
        if not system_info_due(worker.id, worker.system_info_at, now, interval, NOMINAL_CYCLE_SECONDS):
            continue
        try:
            op = request(
                ctx, worker.id, SYSTEM_INFO_OPERATION, {}, actor=ACTOR, origin=OperationOrigin.SCHEDULE
            )
            counters["system_info_requested"] += 1
            advance(ctx, op, now)
        except Conflict:
            counters["system_info_skipped"] += 1  # busy with another operation, or no longer RUNNING
        except Exception:
            logger.exception("system information request failed", worker_id=worker.id)
            counters["operation_errors"] += 1


# ---- before stop ------------------------------------------------------------------------------------


def run_before_stop(
    ctx: Context,
    worker_id: str,
    generation: int,
    *,
    actor: str,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], datetime] = utcnow,
) -> dict[str, str]:
    """Run the template's before_stop operations, in order, on a drained worker; name -> final status.

    Runs only while the worker is DRAINING for this drain, marked finishing, with nothing active (else
    the caller's own checks decide). All of them share one deadline, counted from the first one's
    request, so a retried step resumes them rather than starting over. A failure, a refusal or the
    deadline is audited and alarmed, and the next operation (then the stop) goes on.

    A transient AWS error (throttling, 5xx, a lost connection) is raised: the workflow retries the step,
    which resumes here, so a passing fault never stops a worker without its operations. Anything else
    breaks them off, audited like a failed operation, and the stop goes on.
    """
    try:
        return _run_before_stop(ctx, worker_id, generation, actor=actor, sleep=sleep, clock=clock)
    except Exception as error:
        if isinstance(error, Unavailable) or is_retryable(error):
            raise
        logger.exception("before-stop operations broke off", worker_id=worker_id)
        why = f"broke off: {type(error).__name__}: {error}"
        _before_stop_failed(ctx, worker_id, None, None, why)
        return {"error": why[:500]}


def abandon_before_stop(ctx: Context, worker: Worker, generation: int, why: str) -> list[str]:
    """Audit and alarm the before-stop operations of a drain that ended in ERROR after it was marked
    finishing: the reconciler stops the empty worker without them (services/drains/steps.py
    record_error), so each one that did not finish is said to have not run. Their names."""
    record = worker.drain
    if record is None or record.generation != generation or record.finishing_at is None:
        return []
    template = ctx.store.find_template(worker.template)
    names = list(template.before_stop) if template else []
    if not names:
        return []
    since = record.started_at - BEFORE_STOP_CLOCK_SKEW
    finished = {
        stored.name
        for stored in ctx.store.operations_since(worker.id, since, limit=BEFORE_STOP_READ_LIMIT)
        if stored.origin == OperationOrigin.BEFORE_STOP
        and stored.drain_generation == generation
        and stored.finished
    }
    left = [name for name in names if name not in finished]
    for name in left:
        _before_stop_failed(ctx, worker.id, name, None, f"not run: the drain ended in ERROR ({why})")
    return left


def _run_before_stop(
    ctx: Context,
    worker_id: str,
    generation: int,
    *,
    actor: str,
    sleep: Callable[[float], None],
    clock: Callable[[], datetime],
) -> dict[str, str]:
    worker = ctx.store.get_worker(worker_id)
    record = worker.drain
    if (
        worker.status != WorkerStatus.DRAINING
        or worker.active_instances > 0
        or record is None
        or record.generation != generation
        # Only a drain marked finishing, which a cancel can no longer undo (services/drains/steps.py).
        or record.finishing_at is None
    ):
        return {}
    template = ctx.store.find_template(worker.template)
    names = list(template.before_stop) if template else []
    if not names:
        return {}
    if not worker.ec2_instance_id:
        # Nothing to run them on (and nothing to stop): said once per operation, so that an operator who
        # expects them to have run finds why they did not.
        for name in names:
            _before_stop_failed(ctx, worker.id, name, None, "not run: the worker has no machine")
        return dict.fromkeys(names, "NOT_RUN")
    earlier: dict[str, Operation] = {}
    # This drain's before-stop operations were all requested after it started: only that key range is
    # read, newest first and at most one page, however many operations the worker ran before.
    since = record.started_at - BEFORE_STOP_CLOCK_SKEW
    for stored in ctx.store.operations_since(worker_id, since, limit=BEFORE_STOP_READ_LIMIT):
        if stored.origin == OperationOrigin.BEFORE_STOP and stored.drain_generation == generation:
            earlier.setdefault(stored.name, stored)  # newest first: the newest of a name wins
    started = min((stored.created_at for stored in earlier.values()), default=clock())
    deadline = started + timedelta(seconds=ctx.settings.before_stop_timeout_seconds)
    results: dict[str, str] = {}
    for name in names:
        previous = earlier.get(name)
        if previous is not None and previous.finished:
            results[name] = str(previous.status)  # settled by an earlier attempt of the step, audited then
            continue
        results[name] = _run_one_before_stop(
            ctx, worker, name, previous, generation, deadline, actor, sleep, clock
        )
    return results


def _run_one_before_stop(  # noqa: PLR0917 - one loop's state, passed through from its only caller
    ctx: Context,
    worker: Worker,
    name: str,
    op: Operation | None,
    generation: int,
    deadline: datetime,
    actor: str,
    sleep: Callable[[float], None],
    clock: Callable[[], datetime],
) -> str:
    polls = 0
    while True:
        now = clock()
        if op is None:
            if now >= deadline:
                _before_stop_failed(ctx, worker.id, name, None, "not run: the before-stop time was spent")
                return "NOT_RUN"
            try:
                op = request(
                    ctx,
                    worker.id,
                    name,
                    {},
                    actor=actor,
                    origin=OperationOrigin.BEFORE_STOP,
                    drain_generation=generation,
                )
            except OperationInFlight as busy:
                # Another operation holds the worker: help it along and ask again.
                holder = ctx.store.find_operation(worker.id, str(busy.operation_id))
                if holder is not None:
                    advance(ctx, holder, now)
            except StaleWrite:
                pass  # the worker changed under the request (a lost race, not a refusal): asked again
            except (InvalidInput, Conflict, NotFound) as refused:
                _before_stop_failed(ctx, worker.id, name, None, f"not run: {refused.message}")
                return "NOT_RUN"
        if op is not None:
            # A StaleWrite means the reconciler stepped it meanwhile: it is read again on the next round.
            with contextlib.suppress(StaleWrite):
                op = advance(ctx, ctx.store.get_operation(worker.id, op.id), now)
            if op.finished:
                if op.status != OperationStatus.SUCCESS:
                    _before_stop_failed(ctx, worker.id, name, op, op.error or str(op.status))
                return str(op.status)
        if now >= deadline:
            if op is not None:
                op = _cancel(ctx, op, worker, "before-stop timeout", now)
            _before_stop_failed(ctx, worker.id, name, op, "timed out before the stop")
            return "TIMED_OUT"
        pause = min(BEFORE_STOP_POLL_SECONDS, BEFORE_STOP_FIRST_POLL_SECONDS * 2**polls)
        polls += 1
        sleep(max(0.0, min(pause, (deadline - now).total_seconds())))


def _before_stop_failed(
    ctx: Context, worker_id: str, name: str | None, op: Operation | None, reason: str
) -> None:
    """Audit, publish and count a before-stop operation that did not succeed (`name` None: all that were
    left); the stop goes on."""
    detail = {
        "worker_id": worker_id,
        "operation": name,
        "operation_id": op.id if op else None,
        "reason": reason[:500],
    }
    logger.error("before-stop operation did not succeed", extra=detail)
    metrics.add_metric(name=METRIC_BEFORE_STOP_FAILED, unit=MetricUnit.Count, value=1)
    try:
        ctx.store.record_audit(
            AuditEvent(
                entity="worker",
                entity_id=worker_id,
                action="BeforeStopOperationFailed",
                actor=ACTOR,
                # No status: this records an operation's outcome, not a move, and the worker may have
                # moved since the drain read it (its machine stopped from outside, say).
                reason=reason[:500],
                details={"operation": name, "operation_id": op.id if op else None},
            )
        )
        ctx.audit.publish("WorkerBeforeStopFailed", detail)
    except Exception:  # the alarm above already fired; the stop must not wait on the audit
        logger.exception("before-stop failure not audited", worker_id=worker_id)
