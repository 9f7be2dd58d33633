"""Scale-out in the reconcile cycle: a pool brought up to its target, warm workers first, max_workers
exact under racing writers, and launches refused for capacity backing the pool off."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.capacity import BlockedReason, CapacityPolicy
from fleetkeeper.domain.errors import PoolFull
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.services import capacity, catalog, workers
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.capacity import scale_out
from fleetkeeper.store.capacity import members_key
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import ec2_time, faults
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import ensure_template, stopped_warm

pytestmark = pytest.mark.integration


def capacity_pool(store: FleetStore, **policy: Any) -> None:
    ensure_template(store, "lab", capacity=4)
    wanted = CapacityPolicy.model_validate({"template": "lab", "max_workers": 3, **policy})
    catalog.put_pool(store, "labs", actor="test", capacity=wanted)


def one_scale_out(ctx: Context) -> Counter[str]:
    """One scale-out step of a cycle that owns every pool and has a minute left; its counters."""
    counted: Counter[str] = Counter()
    scale_out(ctx, utcnow(), counted, owns=lambda _: True, time_left=lambda: 60, margin_seconds=1)
    return counted


def live_members(store: FleetStore) -> list[Any]:
    return [
        w
        for w in store.get_workers([s.id for s in store.workers_in_pool("labs")])
        if w.status not in (WorkerStatus.TERMINATED, WorkerStatus.FAILED)
    ]


def race(threads: int, work: Callable[[], None]) -> None:
    barrier = threading.Barrier(threads)

    def run() -> None:
        barrier.wait()
        work()

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout=120)


def test_given_ten_writers_racing_for_a_pool_of_three_then_exactly_three_workers_are_made(
    store: FleetStore, ctx: Context
) -> None:
    capacity_pool(store)
    refused: list[PoolFull] = []

    def create() -> None:
        try:
            workers.create_worker(store, template="lab", region="us-east-1", pool="labs", actor="test")
        except PoolFull as full:
            refused.append(full)

    race(10, create)

    assert (len(live_members(store)), len(refused), ctx.capacity.members("labs")) == (3, 7, 3)


def test_given_two_cycles_scaling_out_at_once_then_max_workers_holds_exactly(
    store: FleetStore, make_ctx: Callable[..., Context]
) -> None:
    # Each cycle alone would create 3 workers: together they ask for 6 of the 3 places.
    capacity_pool(store, min_workers=3)
    counters: list[dict[str, int]] = []

    def cycle() -> None:
        counters.append(dict(one_scale_out(make_ctx())))

    race(2, cycle)

    assert len(live_members(store)) == 3
    assert sum(c.get("capacity_workers_created", 0) for c in counters) == 3
    # A worker leaving frees its place: the count follows the transaction that terminates it.
    leaving = live_members(store)[0]
    store.transition_worker(leaving, WorkerStatus.TERMINATED, cause=Cause.CONTROL, actor="test")
    assert make_ctx().capacity.members("labs") == 2


def test_given_a_policy_then_the_cycle_creates_its_workers_and_says_what_it_did(
    store: FleetStore, ctx: Context, lab_image: str
) -> None:
    capacity_pool(store, min_workers=2, warm_workers=1)

    first = reconcile_fleet(ctx)

    made = live_members(store)
    assert first.counters["capacity_workers_created"] == 3
    assert sorted(str(w.desired_status) for w in made) == ["None", "None", "STOPPED"]
    state = ctx.capacity.state("labs")
    assert state.last_cycle is not None
    assert (state.last_cycle.target, state.last_cycle.warm_target, state.last_cycle.created) == (2, 1, 3)
    # The next cycle launches them and asks for nothing more.
    second = reconcile_fleet(ctx, now=utcnow() + timedelta(seconds=1))
    assert second.counters["capacity_workers_created"] == 0
    assert second.counters["provisioned_count"] == 3


def test_given_a_warm_worker_then_it_is_started_before_any_new_worker(
    store: FleetStore, ctx: Context, live_worker: Callable[..., Any], ec2: Any
) -> None:
    [stopped] = stopped_warm(store, ec2, [live_worker(pool="labs")])
    capacity_pool(store, min_workers=1)

    report = reconcile_fleet(ctx)

    assert report.counters["capacity_workers_woken"] == 1
    assert report.counters["capacity_workers_created"] == 0
    assert store.get_worker(stopped.id).desired_status == WorkerStatus.RUNNING


def test_given_a_refill_of_the_warm_set_launching_then_it_never_holds_back_the_warm_worker_the_target_needs(
    store: FleetStore, ctx: Context, live_worker: Callable[..., Any], ec2: Any
) -> None:
    [stopped] = stopped_warm(store, ec2, [live_worker(pool="labs")])
    capacity_pool(store, min_workers=1, warm_workers=1)
    workers.create_worker(
        store,
        template="lab",
        region="us-east-1",
        pool="labs",
        actor="test",
        desired_status=WorkerStatus.STOPPED,
    )
    counted = one_scale_out(ctx)

    # The refill is the warm set's: the RUNNING worker comes from the warm one, and nothing new is made.
    assert (counted["capacity_workers_woken"], counted["capacity_workers_created"]) == (1, 0)
    assert store.get_worker(stopped.id).desired_status == WorkerStatus.RUNNING
    view = capacity.pool_view(ctx, "labs")
    assert (view.launching, view.refilling, view.warm) == (1, 1, 0)


def test_given_a_warm_set_of_one_then_one_worker_is_launched_for_it_and_stopped_into_it(
    store: FleetStore, ctx: Context, lab_image: str
) -> None:
    capacity_pool(store, warm_workers=1)
    now = utcnow()

    made = sum(
        reconcile_fleet(ctx, now=now + timedelta(seconds=n)).counters["capacity_workers_created"]
        for n in range(8)
    )

    # The refill is RUNNING for a cycle before its stop: it is the warm set's, not launched again.
    assert made == 1
    assert [w.status for w in live_members(store)] == [WorkerStatus.STOPPED]


def test_given_no_capacity_for_the_launches_then_the_pool_is_blocked_and_waits_for_its_retry(
    store: FleetStore, ctx: Context, lab_image: str
) -> None:
    capacity_pool(store, min_workers=1)
    reconcile_fleet(ctx)  # creates the worker
    no_capacity = faults.ec2_no_capacity(1.0, limit=5)
    with faults.FaultPlan(seed=61, faults=[no_capacity]).installed():
        refused = reconcile_fleet(ctx, now=utcnow() + timedelta(seconds=1))

    assert no_capacity.injected == 1
    assert refused.counters["launches_refused_for_capacity"] == 1
    blocked = ctx.capacity.state("labs").blocked
    assert blocked is not None
    assert (blocked.reason, blocked.aws_error, blocked.refusals) == (
        BlockedReason.INSUFFICIENT_CAPACITY,
        "InsufficientInstanceCapacity",
        1,
    )
    assert blocked.retry_at - blocked.since == timedelta(minutes=1)
    # The refused worker is FAILED in the end or retried: either way scale-out waits, making none.
    store.transition_worker(
        store.get_worker(live_members(store)[0].id), WorkerStatus.FAILED, cause=Cause.CONTROL, actor="test"
    )
    waiting = reconcile_fleet(ctx, now=utcnow() + timedelta(seconds=30))
    assert (waiting.counters["capacity_blocked_pools"], waiting.counters["capacity_workers_created"]) == (
        1,
        0,
    )
    after = reconcile_fleet(ctx, now=blocked.retry_at + timedelta(seconds=1))
    assert after.counters["capacity_workers_created"] == 1


def test_given_a_blocked_pool_whose_refused_worker_still_waits_then_blocked_outlives_the_pools_backoff(
    store: FleetStore, ctx: Context, lab_image: str
) -> None:
    capacity_pool(store, min_workers=1)
    reconcile_fleet(ctx)  # creates the worker
    no_capacity = faults.ec2_no_capacity(1.0, limit=1)
    with faults.FaultPlan(seed=62, faults=[no_capacity]).installed():
        reconcile_fleet(ctx, now=utcnow() + timedelta(seconds=1))
    blocked = ctx.capacity.state("labs").blocked
    assert blocked is not None
    # The worker's own capacity backoff outlasts the pool's (15 minutes against 16, 30 in later rounds).
    waiting = live_members(store)[0]
    store.update_worker(
        waiting,
        {"next_reconcile_at": blocked.retry_at + timedelta(minutes=10)},
        actor="test",
        action="LongerBackoff",
    )

    later = reconcile_fleet(ctx, now=blocked.retry_at + timedelta(seconds=1))

    # Nothing RUNNING yet, the only worker still PENDING on EC2's refusal: the pool is not at its target.
    assert store.get_worker(waiting.id).status == WorkerStatus.PENDING
    assert later.counters["capacity_workers_created"] == 0
    still = ctx.capacity.state("labs").blocked
    assert still is not None
    assert (still.aws_error, still.refusals) == ("InsufficientInstanceCapacity", 1)


def test_given_no_capacity_to_start_the_warm_worker_then_the_pool_is_blocked_with_ec2s_error(
    store: FleetStore, ctx: Context, live_worker: Callable[..., Any], ec2: Any
) -> None:
    [worker] = stopped_warm(store, ec2, [live_worker(pool="labs")])
    capacity_pool(store, min_workers=1)
    reconcile_fleet(ctx)  # wakes the warm worker
    ec2_time.set_capacity(ec2, "m5.large", available=False)

    refused = reconcile_fleet(ctx, now=utcnow() + timedelta(seconds=1))

    assert refused.counters["capacity_errors"] == 1
    assert store.get_worker(worker.id).status == WorkerStatus.STOPPED
    blocked = ctx.capacity.state("labs").blocked
    assert blocked is not None
    assert (blocked.reason, blocked.aws_error) == (
        BlockedReason.INSUFFICIENT_CAPACITY,
        "InsufficientInstanceCapacity",
    )


def test_given_a_stopped_worker_an_operator_wants_terminated_then_scale_out_never_wakes_it(
    store: FleetStore, ctx: Context, live_worker: Callable[..., Any], ec2: Any
) -> None:
    [stopped] = stopped_warm(store, ec2, [live_worker(pool="labs")])
    capacity_pool(store, min_workers=1)
    now = utcnow()
    # Still waiting out a backoff (a start EC2 refused for capacity) when the operator gives it up.
    store.update_worker(
        stopped,
        {"desired_status": WorkerStatus.TERMINATED, "next_reconcile_at": now + timedelta(minutes=10)},
        actor="test",
        action="DesiredStatusSet",
    )

    report = reconcile_fleet(ctx, now=now)

    assert store.get_worker(stopped.id).desired_status == WorkerStatus.TERMINATED
    assert report.counters["capacity_workers_woken"] == 0
    # It is leaving, not warm: the pool's one RUNNING worker is made anew.
    assert report.counters["capacity_workers_created"] == 1


def test_given_workers_from_before_member_counts_then_the_cycle_recounts_them_and_the_cap_holds(
    store: FleetStore, ctx: Context, live_worker: Callable[..., Any]
) -> None:
    for _ in range(3):
        live_worker(pool="labs")
    # As before member counts existed: the workers are in the exact counters, the pool has no count.
    client("dynamodb").delete_item(TableName=ctx.settings.table_name, Key=serialize(members_key("labs")))
    capacity_pool(store, min_workers=3)
    assert ctx.capacity.members("labs") == 0

    report = reconcile_fleet(ctx)

    assert report.counters["capacity_members_recounted"] == 1
    assert ctx.capacity.members("labs") == 3
    with pytest.raises(PoolFull):
        workers.create_worker(store, template="lab", region="us-east-1", pool="labs", actor="test")
    # Right now: a second recount adds nothing, and the next cycle does not try.
    assert ctx.capacity.recount_members("labs") == 0
    again = reconcile_fleet(ctx, now=utcnow() + timedelta(seconds=1))
    assert (again.counters["capacity_members_recounted"], again.counters["capacity_recounts_deferred"]) == (
        0,
        0,
    )
