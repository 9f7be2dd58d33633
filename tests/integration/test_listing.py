"""Listing every worker while workers move: what docs/data-model.md ("Listing every worker") promises.

The statuses are walked in lifecycle order and those the exact counts show empty are passed over, on
counts read after everything before them was read. A worker is moved by a botocore hook at the moment
a given index query is sent, or between two pages; every DynamoDB request of the listing is counted.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker
from fleetkeeper.services.context import default_context
from fleetkeeper.store.keys import COUNTER_PARTITIONS, INDEX_PARTITIONS, worker_shard_partition
from fleetkeeper.store.repository import FleetStore
from fleetkeeper.store.schema import BY_SHARD
from fleetkeeper_local import faults
from tests.integration.conftest import WorkerFactory
from tests.integration.reconciler.test_door_costs import Requests

pytestmark = pytest.mark.integration

S = WorkerStatus


def index_queries(seen: Requests) -> int:
    return sum(n for (index, _), n in seen.queries.items() if index == BY_SHARD)


def count_reads(seen: Requests) -> int:
    """Reads of the exact counts: one Query per counter partition each."""
    queries = seen.queries[("table", "COUNTS")]
    assert queries % COUNTER_PARTITIONS == 0, seen
    return queries // COUNTER_PARTITIONS


def every_page(store: FleetStore, limit: int, next_token: str | None) -> list[Worker]:
    """The workers of the pages from `next_token` on, page after page until there is no token."""
    listed: list[Worker] = []
    while True:
        page = store.list_workers(limit=limit, next_token=next_token)
        listed.extend(page.items)
        if page.next_token is None:
            return listed
        next_token = page.next_token


def test_given_a_fleet_in_one_status_then_a_listing_reads_that_status_and_the_counts_twice(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    made = {running_worker().id for _ in range(3)}

    seen = Requests()
    with faults.installed_hooks(seen.hooks()):
        page = default_context().store.list_workers(limit=50)

    assert {w.id for w in page.items} == made
    assert page.next_token is None
    # RUNNING's write shards alone, not all eleven statuses' (176 queries) ...
    assert index_queries(seen) == INDEX_PARTITIONS, seen
    # ... on counts read before it (passing PENDING to STARTING) and after it (passing the rest).
    assert count_reads(seen) == 2, seen


def test_given_a_worker_moving_on_to_a_status_the_counts_showed_empty_during_the_walk_then_it_is_listed(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    still = running_worker()
    mover = store.transition_worker(running_worker(), S.DRAINING, cause=Cause.CONTROL, actor="test")
    moved: list[Worker] = []

    def move_when_running_is_read(params: dict[str, Any], **_: Any) -> None:
        # The first counts showed TERMINATING empty; the worker enters it while RUNNING is being read.
        partition = params.get("ExpressionAttributeValues", {}).get(":pk", {}).get("S")
        running = params.get("IndexName") == BY_SHARD and partition == worker_shard_partition(S.RUNNING, 0)
        if running and not moved:
            moved.append(store.transition_worker(mover, S.TERMINATING, cause=Cause.CONTROL, actor="test"))

    seen = Requests()
    hooks = [("before-parameter-build.dynamodb.Query", move_when_running_is_read), *seen.hooks()]
    with faults.installed_hooks(hooks):
        page = default_context().store.list_workers(limit=50)

    assert len(moved) == 1
    assert sorted((w.id, w.status) for w in page.items) == sorted(
        [(still.id, S.RUNNING), (mover.id, S.TERMINATING)]
    )
    # RUNNING, DRAINING (the counts read first showed it in use), then TERMINATING, which the counts
    # read again after DRAINING show in use now; those read after TERMINATING pass over the rest.
    assert index_queries(seen) == 3 * INDEX_PARTITIONS, seen
    assert count_reads(seen) == 3, seen


def test_given_a_worker_moving_on_between_two_pages_then_the_pages_list_every_worker_once(
    store: FleetStore, running_worker: WorkerFactory
) -> None:
    made = {running_worker().id for _ in range(4)}
    first = store.list_workers(limit=1)
    (listed,) = first.items
    # One the walk has not reached yet (it is further along RUNNING's write shards) leaves RUNNING.
    mover = store.get_worker(min(made - {listed.id}))
    store.transition_worker(mover, S.DRAINING, cause=Cause.CONTROL, actor="test")

    rest = every_page(store, 1, first.next_token)

    assert sorted([listed.id, *(w.id for w in rest)]) == sorted(made)
    assert [w.status for w in rest if w.id == mover.id] == [S.DRAINING]
