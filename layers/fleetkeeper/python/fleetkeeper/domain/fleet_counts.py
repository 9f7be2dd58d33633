"""Workers counted per scope and status: what the fleet-wide scale-down guards and gauges need.

The counts come either from a read of the whole fleet (the view) or from the store's exact counters
(store/counters.py), kept by the same transactions that change a worker's status.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleetkeeper.domain.disruption import pool_of_scope
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerSummary
from fleetkeeper.domain.scale_down import scope_of


@dataclass(frozen=True)
class FleetCounts:
    """How many workers each (scope, status) cell holds, and how many of them are unhealthy."""

    cells: Mapping[tuple[str, WorkerStatus], int] = field(default_factory=dict)
    unhealthy: Mapping[tuple[str, WorkerStatus], int] = field(default_factory=dict)

    @classmethod
    def of(cls, workers: Iterable[WorkerSummary]) -> FleetCounts:
        """The counts of these workers; their health counts only where they are read in full."""
        listed = list(workers)
        sick = [w for w in listed if isinstance(w, Worker) and w.health is not None and w.health.unhealthy]
        return cls(
            dict(Counter((scope_of(w), w.status) for w in listed)),
            dict(Counter((scope_of(w), w.status) for w in sick)),
        )

    def in_pool(self, pool: str) -> tuple[Counter[WorkerStatus], Counter[WorkerStatus]]:
        """The pool's workers by status, and its unhealthy ones by status."""
        counted: tuple[Counter[WorkerStatus], Counter[WorkerStatus]] = (Counter(), Counter())
        for found, cells in zip(counted, (self.cells, self.unhealthy), strict=True):
            for (scope, status), count in cells.items():
                if pool_of_scope(scope) == pool:
                    found[status] += count
        return counted

    @property
    def by_status(self) -> Counter[WorkerStatus]:
        counted: Counter[WorkerStatus] = Counter()
        for (_, status), count in self.cells.items():
            counted[status] += count
        return counted

    @property
    def running_in_scope(self) -> Counter[str]:
        return Counter(
            {scope: count for (scope, status), count in self.cells.items() if status == WorkerStatus.RUNNING}
        )

    @property
    def draining(self) -> int:
        return self.by_status[WorkerStatus.DRAINING]

    @property
    def fleet_size(self) -> int:
        """The workers a percentage disruption budget is taken of: RUNNING and DRAINING."""
        by_status = self.by_status
        return by_status[WorkerStatus.RUNNING] + by_status[WorkerStatus.DRAINING]
