"""The seam between the reconciler side (spot warnings, scale-down, orphan GC) and the drain workflow.

The drain workflow lives in `fleetkeeper.services.drains`. Everything here calls it through these two
functions, so the call sites do not change when it moves, and a deployment without it degrades to
"logged and counted" instead of failing the reconcile cycle.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.models import DrainOutcome, DrainThen, Worker
from fleetkeeper.observability import logger

if TYPE_CHECKING:
    from fleetkeeper.services.context import Context

DRAINS_MODULE = "fleetkeeper.services.drains"


def _drains() -> ModuleType | None:
    try:
        return importlib.import_module(DRAINS_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != DRAINS_MODULE:
            raise
        return None


def start_drain(
    ctx: Context,
    worker_id: str,
    *,
    actor: str,
    reason: str,
    timeout_seconds: int | None = None,
    then: DrainThen = DrainThen.STOP,
) -> bool:
    """Start a drain of the worker; False when none was started (already draining, or no workflow)."""
    drains = _drains()
    if drains is None:
        logger.warning("drain workflow unavailable; drain not started", worker_id=worker_id, reason=reason)
        return False
    try:
        drains.start_worker_drain(
            ctx, worker_id, actor=actor, reason=reason, timeout_seconds=timeout_seconds, then=then
        )
    except Conflict as refusal:
        logger.info("drain not started", worker_id=worker_id, refusal=refusal.message)
        return False
    return True


def close_drain(ctx: Context, worker: Worker, *, outcome: DrainOutcome, reason: str, actor: str) -> bool:
    """End the worker's open drain because the worker is gone; False when there was none to end."""
    if worker.drain is None or worker.drain.outcome != DrainOutcome.RUNNING:
        return False
    drains = _drains()
    if drains is None:
        logger.warning("drain workflow unavailable; open drain left for its own timeout", worker_id=worker.id)
        return False
    drains.close_drain(ctx, worker, outcome=outcome, reason=reason, actor=actor)
    return True
