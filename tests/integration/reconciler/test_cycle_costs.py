"""What a reconcile cycle reads: the status index only for the statuses its exact counts say hold a
worker, each once (the drain sweep takes the DRAINING workers the cycle read), and a policy pool's
RUNNING workers and member item once while none of its workers moves (scale-out takes scale-in's). Every
DynamoDB request of the cycle is counted by a botocore hook on the real client."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from fleetkeeper.domain.capacity import CapacityPolicy
from fleetkeeper.domain.models import Worker
from fleetkeeper.services import catalog, drains
from fleetkeeper.services.context import Context
from fleetkeeper.store.keys import INDEX_PARTITIONS
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.conftest import WorkerFactory
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.test_door_costs import Requests

pytestmark = pytest.mark.integration


def one_cycle(make_ctx: Callable[..., Context]) -> Requests:
    seen = Requests()
    with faults.installed_hooks(seen.hooks()):
        report = reconcile_fleet(make_ctx())
    assert report.completed, report
    return seen


def status_index_queries(make_ctx: Callable[..., Context]) -> int:
    return sum(n for (index, _), n in one_cycle(make_ctx).queries.items() if index == "by_shard")


def test_given_a_fleet_in_one_status_and_then_two_then_a_cycle_queries_the_index_for_those_alone(
    make_ctx: Callable[..., Context], ec2_worker: WorkerFactory, drains_started: list[dict[str, Any]]
) -> None:
    workers = [ec2_worker(pool="labs") for _ in range(3)]
    reconcile_fleet(make_ctx())

    assert status_index_queries(make_ctx) == INDEX_PARTITIONS

    drains.start_worker_drain(make_ctx(), workers[0].id, actor="operator", reason="patch")
    assert len(drains_started) == 1
    # RUNNING and DRAINING, each read once: the sweep of waiting drains reads none of its own.
    assert status_index_queries(make_ctx) == 2 * INDEX_PARTITIONS


def test_given_a_policy_pool_with_no_bookings_then_a_cycle_never_queries_its_bookings(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker]
) -> None:
    live_worker(pool="labs")
    wanted = CapacityPolicy(template="lab", min_workers=1, max_workers=2, bookings=True)
    catalog.put_pool(store, "labs", actor="test", capacity=wanted)
    reconcile_fleet(make_ctx())

    seen = one_cycle(make_ctx)

    # Scale-in assessed the pool, listing its RUNNING workers through the pool index, and scale-out took
    # that listing, no worker of the pool having moved since; with nothing launching or STOPPED by the
    # exact counts, not the rest of its workers as well ...
    assert seen.queries[("by_pool", "POOL")] == INDEX_PARTITIONS, seen
    # ... one read of its member item gave both the members and the bookings waiting ...
    assert seen.reads_of["MEMBERS#labs"] == 1, seen
    # ... and the exact waiting count of 0 spared the bookings index, its page and its COUNT alike.
    assert seen.queries[("by_parent", "BOOKINGS")] == 0, seen


def test_given_a_policy_pool_that_scale_in_shrinks_then_scale_out_reads_the_pool_again(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker]
) -> None:
    spare = [live_worker(pool="labs") for _ in range(2)]
    wanted = CapacityPolicy(template="lab", min_workers=1, max_workers=2)
    catalog.put_pool(store, "labs", actor="test", capacity=wanted)

    seen = one_cycle(make_ctx)

    assert sorted(str(store.get_worker(w.id).status) for w in spare) == ["RUNNING", "TERMINATING"]
    # Scale-in took a worker out of RUNNING, so the pool's counts moved: scale-out listed its RUNNING
    # workers and read its member item again rather than take what scale-in had read.
    assert seen.queries[("by_pool", "POOL")] == 2 * INDEX_PARTITIONS, seen
    assert seen.reads_of["MEMBERS#labs"] == 2, seen


def test_given_a_pool_without_a_policy_then_a_cycle_reads_nothing_of_its_capacity(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker]
) -> None:
    live_worker(pool="plain")
    reconcile_fleet(make_ctx())

    seen = one_cycle(make_ctx)

    # Its member count, waiting bookings and scale-out state: none read, no booking or pool index query.
    capacity_reads = {k: n for k, n in seen.reads_of.items() if k.split("#")[0] in ("MEMBERS", "CAPACITY")}
    assert capacity_reads == {}, seen
    assert seen.queries[("by_parent", "BOOKINGS")] + seen.queries[("by_pool", "POOL")] == 0, seen
