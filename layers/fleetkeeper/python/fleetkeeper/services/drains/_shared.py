"""Helpers every drain module shares: audit events, detail payloads, reading the drain a step serves."""

from __future__ import annotations

from typing import Any

from fleetkeeper.domain.errors import (
    DrainCancelled,
)
from fleetkeeper.domain.models import (
    DrainOutcome,
    DrainRecord,
    Worker,
)
from fleetkeeper.observability import metrics
from fleetkeeper.services.context import Context


def emit(ctx: Context, detail_type: str, detail: dict[str, Any], metric: str | None = None) -> None:
    ctx.audit.publish(detail_type, detail)
    if metric:
        metrics.add_metric(name=metric, unit="Count", value=1)


def worker_detail(worker: Worker, **extra: Any) -> dict[str, Any]:
    record = worker.drain
    detail: dict[str, Any] = {"worker_id": worker.id, "status": str(worker.status), "pool": worker.pool}
    if record:
        detail.update(
            generation=record.generation,
            reason=record.reason,
            requested_by=record.requested_by,
            then=str(record.then),
            deadline=record.deadline.isoformat(),
            outcome=str(record.outcome),
        )
    detail.update(extra)
    return detail


def drain_of(worker: Worker) -> DrainRecord:
    if worker.drain is None:
        raise RuntimeError(f"worker {worker.id} has no drain record where one was just written")
    return worker.drain


def current_drain(worker: Worker, generation: int, restart: int | None = None) -> DrainRecord:
    """The drain this execution serves, or DrainCancelled if it was cancelled, closed or superseded.

    With `restart`, an execution the watchdog has replaced is superseded too: only the newest execution
    of a generation may act on it.
    """
    record = worker.drain
    if record is None or record.generation != generation:
        raise DrainCancelled(f"worker {worker.id} has no drain of generation {generation} any more")
    if record.outcome != DrainOutcome.RUNNING:
        raise DrainCancelled(f"drain {generation} of worker {worker.id} already ended: {record.outcome}")
    if restart is not None and record.restarts != restart:
        raise DrainCancelled(
            f"drain {generation} of worker {worker.id} is served by restart {record.restarts}, not {restart}"
        )
    return record
