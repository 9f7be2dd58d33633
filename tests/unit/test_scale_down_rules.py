"""Scale-down's own guards: each refuses for its own reason, in order (whether the worker may go, its
protection, the scope's minimum and the budgets, is the door's: tests/unit/test_admission.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetkeeper.domain.capacity import Rule, Target
from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DesiredLaunch, Drift, DriftReason, Worker, WorkerSummary
from fleetkeeper.domain.scale_down import (
    Action,
    DisruptionBudget,
    Guard,
    ScaleDownPolicy,
    booked_within,
    evaluate,
    next_idle_since,
    scale_in,
    warm_surplus,
)

NOW = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)
POLICY = ScaleDownPolicy(
    enabled=True,
    min_workers=1,
    cooldown=timedelta(minutes=10),
    idle_window=timedelta(minutes=30),
    cpu_threshold=5.0,
    lookahead=timedelta(minutes=15),
    budget=DisruptionBudget(count=2),
)


def idle_worker(**changes: object) -> Worker:
    w = Worker(
        id="w-1",
        template="lab",
        region="us-east-1",
        capacity=4,
        status=WorkerStatus.RUNNING,
        idle_since=NOW - timedelta(minutes=31),
    )
    return w.model_copy(update=changes)


def verdict(w: Worker, **overrides: object):
    arguments: dict[str, object] = {
        "now": NOW,
        "policy": POLICY,
        "last_scale_down_at": None,
        "timeslot_starts": list,
    }
    arguments.update(overrides)
    return evaluate(w, **arguments)  # type: ignore[arg-type]


def test_given_idle_and_empty_then_stop_at_once():
    assert verdict(idle_worker()).action is Action.STOP


def test_given_idle_with_instances_then_drain():
    assert verdict(idle_worker(active_instances=2)).action is Action.DRAIN


def test_given_idle_for_less_than_the_window_then_nothing_and_no_guard_counted():
    result = verdict(idle_worker(idle_since=NOW - timedelta(minutes=29)))
    assert (result.action, result.refused_by) == (Action.NONE, None)


def test_given_scale_down_disabled_then_the_enabled_guard_refuses():
    policy = ScaleDownPolicy(**{**POLICY.__dict__, "enabled": False})
    assert verdict(idle_worker(), policy=policy).refused_by is Guard.DISABLED


def test_given_a_recent_scale_down_then_cooldown_refuses():
    result = verdict(idle_worker(), last_scale_down_at=NOW - timedelta(minutes=5))
    assert result.refused_by is Guard.COOLDOWN
    assert verdict(idle_worker(), last_scale_down_at=NOW - timedelta(minutes=11)).action is Action.STOP


def test_given_a_timeslot_starting_within_the_lookahead_then_it_refuses():
    result = verdict(idle_worker(active_instances=1), timeslot_starts=lambda: [NOW + timedelta(minutes=10)])
    assert result.refused_by is Guard.UPCOMING_TIMESLOT
    later = verdict(idle_worker(active_instances=1), timeslot_starts=lambda: [NOW + timedelta(hours=1)])
    assert later.action is Action.DRAIN


@pytest.mark.parametrize(
    ("text", "fleet", "allowed"), [("3", 100, 3), ("10%", 100, 10), ("10%", 5, 1), ("0%", 50, 0)]
)
def test_given_a_budget_text_then_it_allows_a_count_or_a_rounded_up_share(text, fleet, allowed):
    assert DisruptionBudget.parse(text).allowed(fleet) == allowed


@pytest.mark.parametrize("text", ["ten", "1.5", "-1"])
def test_given_a_bad_budget_then_the_variable_is_named(text):
    with pytest.raises(InvalidInput, match="MAX_CONCURRENT_DRAINS"):
        DisruptionBudget.parse(text)


def test_given_cpu_readings_then_idle_since_starts_holds_and_resets():
    assert next_idle_since(None, 1.0, 5.0, NOW) == NOW
    assert next_idle_since(NOW - timedelta(minutes=3), 1.0, 5.0, NOW) == NOW - timedelta(minutes=3)
    assert next_idle_since(NOW - timedelta(minutes=3), None, 5.0, NOW) == NOW - timedelta(minutes=3)
    assert next_idle_since(NOW - timedelta(minutes=3), 50.0, 5.0, NOW) is None


def running(active: dict[str, int]) -> list[WorkerSummary]:
    return [
        WorkerSummary(id=i, template="lab", region="us-east-1", capacity=4, active_instances=n)
        for i, n in active.items()
    ]


def target(*, floor: int = 0, headroom: int = 0, bookings: int = 0) -> Target:
    return Target(
        workers=floor,
        warm=0,
        rule=Rule.MIN_WORKERS,
        wanted=floor,
        capped=False,
        headroom_slots=headroom,
        floor=floor,
        bookings=bookings,
    )


def test_given_spare_workers_then_scale_in_takes_the_empty_then_the_least_loaded_never_a_full_one() -> None:
    pool = running({"w-a": 2, "w-b": 0, "w-c": 4, "w-d": 1, "w-e": 0})

    taken = scale_in(target(), pool, cap=None, kept=lambda _: None)

    assert [w.id for w in taken] == ["w-b", "w-e", "w-d", "w-a"]


def test_given_a_headroom_and_a_floor_then_scale_in_stops_where_either_would_be_broken() -> None:
    pool = running({"w-a": 0, "w-b": 0, "w-c": 0, "w-d": 3})

    # 13 free slots, 6 must stay: one empty worker may go (9 left), a second would leave 5; the busy
    # one's single free slot may (8 left), its instances finishing while it drains.
    assert [w.id for w in scale_in(target(headroom=6), pool, cap=None, kept=lambda _: None)] == ["w-a", "w-d"]
    # Three must stay running, whatever the slots.
    assert [w.id for w in scale_in(target(floor=3), pool, cap=None, kept=lambda _: None)] == ["w-a"]
    # Above the cap, the headroom gives way: down to max_workers.
    assert [w.id for w in scale_in(target(headroom=13), pool, cap=3, kept=lambda _: None)] == ["w-a"]


def test_given_bookings_due_then_scale_in_keeps_a_free_slot_for_each() -> None:
    pool = running({"w-a": 0, "w-b": 0, "w-c": 3})

    # 9 free slots, 5 due bookings about to be placed: one empty worker may go (5 left), not two.
    assert [w.id for w in scale_in(target(bookings=5), pool, cap=None, kept=lambda _: None)] == ["w-a"]
    # With the headroom too, both are kept free: 4 + 5 leaves no free slot to give back.
    assert scale_in(target(headroom=4, bookings=5), pool, cap=None, kept=lambda _: None) == []


def test_given_a_worker_that_must_stay_then_the_next_one_goes_in_its_place() -> None:
    pool = running({"w-a": 0, "w-b": 0, "w-c": 0})

    taken = scale_in(
        target(floor=1), pool, cap=None, kept=lambda w: Guard.DO_NOT_DISRUPT if w.id == "w-a" else None
    )

    assert [w.id for w in taken] == ["w-b", "w-c"]


def test_given_timeslots_then_only_one_by_the_due_horizon_books_the_worker() -> None:
    lead = timedelta(minutes=10)
    assert booked_within(
        [NOW + timedelta(hours=2), NOW + timedelta(minutes=9)], NOW, lead
    ) == NOW + timedelta(minutes=9)
    # A booking is placed from two lead times ahead: 11 minutes out, its worker is already needed.
    assert booked_within([NOW + timedelta(minutes=11)], NOW, lead) == NOW + timedelta(minutes=11)
    assert booked_within([NOW + timedelta(minutes=21), NOW - timedelta(minutes=1)], NOW, lead) is None


def stopped(worker_id: str, *, age_days: int, **changes: object) -> Worker:
    w = Worker(
        id=worker_id,
        template="lab",
        region="us-east-1",
        capacity=4,
        status=WorkerStatus.STOPPED,
        launched_at=NOW - timedelta(days=age_days),
    )
    return w.model_copy(update=changes)


def warm_target(warm: int, *, workers: int = 0) -> Target:
    return Target(workers=workers, warm=warm, rule=Rule.MIN_WORKERS, wanted=workers, capped=False)


def trimmed(
    target: Target, warm: list[Worker], *, stopping: int = 0, refilling: int = 0, limit: int = 10
) -> list[str]:
    chosen = warm_surplus(
        target,
        warm,
        running=0,
        launching=0,
        stopping=stopping,
        refilling=refilling,
        template="lab",
        now=NOW,
        limit=limit,
    )
    return [w.id for w in chosen]


def test_given_a_warm_set_beyond_its_target_then_the_oldest_go_and_the_newest_stay() -> None:
    warm = [stopped("w-new", age_days=1), stopped("w-old", age_days=9), stopped("w-mid", age_days=5)]

    assert trimmed(warm_target(1), warm) == ["w-old", "w-mid"]
    assert trimmed(warm_target(3), warm) == []
    # Bounded per cycle: the next cycle takes the rest.
    assert trimmed(warm_target(0), warm, limit=2) == ["w-old", "w-mid"]


def test_given_workers_of_another_template_or_drifted_then_they_go_before_older_ones() -> None:
    drift = Drift(
        reasons=[DriftReason.IMAGE],
        desired=DesiredLaunch(image_id="ami-2", instance_type="m5.large"),
        since=NOW,
    )
    warm = [
        stopped("w-old", age_days=9),
        stopped("w-drifted", age_days=2, drift=drift),
        stopped("w-other", age_days=1, template="lab-v1"),
    ]

    assert trimmed(warm_target(0), warm) == ["w-other", "w-drifted", "w-old"]


def test_given_stopping_refills_and_workers_to_wake_then_the_surplus_counts_them_as_scale_out_does() -> None:
    warm = [stopped("w-a", age_days=3), stopped("w-b", age_days=2), stopped("w-c", age_days=1)]

    # One stopping and one launching to refill fill the warm set of 2 already: every STOPPED one is over.
    assert trimmed(warm_target(2), warm, stopping=1, refilling=1) == ["w-a", "w-b", "w-c"]
    # Scale-out wakes one for the RUNNING target first: only two are left asleep, one of them over.
    assert trimmed(warm_target(1, workers=1), warm) == ["w-a"]
    # However many stopping are over, only a STOPPED worker left asleep goes.
    assert trimmed(warm_target(0, workers=2), warm, stopping=3) == ["w-a"]


def test_given_a_protected_warm_worker_then_it_stays_and_counts_in_the_warm_set() -> None:
    pinned = stopped("w-old", age_days=9, do_not_disrupt_until=NOW + timedelta(hours=1))
    warm = [pinned, stopped("w-mid", age_days=5), stopped("w-new", age_days=1)]

    assert trimmed(warm_target(1), warm) == ["w-mid", "w-new"]
    assert trimmed(warm_target(2), warm) == ["w-mid"]
