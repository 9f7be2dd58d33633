"""The walk behind a listing of every worker, against a model fleet whose workers move forward while it
runs: every worker is listed, and one that keeps its status is listed once (docs/data-model.md,
"Listing every worker"). The walk and its passing over empty statuses are the store's own; the index
and the exact counts are the model's, and moves are made before any of their reads."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.sharding import WHOLE_FLEET, bucket_of
from fleetkeeper.store import keys
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.table import TableAccess
from fleetkeeper.store.workers import passing_empty_statuses, shard_queries

STATUSES = list(WorkerStatus)
QUERIES = shard_queries(STATUSES, WHOLE_FLEET.buckets)
PER_STATUS = len(QUERIES) // len(STATUSES)


class ModelFleet(TableAccess):
    """Workers in statuses; `moves[n]` (worker, steps forward) happen just before the n-th read."""

    def __init__(self, statuses: list[int], moves: dict[int, list[tuple[int, int]]]) -> None:
        super().__init__(cast(Any, None), "model")
        self.statuses = statuses
        self.moves = moves
        self.reads = 0
        self.ids = [f"w-{n:04d}" for n in range(len(statuses))]

    def _tick(self) -> None:
        for worker, steps in self.moves.get(self.reads, []):
            self.statuses[worker] = min(self.statuses[worker] + steps, len(STATUSES) - 1)
        self.reads += 1

    def counts(self) -> Counter[WorkerStatus]:
        self._tick()
        return Counter(STATUSES[s] for s in self.statuses)

    def _entry(self, n: int) -> dict[str, str]:
        worker_id = self.ids[n]
        bucket = bucket_of(worker_id)
        return {
            **keys.worker_key(worker_id),
            "GSI4PK": keys.worker_shard_partition(STATUSES[self.statuses[n]], keys.partition_of(bucket)),
            "GSI4SK": f"{keys.bucket_sort(bucket)}#{worker_id}",
            "id": worker_id,
        }

    def _query(self, **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        self._tick()
        partition = kwargs["ExpressionAttributeValues"][":pk"]["S"]
        after = kwargs.get("ExclusiveStartKey", {}).get("GSI4SK", {}).get("S", "")
        entries = sorted(
            (e for e in map(self._entry, range(len(self.statuses))) if e["GSI4PK"] == partition),
            key=lambda e: e["GSI4SK"],
        )
        found = [e for e in entries if e["GSI4SK"] > after][: kwargs["Limit"]]
        last = None
        if len(found) == kwargs["Limit"]:
            last = serialize({k: v for k, v in found[-1].items() if k != "id"})
        return [serialize(e) for e in found], last

    def listed(self, limit: int) -> Counter[str]:
        """Each worker's id, as often as the pages of a whole listing list it."""
        seen: Counter[str] = Counter()
        token: str | None = None
        while True:
            passes = passing_empty_statuses(STATUSES, PER_STATUS, self.counts)
            entries, token = self._walk(limit, token, QUERIES, passes)
            seen.update(str(e["id"]["S"]) for e in entries)
            if token is None:
                return seen


@settings(max_examples=300, deadline=None)
@given(
    statuses=st.lists(st.integers(0, len(STATUSES) - 1), min_size=1, max_size=8),
    moves=st.lists(st.tuples(st.integers(0, 80), st.integers(0, 7), st.integers(1, 4)), max_size=12),
    limit=st.integers(1, 4),
)
def test_given_workers_moving_forward_during_a_listing_then_each_is_listed_and_one_that_stays_once(
    statuses: list[int], moves: list[tuple[int, int, int]], limit: int
) -> None:
    schedule: dict[int, list[tuple[int, int]]] = {}
    for read, worker, steps in moves:
        if worker < len(statuses):
            schedule.setdefault(read, []).append((worker, steps))
    moved = {f"w-{worker:04d}" for at in schedule.values() for worker, _ in at}
    fleet = ModelFleet(list(statuses), schedule)

    seen = fleet.listed(limit)

    assert set(seen) == set(fleet.ids)
    assert all(seen[i] == 1 for i in fleet.ids if i not in moved), seen
