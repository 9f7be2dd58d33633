"""Where the reconciler side (spot warnings, scale-down, orphan GC) meets the drain workflow.

Starting a drain can be refused (the worker is no longer RUNNING, a drain already runs, the workflow
cannot start); for these callers a refusal is an outcome to log and count, never a failed cycle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleetkeeper.domain.admission import Ask
from fleetkeeper.domain.errors import FleetkeeperError
from fleetkeeper.domain.models import DrainOutcome, DrainThen, Worker
from fleetkeeper.observability import logger
from fleetkeeper.services import drains

if TYPE_CHECKING:
    from fleetkeeper.services.context import Context


def start_drain(
    ctx: Context,
    worker_id: str,
    *,
    actor: str,
    reason: str,
    timeout_seconds: int | None = None,
    then: DrainThen = DrainThen.STOP,
    ask: Ask | None = None,
) -> bool:
    """Start a drain of the worker through the door as `ask` says (by default an operator's command);
    False (logged) when it was refused."""
    try:
        drains.start_worker_drain(
            ctx, worker_id, actor=actor, reason=reason, timeout_seconds=timeout_seconds, then=then, ask=ask
        )
    except FleetkeeperError as refusal:
        logger.info("drain not started", extra={"worker_id": worker_id, "refusal": refusal.message})
        return False
    return True


def close_drain(ctx: Context, worker: Worker, *, outcome: DrainOutcome, reason: str, actor: str) -> bool:
    """End the worker's open drain because the worker is gone; False when there was none to end."""
    if worker.drain is None or worker.drain.outcome != DrainOutcome.RUNNING:
        return False
    drains.close_drain(ctx, worker, outcome=outcome, reason=reason, actor=actor)
    return True
