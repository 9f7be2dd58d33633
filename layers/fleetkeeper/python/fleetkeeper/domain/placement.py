"""Which workers may take a new instance, and in which order to try them."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TypeVar

from fleetkeeper.domain.lifecycle import ACCEPTS_INSTANCES, PoolStatus
from fleetkeeper.domain.models import Pool, Worker, WorkerSummary
from fleetkeeper.domain.repair import Health

W = TypeVar("W", bound=WorkerSummary)


class PlacementStrategy(StrEnum):
    # Fill the fullest worker that still has room, so idle workers stay idle and can be scaled down.
    PACK = "pack"
    # Prefer the emptiest worker, to spread load and blast radius.
    SPREAD = "spread"


def sickness(worker: WorkerSummary) -> Health | None:
    """The worker's health when it says the worker is sick, known only from a worker item (an index
    summary holds no health): a sick or retiring machine takes no new instance, whatever the source."""
    health = worker.health if isinstance(worker, Worker) else None
    return health if health is not None and health.unhealthy else None


def refusal_reason(worker: WorkerSummary, pool: Pool | None) -> str | None:
    """Why this worker cannot take an instance now, or None when it can."""
    if worker.status != ACCEPTS_INSTANCES:
        return f"worker {worker.id} is {worker.status}, only RUNNING workers accept instances"
    sick = sickness(worker)
    if sick is not None:
        return f"worker {worker.id} is unhealthy ({sick.source}): {sick.reason or '-'}"
    if pool is not None and pool.status != PoolStatus.ACTIVE:
        return f"pool {pool.name} is {pool.status}"
    if worker.active_instances >= worker.capacity:
        return f"worker {worker.id} is full ({worker.active_instances}/{worker.capacity})"
    return None


def rank_candidates(workers: Iterable[W], strategy: PlacementStrategy = PlacementStrategy.PACK) -> list[W]:
    """Workers with free room and not known unhealthy, best first for the strategy; ties broken by id for
    determinism."""
    eligible = [
        w for w in workers if w.status == ACCEPTS_INSTANCES and w.free_slots > 0 and sickness(w) is None
    ]
    if strategy is PlacementStrategy.PACK:
        return sorted(eligible, key=lambda w: (w.free_slots, w.id))
    return sorted(eligible, key=lambda w: (-w.free_slots, w.id))
