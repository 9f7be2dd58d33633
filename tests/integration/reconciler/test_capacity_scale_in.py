"""Scale-in through the real cycle: a pool with a capacity policy gives back what its policy does not
want, as `underutilized` disruptions through the door, never a worker booked within the lead time,
never below its schedules, into the warm set first and then terminated; and a warm set above its
target gives back its oldest STOPPED workers, never one asked to start."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest

from fleetkeeper.domain.capacity import CapacityPolicy
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Instance, Worker, utcnow
from fleetkeeper.services import catalog
from fleetkeeper.services.context import Context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper.store.stats import StatsStore
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


def warm_pool(ec2: Any, store: FleetStore, live_worker: Callable[..., Worker], n: int) -> list[Worker]:
    """`n` STOPPED workers of the pool, oldest first."""
    made = []
    for worker in pool_workers(live_worker, n):
        ec2.stop_instances(InstanceIds=[worker.ec2_instance_id])
        made.append(store.transition_worker(worker, WorkerStatus.STOPPED, cause=Cause.EC2, actor="test"))
    return made


def raised_warm_set(store: FleetStore, disruption: DisruptionPolicy | None = None) -> datetime:
    """A policy keeping 1 warm, raised to 3 by a window of two hours from the current hour; when it began."""
    now = utcnow()
    window = {"schedule": f"0 {now.hour} * * *", "duration": "2h", "timezone": "UTC", "warm_workers": 3}
    policy(store, disruption=disruption, warm_workers=1, schedules=[window])
    return now


def test_given_a_window_that_raised_the_warm_set_ends_then_the_oldest_extra_stopped_workers_terminate(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker], ec2: Any
) -> None:
    oldest, older, newest = warm_pool(ec2, store, live_worker, 3)
    # Scale-in frozen: a STOPPED worker holds no session, so the freeze does not keep it.
    frozen = DisruptionPolicy(budgets=[Budget(max=0, reasons=[DisruptionReason.UNDERUTILIZED])])
    now = raised_warm_set(store, frozen)
    ctx = make_ctx(**ROOMY)

    inside = reconcile_fleet(ctx, now=now)
    assert inside.counters["scale_in_warm_terminate_count"] == 0
    assert statuses(store, [oldest, older, newest]) == ["STOPPED"] * 3

    after = reconcile_fleet(ctx, now=now + timedelta(hours=3))

    assert after.counters["scale_in_warm_terminate_count"] == 2
    assert statuses(store, [oldest, older, newest]) == ["TERMINATING", "TERMINATING", "STOPPED"]
    owner = store.get_worker(oldest.id).owner
    assert owner is not None
    assert (owner.reason, owner.actor) == (str(DisruptionReason.UNDERUTILIZED), "scale-in")
    for n in range(1, 4):
        settled = reconcile_fleet(ctx, now=now + timedelta(hours=3, seconds=n))
        assert settled.counters["scale_in_warm_terminate_count"] == 0
        assert settled.counters["capacity_workers_created"] == 0
    assert statuses(store, [oldest, older, newest]) == ["TERMINATED", "TERMINATED", "STOPPED"]
    assert ctx.capacity.members("labs") == 1


def test_given_the_oldest_warm_worker_asked_to_start_then_the_warm_set_shrinks_without_it(
    make_ctx: Callable[..., Context], store: FleetStore, live_worker: Callable[..., Worker], ec2: Any
) -> None:
    oldest, older, newest = warm_pool(ec2, store, live_worker, 3)
    now = raised_warm_set(store)
    ctx = make_ctx(**ROOMY)
    reconcile_fleet(ctx, now=now)
    # Asked to start, and waiting out a backoff (a start EC2 refused for capacity): it is still STOPPED.
    store.update_worker(
        store.get_worker(oldest.id),
        {"desired_status": WorkerStatus.RUNNING, "next_reconcile_at": now + timedelta(hours=4)},
        actor="test",
        action="DesiredStatusSet",
    )

    after = reconcile_fleet(ctx, now=now + timedelta(hours=3))

    assert after.counters["scale_in_warm_terminate_count"] == 1
    assert statuses(store, [oldest, older, newest]) == ["STOPPED", "TERMINATING", "STOPPED"]
    assert store.get_worker(oldest.id).desired_status == WorkerStatus.RUNNING
    later = reconcile_fleet(ctx, now=now + timedelta(hours=3, seconds=1))
    assert later.counters["scale_in_warm_terminate_count"] == 0
    assert store.get_worker(oldest.id).status == WorkerStatus.STOPPED


def test_given_two_cycles_trimming_the_warm_set_at_once_then_it_ends_at_its_target(
    make_ctx: Callable[..., Context],
    store: FleetStore,
    live_worker: Callable[..., Worker],
    ec2: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    warm = warm_pool(ec2, store, live_worker, 4)
    policy(store, warm_workers=1)
    # Two cycles of the same shard at once: a cycle that outlived its lease.
    monkeypatch.setattr(StatsStore, "acquire_lease", lambda *_args, **_kwargs: True)
    barrier = threading.Barrier(2)
    trims: list[int] = []

    def cycle(owner: str) -> None:
        ctx = make_ctx(**ROOMY)
        barrier.wait()
        trims.append(reconcile_fleet(ctx, owner=owner).counters["scale_in_warm_terminate_count"])

    threads = [threading.Thread(target=cycle, args=(f"cycle-{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert (len(trims), sum(trims)) == (2, 3)
    assert statuses(store, warm) == ["TERMINATING", "TERMINATING", "TERMINATING", "STOPPED"]
