"""Scale-in through the real cycle: a pool with a capacity policy gives back what its policy does not
want, as `underutilized` disruptions through the door, never a worker booked within the lead time,
never below its schedules, into the warm set first and then terminated."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.capacity import CapacityPolicy
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainThen, Instance, Worker, utcnow
from fleetkeeper.services import catalog
from fleetkeeper.services.context import Context
from fleetkeeper.store.repository import FleetStore
from tests.integration.functions import reconcile_fleet

pytestmark = pytest.mark.integration

# Small test fleets: the stage default (10 % of the fleet) would let one disruption through per cycle.
ROOMY = {"MAX_CONCURRENT_DRAINS": "10"}


def policy(store: FleetStore, disruption: DisruptionPolicy | None = None, **fields: Any) -> None:
    wanted = CapacityPolicy.model_validate({"template": "lab", "max_workers": 5, **fields})
    catalog.put_pool(store, "labs", actor="test", capacity=wanted, disruption=disruption)


def pool_workers(live_worker: Callable[..., Worker], n: int) -> list[Worker]:
    return [live_worker(pool="labs") for _ in range(n)]


def statuses(store: FleetStore, workers: list[Worker]) -> list[str]:
    return [str(store.get_worker(w.id).status) for w in workers]


def test_given_a_worker_booked_within_the_lead_time_then_scale_in_keeps_it_and_takes_the_others(
    make_ctx: Callable[..., Context],
    store: FleetStore,
    live_worker: Callable[..., Worker],
    drains_started: list[dict[str, Any]],
) -> None:
    soon, later, empty = pool_workers(live_worker, 3)
    now = utcnow()
    # The default lead time is 10 minutes: 5 minutes ahead is within it, 3 hours is not.
    store.place_instance(
        Instance(id="i-soon", worker_id="", timeslot_start=now + timedelta(minutes=5)), soon, actor="t"
    )
    store.place_instance(
        Instance(id="i-later", worker_id="", timeslot_start=now + timedelta(hours=3)), later, actor="t"
    )
    policy(store)

    report = reconcile_fleet(make_ctx(**ROOMY))

    assert report.counters["scale_in_refused_upcoming_timeslot"] == 1
    kept = store.get_worker(soon.id)
    assert (kept.status, kept.owner) == (WorkerStatus.RUNNING, None)
    # The empty one goes at once; the loaded one is drained, its booking well beyond the lead time.
    assert store.get_worker(empty.id).status == WorkerStatus.TERMINATING
    assert [(d["worker_id"], d["then"]) for d in drains_started] == [(later.id, DrainThen.TERMINATE)]
    owner = store.get_worker(later.id).owner
    assert owner is not None
    assert owner.reason == str(DisruptionReason.UNDERUTILIZED)


def test_given_three_spare_workers_and_one_warm_place_then_one_stops_to_warm_and_two_terminate(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker]
) -> None:
    spare = pool_workers(live_worker, 3)
    policy(store, warm_workers=1)
    ctx = make_ctx(**ROOMY)

    first = reconcile_fleet(ctx)

    assert (first.counters["scale_in_stop_count"], first.counters["scale_in_terminate_count"]) == (1, 2)
    assert sorted(statuses(store, spare)) == ["STOPPING", "TERMINATING", "TERMINATING"]
    # Once EC2 has stopped and terminated them: one warm, and only it counts against max_workers.
    for n in range(1, 4):
        reconcile_fleet(ctx, now=utcnow() + timedelta(seconds=n))
    assert sorted(statuses(store, spare)) == ["STOPPED", "TERMINATED", "TERMINATED"]
    assert ctx.capacity.members("labs") == 1
    # The warm set is full: the next cycle neither starts nor launches anything for it.
    settled = reconcile_fleet(ctx, now=utcnow() + timedelta(seconds=5))
    assert (settled.counters["capacity_workers_created"], settled.counters["capacity_workers_woken"]) == (
        0,
        0,
    )


def test_given_a_budget_of_zero_for_underutilized_then_no_worker_goes_and_the_pool_says_why(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker]
) -> None:
    spare = pool_workers(live_worker, 2)
    frozen = DisruptionPolicy(budgets=[Budget(max=0, reasons=[DisruptionReason.UNDERUTILIZED])])
    policy(store, disruption=frozen)
    ctx = make_ctx(**ROOMY)

    report = reconcile_fleet(ctx)

    assert report.counters["scale_in_refused_pool_budget"] == 2
    assert statuses(store, spare) == ["RUNNING", "RUNNING"]
    waiting = ctx.waiting.read("labs").entries
    assert sorted((str(w.reason), w.why) for w in waiting) == [("underutilized", "budget")] * 2


def test_given_a_protected_spare_worker_then_scale_in_takes_another_in_its_place(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker]
) -> None:
    spare = pool_workers(live_worker, 3)
    protected = sorted(spare, key=lambda w: w.id)[0]  # the one scale-in would rank first
    store.update_worker(protected, {"do_not_disrupt": True}, actor="test", action="Protected")
    policy(store, min_workers=1)

    report = reconcile_fleet(make_ctx(**ROOMY))

    assert report.counters["scale_in_refused_do_not_disrupt"] == 1
    assert store.get_worker(protected.id).status == WorkerStatus.RUNNING
    # Two may go to keep min_workers 1: the protected one stays as that one, the other two go.
    assert sorted(statuses(store, spare)) == ["RUNNING", "TERMINATING", "TERMINATING"]


def test_given_an_active_schedule_then_scale_in_keeps_its_workers_until_the_window_ends(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker]
) -> None:
    spare = pool_workers(live_worker, 3)
    now = utcnow()
    window = {"schedule": f"0 {now.hour} * * *", "duration": "2h", "timezone": "UTC", "min_workers": 2}
    policy(store, schedules=[window])
    ctx = make_ctx(**ROOMY)

    inside = reconcile_fleet(ctx, now=now)
    running = [w for w in spare if store.get_worker(w.id).status == WorkerStatus.RUNNING]

    assert inside.counters["scale_in_terminate_count"] == 1
    assert len(running) == 2
    after = reconcile_fleet(ctx, now=now + timedelta(hours=3))
    assert after.counters["scale_in_terminate_count"] == 2
    assert statuses(store, running) == ["TERMINATING", "TERMINATING"]
