"""A pool's disruption budgets bound scale-down through the reconcile cycle: a window blocks and then
releases, the refusals wait in the pool's disruption view, and the pool's budgets stand in for the stage
default while they apply."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from fleetkeeper.domain.admission import Ask, Held, WaitReason
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Instance, Worker, utcnow
from fleetkeeper.services import admission, catalog, disruption
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults

pytestmark = pytest.mark.integration

BERLIN = ZoneInfo("Europe/Berlin")
ENABLED = {"SCALE_DOWN_ENABLED": "true", "IDLE_WINDOW_SECONDS": "1800", "SCALE_DOWN_COOLDOWN_SECONDS": "0"}
# Always at most one at a time, and none from 09:00 to 17:00 Berlin time.
OFFICE_FREEZE = DisruptionPolicy(
    budgets=[
        Budget(max=1),
        Budget(
            max=0,
            schedule="0 9 * * *",
            duration="8h",
            timezone="Europe/Berlin",
            reasons=[DisruptionReason.SCALE_DOWN],
        ),
    ]
)


def tomorrow_in_berlin(hour: int) -> datetime:
    """A cycle's clock: tomorrow at `hour` Berlin time, after any idle_since these tests set."""
    day = (utcnow() + timedelta(days=1)).astimezone(BERLIN).date()
    return datetime(day.year, day.month, day.day, hour, tzinfo=BERLIN)


def idle(store: FleetStore, worker: Worker) -> Worker:
    return store.update_worker(
        worker, {"idle_since": utcnow() - timedelta(hours=1)}, actor="test", action="IdleSeeded"
    )


def pool_with(store: FleetStore, policy: DisruptionPolicy) -> None:
    catalog.put_pool(store, "labs", actor="test", disruption=policy)


def test_given_a_freeze_window_then_scale_down_waits_and_goes_ahead_when_the_window_ends(
    make_ctx, store, live_worker
):
    pool_with(store, OFFICE_FREEZE)
    idle_ones = [idle(store, live_worker(pool="labs")) for _ in range(3)]
    ctx = make_ctx(**ENABLED)
    office_hours = tomorrow_in_berlin(10)

    frozen = reconcile_fleet(ctx, now=office_hours)

    assert [store.get_worker(w.id).status for w in idle_ones] == [WorkerStatus.RUNNING] * 3
    assert frozen.counters["scale_down_refused_pool_budget"] == 3
    view = disruption.pool_view(ctx, "labs", now=office_hours)
    assert sorted(w.worker_id for w in view.waiting) == sorted(w.id for w in idle_ones)
    assert {(w.budget, w.allowed, w.in_use) for w in view.waiting} == {(1, 0, 0)}
    # Blocked until the window ends, 17:00 Berlin time.
    assert {w.until for w in view.waiting} == {tomorrow_in_berlin(17)}
    by_reason = {r.reason: r for r in view.reasons}
    assert (
        by_reason[DisruptionReason.SCALE_DOWN].limiting,
        by_reason[DisruptionReason.SCALE_DOWN].allowed,
    ) == (1, 0)
    assert by_reason[DisruptionReason.SCALE_DOWN].blocked_until == tomorrow_in_berlin(17)

    after_hours = tomorrow_in_berlin(17)
    released = reconcile_fleet(ctx, now=after_hours)

    statuses = sorted(store.get_worker(w.id).status for w in idle_ones)
    # The window is over: the always-on budget lets exactly one through; the others keep waiting on it.
    assert statuses == [WorkerStatus.RUNNING, WorkerStatus.RUNNING, WorkerStatus.STOPPING]
    assert released.counters["scale_down_stop_count"] == 1
    assert released.counters["scale_down_refused_pool_budget"] == 2
    later = disruption.pool_view(ctx, "labs", now=after_hours)
    assert later.in_use == 1
    assert len(later.waiting) == 2
    assert {(w.budget, w.allowed, w.in_use, w.until) for w in later.waiting} == {(0, 1, 1, None)}


def test_given_a_pool_budget_that_applies_then_it_stands_in_for_the_stage_default(
    make_ctx, store, live_worker, drains_started
):
    pool_with(store, DisruptionPolicy(budgets=[Budget(max=2, reasons=[DisruptionReason.SCALE_DOWN])]))
    for n in range(3):
        worker = live_worker(pool="labs")
        store.place_instance(Instance(id=f"i-busy{n}", worker_id=""), worker, actor="test")
        idle(store, store.get_worker(worker.id))
    loose = live_worker()
    store.place_instance(Instance(id="i-loose", worker_id=""), loose, actor="test")
    idle(store, store.get_worker(loose.id))
    live_worker()  # keeps the unpooled scope above its minimum

    # The stage default allows no drain at all; the pool's budget allows two.
    report = reconcile_fleet(make_ctx(**ENABLED, MAX_CONCURRENT_DRAINS="0"))

    started = {d["worker_id"] for d in drains_started}
    assert len(started) == 2
    assert loose.id not in started
    assert report.counters["scale_down_refused_pool_budget"] == 1
    assert report.counters["scale_down_refused_disruption_budget"] == 1
    # Both kinds of refusal wait where an operator looks: the pooled one on the pool's budget.
    view = disruption.pool_view(make_ctx(), "labs")
    assert [(w.budget, w.action) for w in view.waiting] == [(0, "drain")]


def test_given_workers_an_operator_drains_then_they_use_up_the_budget_for_scale_down(
    make_ctx, store, live_worker
):
    pool_with(store, DisruptionPolicy(budgets=[Budget(max=1)]))
    drained = live_worker(pool="labs")
    store.transition_worker(
        drained, WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="operator", reason="kernel patch"
    )
    waiting = idle(store, live_worker(pool="labs"))
    live_worker(pool="labs")

    report = reconcile_fleet(make_ctx(**ENABLED))

    assert store.get_worker(waiting.id).status == WorkerStatus.RUNNING
    assert report.counters["scale_down_refused_pool_budget"] == 1
    assert report.counters["scale_down_stop_count"] == 0


def test_given_an_operator_drains_between_the_doors_read_and_its_write_then_scale_down_waits(
    make_ctx, store, live_worker
):
    """The door decides on what it read; its admitting write carries the budget as a condition. An
    operator's drain that commits in between takes the pool's last place: the write fails, the door
    reads again and holds scale-down back."""
    pool_with(store, DisruptionPolicy(budgets=[Budget(max=1)]))
    waiting = idle(store, live_worker(pool="labs"))
    drained = live_worker(pool="labs")
    live_worker(pool="labs")
    fired: list[str] = []

    def operator_drains(params: dict[str, Any], **_: Any) -> None:
        admitting = any(
            "ConditionExpression" in item.get("Update", {})
            and item["Update"]["Key"]["PK"]["S"] == "DISRUPTING#labs"
            for item in params["TransactItems"]
        )
        if fired or not admitting:
            return
        fired.append(drained.id)
        store.transition_worker(
            store.get_worker(drained.id),
            WorkerStatus.DRAINING,
            cause=Cause.CONTROL,
            actor="operator",
            reason="kernel patch",
        )

    with faults.installed_hooks([("before-parameter-build.dynamodb.TransactWriteItems", operator_drains)]):
        report = reconcile_fleet(make_ctx(**ENABLED))

    assert fired == [drained.id]
    assert store.get_worker(waiting.id).status == WorkerStatus.RUNNING
    assert store.get_worker(drained.id).owner is not None
    assert report.counters["scale_down_refused_pool_budget"] == 1
    assert report.counters["scale_down_stop_count"] == 0
    view = disruption.pool_view(make_ctx(), "labs")
    assert (view.in_use, [w.worker_id for w in view.waiting]) == (1, [waiting.id])
    assert view.waiting[0].why == "budget"


def test_given_an_engine_outside_the_cycle_then_the_door_names_the_budget_and_until_when(
    make_ctx, store, live_worker
):
    rollout = DisruptionReason.ROLLOUT
    office = Budget(max=0, schedule="0 9 * * mon-fri", duration="8h", timezone="Europe/Berlin")
    pool_with(store, DisruptionPolicy(budgets=[Budget(max=1, reasons=[rollout]), office]))
    first, second, third = (live_worker(pool="labs") for _ in range(3))
    ctx = make_ctx()
    monday = tomorrow_in_berlin(12)
    while monday.weekday() != 0:
        monday += timedelta(days=1)
    ask = Ask(rollout, "rollout:ro-1", rollout_id="ro-1")

    with admission.door(ctx, monday - timedelta(hours=5)) as early:
        admitted = admission.hold_ahead(ctx, early, first.id, ask)
        refused = admission.hold_ahead(ctx, early, second.id, Ask(rollout, "rollout:ro-2", rollout_id="ro-2"))
    assert [(w.worker_id, w.why) for w in ctx.waiting.read("labs").entries] == [(second.id, "budget")]
    with admission.door(ctx, monday) as late:
        frozen = admission.hold_ahead(
            ctx, late, third.id, Ask(DisruptionReason.EXPIRED, "expiry", ahead=True)
        )

    assert isinstance(admitted, Worker)
    assert admitted.owner is not None
    assert (admitted.owner.reason, admitted.owner.counted) == ("rollout", True)
    assert isinstance(refused, Held)
    assert (refused.why, refused.budget, refused.allowed, refused.in_use) == (WaitReason.BUDGET, 0, 1, 1)
    assert isinstance(frozen, Held)
    assert (frozen.why, frozen.budget, frozen.allowed) == (WaitReason.WINDOW, 1, 0)
    assert frozen.until == monday.replace(hour=17)
    # The view shows what waits now: the older refusal has left its window of ten minutes (at `monday`).
    assert [(w.worker_id, w.why) for w in ctx.waiting.read("labs").entries] == [(third.id, "window")]
