"""Workers counted per scope and status: what the fleet-wide scale-down guards and gauges need.

The counts come either from a read of the whole fleet (the view) or from the store's exact counters
(store/counters.py), kept by the same transactions that change a worker's status.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import WorkerSummary
from fleetkeeper.domain.scale_down import scope_of


@dataclass(frozen=True)
class FleetCounts:
    """How many workers each (scope, status) cell holds."""

    cells: Mapping[tuple[str, WorkerStatus], int] = field(default_factory=dict)

    @classmethod
    def of(cls, workers: Iterable[WorkerSummary]) -> FleetCounts:
        return cls(dict(Counter((scope_of(w), w.status) for w in workers)))

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
