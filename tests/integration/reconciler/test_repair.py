"""Repair through the reconcile cycle: a sick worker past its toleration gets a replacement, which runs
before the sick worker's drain starts; the brake holds a pool's repairs while too much of it is sick; a
scheduled event waits for the pool's budgets like any repair until its latest start, and is imposed
from then on (AWS's date); a report withdrawn or an event cancelled ends the repair before its drain."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import pytest

from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainThen, Instance, Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.repair import HealthSource, HealthStatus, ScheduledEvent, Signal
from fleetkeeper.domain.sharding import Shard, shard_of
from fleetkeeper.services import catalog, disruption, instances, repair, workers
from fleetkeeper.services.reconcile import replacement
from fleetkeeper.services.reconcile.cycle import CycleReport
from fleetkeeper.services.reconcile.replacement import replacement_id
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from fleetkeeper_local.event_shapes import health_event
from fleetkeeper_local.images import publish_newer_image
from fleetkeeper_local.invocation import invoke
from tests.integration.conftest import ControlPlane
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory
from tests.integration.reconciler.support import launch

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S = WorkerStatus
SICK = HealthStatus.UNHEALTHY
WELL = HealthStatus.HEALTHY
IMPAIRED = Signal(SICK, HealthSource.STATUS_CHECK, "instance status impaired")


def pool_of(
    store: FleetStore, ec2: Any, size: int, *, drain_timeout_hours: float = 4.0, pool: str = "labs"
) -> list[Worker]:
    """RUNNING workers of template `lab` in `pool`, each on a machine of the emulator."""
    catalog.put_template(
        store,
        WorkerTemplate(
            name="lab",
            instance_type="m5.large",
            ami_name_filter="lab-*",
            capacity=4,
            drain_timeout_hours=drain_timeout_hours,
        ),
        actor="test",
    )
    catalog.ensure_pool(store, pool, actor="test")
    image, _ = publish_newer_image(ec2, "lab-*")
    fleet = []
    for _ in range(size):
        worker = workers.create_worker(store, template="lab", region="us-east-1", pool=pool, actor="test")
        worker = store.transition_worker(
            worker,
            S.PROVISIONING,
            cause=Cause.CONTROL,
            actor="test",
            changes={
                "ec2_instance_id": launch(ec2, worker.id, image),
                "image_id": image,
                "instance_type": "m5.large",
                "launched_at": utcnow(),
            },
        )
        fleet.append(
            store.transition_worker(
                worker, S.RUNNING, cause=Cause.EC2, actor="test", changes={"private_ip": "10.0.0.9"}
            )
        )
    return fleet


def cycles(make_ctx: ContextFactory, at: datetime, count: int) -> list[CycleReport]:
    """`count` reconcile cycles at `at`, a minute apart."""
    return [reconcile_fleet(make_ctx(), now=at + timedelta(minutes=i)) for i in range(count)]


def signal(
    ctx_factory: ContextFactory, worker_id: str, *signals: Signal, at: datetime | None = None
) -> Worker:
    return repair.record_health(ctx_factory(), worker_id, list(signals), actor="test", now=at)


def total(reports: Sequence[CycleReport], counter: str) -> int:
    return sum(r.counters[counter] for r in reports)


RETIRING = Signal(
    SICK,
    HealthSource.SCHEDULED_EVENT,
    "instance-retirement",
    ScheduledEvent(code="instance-retirement", not_before=utcnow() + timedelta(days=3)),
)
SICKNESSES = [pytest.param(IMPAIRED, id="impaired"), pytest.param(RETIRING, id="retiring")]


@pytest.mark.parametrize(
    "case", [(IMPAIRED, "pack"), (RETIRING, "spread")], ids=["impaired-pack", "retiring-spread"]
)
def test_given_a_sick_worker_then_its_healthy_neighbour_takes_every_new_session(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, case: tuple[Signal, str]
) -> None:
    sickness, strategy = case
    # The sick worker is the first by id, so every ranking would try it first.
    sick, neighbour = sorted(pool_of(store, ec2, 2), key=lambda w: w.id)
    signal(make_ctx, sick.id, sickness)

    answers = [
        control_plane.api("POST", "/api/v1/instances", {"pool": "labs", "strategy": strategy})
        for _ in range(5)
    ]

    assert [status for status, _ in answers] == [201] * 4 + [409]
    assert {body["worker_id"] for _, body in answers[:4]} == {neighbour.id}
    assert answers[4][1]["error"] == "NO_CAPACITY"
    assert [store.get_worker(w.id).active_instances for w in (sick, neighbour)] == [0, 4]
    status, body = control_plane.api("POST", "/api/v1/instances", {"worker_id": sick.id})
    assert (status, body["error"]) == (409, "CONFLICT")
    assert "unhealthy" in body["message"]


@pytest.mark.parametrize("sickness", SICKNESSES)
def test_given_the_only_worker_sick_then_a_placement_is_no_capacity_and_the_transaction_refuses_it(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, sickness: Signal
) -> None:
    (only,) = pool_of(store, ec2, 1)
    signal(make_ctx, only.id, sickness)

    status, body = control_plane.api("POST", "/api/v1/instances", {"pool": "labs"})

    assert (status, body["error"]) == (409, "NO_CAPACITY")
    # A stale read that still shows it healthy (an index summary) loses on the worker item's condition.
    with pytest.raises(Conflict, match="unhealthy"):
        store.place_instance(Instance(id="s-stale", worker_id=""), only, actor="test")
    assert store.get_worker(only.id).active_instances == 0


def test_given_an_impaired_worker_past_its_toleration_then_its_replacement_runs_before_its_drain(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, drains_started
) -> None:
    sick, *_ = pool_of(store, ec2, 8)
    t0 = utcnow()
    signal(make_ctx, sick.id, IMPAIRED, at=t0)

    early = reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=9))

    assert early.counters["repair_replacements"] == 0
    assert store.find_worker(replacement_id(sick.id, "repair")) is None

    first = reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=10))

    made = store.get_worker(replacement_id(sick.id, "repair"))
    assert (made.template, made.pool, made.status) == ("lab", "labs", S.PENDING)
    held = store.get_worker(sick.id)
    # Owned by the repair and counted, not drained while its replacement launches.
    assert held.status == S.RUNNING, first.counters
    assert held.owner is not None
    assert (held.owner.reason, held.owner.actor) == ("repair", "reconciler")
    assert drains_started == []

    later = cycles(make_ctx, t0 + timedelta(minutes=11), 4)

    assert store.get_worker(made.id).status == S.RUNNING
    assert total(later, "repair_drains") == 1, [r.counters for r in later]
    assert [d["worker_id"] for d in drains_started] == [sick.id]
    (drain,) = drains_started
    assert (drain["then"], drain["timeout_seconds"], drain["requested_by"]) == (
        DrainThen.TERMINATE,
        1800,
        "reconciler",
    )
    assert drain["reason"] == "repair: failed status check: instance status impaired"


def test_given_a_report_withdrawn_within_its_toleration_then_nothing_is_repaired(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, drains_started
) -> None:
    sick, *_ = pool_of(store, ec2, 8)
    t0 = utcnow()
    signal(make_ctx, sick.id, Signal(SICK, HealthSource.REPORTED, "disk full"), at=t0)
    reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=4))

    healed = signal(
        make_ctx, sick.id, Signal(WELL, HealthSource.REPORTED, "disk cleaned"), at=t0 + timedelta(minutes=4)
    )
    report = reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=30))

    assert healed.health is not None
    assert (healed.health.status, healed.health.reason) == (WELL, "disk cleaned")
    assert report.counters["repair_replacements"] == 0
    assert store.find_worker(replacement_id(sick.id, "repair")) is None
    assert drains_started == []


def test_given_a_report_withdrawn_after_its_replacement_was_made_then_the_admission_is_given_back(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, drains_started
) -> None:
    sick, *_ = pool_of(store, ec2, 8)
    t0 = utcnow()
    signal(make_ctx, sick.id, Signal(SICK, HealthSource.REPORTED, "disk full"), at=t0)
    reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=6))
    assert store.get_worker(sick.id).owner is not None

    signal(make_ctx, sick.id, Signal(WELL, HealthSource.REPORTED), at=t0 + timedelta(minutes=7))
    cycles(make_ctx, t0 + timedelta(minutes=8), 3)

    left = store.get_worker(sick.id)
    assert (left.status, left.owner) == (S.RUNNING, None)
    assert drains_started == []


def test_given_a_quarter_of_a_pool_impaired_then_the_brake_holds_every_repair_until_one_recovers(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, drains_started
) -> None:
    first, second, *_ = pool_of(store, ec2, 8)
    t0 = utcnow()
    signal(make_ctx, first.id, IMPAIRED, at=t0)
    signal(make_ctx, second.id, IMPAIRED, at=t0)

    braked = cycles(make_ctx, t0 + timedelta(minutes=11), 2)

    assert total(braked, "repair_held_repair_brake") == 4
    assert total(braked, "repair_replacements") == 0
    assert all(store.get_worker(w.id).owner is None for w in (first, second))
    waiting = make_ctx().waiting.read("labs").entries
    assert {(w.worker_id, w.why, w.detail) for w in waiting} == {
        (first.id, "repair_brake", "repair brake, 2 of 8 unhealthy"),
        (second.id, "repair_brake", "repair brake, 2 of 8 unhealthy"),
    }

    assert disruption.pool_view(make_ctx(), "labs").repair.blocked == "repair brake, 2 of 8 unhealthy"

    signal(make_ctx, second.id, Signal(WELL, HealthSource.STATUS_CHECK, "ok"), at=t0 + timedelta(minutes=13))

    released = reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=14))

    # The view shows the brake as of the last cycle, while the refusals stay listed as waiting a while.
    view = disruption.pool_view(make_ctx(), "labs")
    assert view.repair.blocked is None
    assert "repair_brake" in {w.why for w in view.waiting}
    assert released.counters["repair_held_repair_brake"] == 0
    assert released.counters["repair_replacements"] == 1
    assert store.find_worker(replacement_id(first.id, "repair")) is not None
    assert store.find_worker(replacement_id(second.id, "repair")) is None


def test_given_members_the_lagging_index_does_not_show_yet_then_the_brake_counts_them_exactly(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]]
) -> None:
    first, second, *_ = pool_of(store, ec2, 6)
    t0 = utcnow()
    plan = faults.FaultPlan(index_lag_seconds=600)

    with plan.installed():
        # Four more members, and two sick: 2 of 10 is 20 %, which does not hold the brake; the index,
        # which does not list the four yet, would make it 2 of 6.
        pool_of(make_ctx().store, ec2, 4)
        signal(make_ctx, first.id, IMPAIRED, at=t0)
        signal(make_ctx, second.id, IMPAIRED, at=t0)
        listed = make_ctx().store.workers_in_pool("labs")
        report = reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=11))

    assert len(listed) == 6
    assert report.counters["repair_held_repair_brake"] == 0, report.counters
    assert report.notes[repair.BRAKE_NOTE] == {}
    # The pool's default budget lets one disruption at a time: the other waits on it, not on the brake.
    assert (report.counters["repair_replacements"], report.counters["repair_held_budget"]) == (1, 1)


def live_replacement(store: FleetStore, worker_id: str) -> Worker | None:
    """The live repair replacement of the worker, whichever attempt made it."""
    for attempt in range(5):
        found = store.find_worker(replacement_id(worker_id, "repair", attempt))
        if found is not None and found.status not in {S.FAILED, S.TERMINATING, S.TERMINATED}:
            return found
    return None


@pytest.mark.parametrize("size", [1, 4])
def test_given_a_small_pool_with_one_impaired_worker_then_it_is_repaired(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]], size: int
) -> None:
    sick, *_ = pool_of(store, ec2, size)
    t0 = utcnow()
    signal(make_ctx, sick.id, IMPAIRED, at=t0)

    reports = cycles(make_ctx, t0 + timedelta(minutes=11), 2)

    assert total(reports, "repair_held_repair_brake") == 0, [r.counters for r in reports]
    assert live_replacement(store, sick.id) is not None


def test_given_a_braked_pool_with_ten_sick_workers_then_another_pools_sick_worker_is_still_repaired(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]]
) -> None:
    braked = pool_of(store, ec2, 10, pool="braked")
    sick, *_ = pool_of(store, ec2, 8, pool="healthy")
    t0 = utcnow()
    for worker in braked:
        signal(make_ctx, worker.id, IMPAIRED, at=t0)
    signal(make_ctx, sick.id, IMPAIRED, at=t0 + timedelta(minutes=1))

    reports = cycles(make_ctx, t0 + timedelta(minutes=12), 2)

    # 1 of 8 in its own pool: its brake does not hold, and the braked pool's ten take no place of the cap.
    assert live_replacement(store, sick.id) is not None, [r.counters for r in reports]
    assert total(reports, "repair_held_repair_brake") == 20
    assert total(reports, "repair_deferred") == 0
    assert all(live_replacement(store, w.id) is None for w in braked)


def test_given_a_sharded_reconciler_then_the_brake_counts_the_whole_pool(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]]
) -> None:
    shards = 16
    fleet = pool_of(store, ec2, 10)
    sick, other = fleet[0], fleet[1]
    index = shard_of(sick.id, shards)
    # What a shard's share would get wrong: the sick worker's shard holds fewer than 5 of the pool's 10.
    assert sum(1 for w in fleet if shard_of(w.id, shards) == index) < 5
    t0 = utcnow()
    signal(make_ctx, sick.id, IMPAIRED, at=t0)

    def shard_cycle(minute: int) -> CycleReport:
        return reconcile_fleet(
            make_ctx(RECONCILE_SHARDS=str(shards)),
            shard=Shard(index, shards),
            owner=f"shard-{index}",
            now=t0 + timedelta(minutes=minute),
        )

    reports = [shard_cycle(11), shard_cycle(12)]

    assert total(reports, "repair_held_repair_brake") == 0, [r.counters for r in reports]
    assert live_replacement(store, sick.id) is not None
    # A second sick member elsewhere in the pool, in no shard this cycle reads: 2 of 10 is 20 %, and a
    # third makes 30 %, which holds the brake for the sick worker's shard too.
    signal(make_ctx, other.id, IMPAIRED, at=t0)
    signal(make_ctx, fleet[2].id, IMPAIRED, at=t0)
    held = shard_cycle(13)
    assert held.counters["repair_held_repair_brake"] >= 1, held.counters
    # 10 members, or 11 once the replacement runs.
    assert held.notes[repair.BRAKE_NOTE]["labs"] in {f"repair brake, 3 of {n} unhealthy" for n in (10, 11)}


def test_given_a_report_withdrawn_while_the_cycle_repairs_then_the_healthy_worker_is_not_drained(
    make_ctx: ContextFactory,
    store: FleetStore,
    ec2: Any,
    drains_started: list[dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    worker, *_ = pool_of(store, ec2, 8)
    t0 = utcnow()
    signal(make_ctx, worker.id, Signal(SICK, HealthSource.REPORTED, "disk full"), at=t0)
    reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=6))
    made = store.get_worker(replacement_id(worker.id, "repair"))
    image, _ = publish_newer_image(ec2, "lab-*")
    made = store.transition_worker(
        made,
        S.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"ec2_instance_id": launch(ec2, made.id, image), "image_id": image},
    )
    store.transition_worker(
        made, S.RUNNING, cause=Cause.EC2, actor="test", changes={"private_ip": "10.0.0.8"}
    )
    real = replacement.ensure_replacement

    def agent_withdraws_meanwhile(*args: Any, **kwargs: Any) -> Worker | None:
        found = real(*args, **kwargs)
        signal(
            make_ctx,
            worker.id,
            Signal(WELL, HealthSource.REPORTED, "disk cleaned"),
            at=t0 + timedelta(minutes=7),
        )
        return found

    monkeypatch.setattr(replacement, "ensure_replacement", agent_withdraws_meanwhile)

    # Room for more than one drain at once, as any fleet bigger than a handful has.
    report = reconcile_fleet(make_ctx(MAX_CONCURRENT_DRAINS="10"), now=t0 + timedelta(minutes=7))

    left = store.get_worker(worker.id)
    assert left.health is not None
    assert left.health.status == WELL
    assert (left.status, left.owner, report.counters["repair_drains"], drains_started) == (
        S.RUNNING,
        None,
        0,
        [],
    )
    assert report.counters["repair_no_longer_due"] == 1


@pytest.mark.usefixtures("handler_context")
def test_given_a_retirement_closed_before_its_late_open_event_then_the_worker_is_not_repaired(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]]
) -> None:
    worker, *_ = pool_of(store, ec2, 8)
    assert worker.ec2_instance_id is not None
    t0 = utcnow()
    not_before = (t0 + timedelta(days=3)).replace(microsecond=0)

    def retirement(*, closed: bool, at: datetime) -> dict[str, Any]:
        assert worker.ec2_instance_id is not None
        return health_event(
            worker.ec2_instance_id,
            code="instance-retirement",
            not_before=not_before,
            event_id="e-late",
            closed=closed,
            region="us-east-1",
            at=at,
        )

    opened = retirement(closed=False, at=t0 - timedelta(minutes=10))
    closed = retirement(closed=True, at=t0 - timedelta(minutes=1))

    # EventBridge delivers out of order: the close first, then a retry of the older open.
    invoke("ec2_events", closed)
    invoke("ec2_events", opened)
    report = reconcile_fleet(make_ctx(), now=t0)

    health = store.get_worker(worker.id).health
    assert health is None or health.status == WELL, health
    assert report.counters["repair_replacements"] == 0
    assert store.get_worker(worker.id).owner is None


def test_given_three_withdrawn_repairs_earlier_then_a_new_sickness_is_still_repaired(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]]
) -> None:
    worker, *_ = pool_of(store, ec2, 8)
    at = utcnow()
    for episode in range(3):
        signal(make_ctx, worker.id, Signal(SICK, HealthSource.REPORTED, "disk full"), at=at)
        reconcile_fleet(make_ctx(), now=at + timedelta(minutes=6))
        made = store.get_worker(replacement_id(worker.id, "repair", episode))
        # The agent withdraws its report: the admission is given back, the replacement stays...
        signal(
            make_ctx,
            worker.id,
            Signal(WELL, HealthSource.REPORTED, "disk cleaned"),
            at=at + timedelta(minutes=7),
        )
        assert store.get_worker(worker.id).owner is None
        # ...and the pool, one worker too many, is scaled down by it.
        store.transition_worker(made, S.TERMINATED, cause=Cause.CONTROL, actor="scale-down")
        at += timedelta(hours=1)

    signal(make_ctx, worker.id, IMPAIRED, at=at)
    reports = [reconcile_fleet(make_ctx(), now=at + timedelta(minutes=11 + i)) for i in range(2)]

    assert sum(r.counters["repair_replacement_failed"] for r in reports) == 0, [r.counters for r in reports]
    assert live_replacement(store, worker.id) is not None


def test_given_every_replacement_of_one_sickness_ended_then_its_repair_waits_for_an_operator(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]]
) -> None:
    worker, *_ = pool_of(store, ec2, 8)
    at = utcnow()
    signal(make_ctx, worker.id, IMPAIRED, at=at)
    for attempt in range(3):
        report = reconcile_fleet(make_ctx(), now=at + timedelta(minutes=11 + attempt))
        assert report.counters["repair_replacements"] == 1, report.counters
        made = store.get_worker(replacement_id(worker.id, "repair", attempt))
        store.transition_worker(made, S.TERMINATED, cause=Cause.CONTROL, actor="test")

    report = reconcile_fleet(make_ctx(), now=at + timedelta(minutes=14))

    assert (report.counters["repair_replacement_failed"], report.counters["repair_replacements"]) == (1, 0)
    assert live_replacement(store, worker.id) is None
    assert store.get_worker(worker.id).owner is None
    assert drains_started == []


def test_given_a_worker_stopped_while_impaired_when_it_runs_again_then_it_is_not_repaired_at_once(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]]
) -> None:
    worker, *_ = pool_of(store, ec2, 8)
    t0 = utcnow()
    signal(make_ctx, worker.id, IMPAIRED, at=t0)
    stopped = store.transition_worker(store.get_worker(worker.id), S.STOPPED, cause=Cause.EC2, actor="test")
    # A warm start hours later: EC2 moves a started machine to other hardware.
    store.transition_worker(stopped, S.RUNNING, cause=Cause.EC2, actor="test")

    report = reconcile_fleet(make_ctx(), now=t0 + timedelta(hours=3))

    assert report.counters["repair_replacements"] == 0, report.counters
    assert store.get_worker(worker.id).owner is None


def retirement(not_before: datetime, event_id: str = "instance-event-0a1b2c") -> Signal:
    event = ScheduledEvent(code="instance-retirement", not_before=not_before, event_id=event_id)
    return Signal(SICK, HealthSource.SCHEDULED_EVENT, "instance-retirement: degraded hardware", event)


def test_given_a_retirement_of_a_protected_worker_then_it_waits_until_its_latest_start_and_is_imposed_then(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, drains_started
) -> None:
    (old,) = pool_of(store, ec2, 1, drain_timeout_hours=0.5)
    workers.set_do_not_disrupt_until(store, old.id, utcnow() + timedelta(days=7), actor="op")
    t0 = utcnow()
    not_before = t0 + timedelta(hours=2)
    # The half-hour drain must end 30 minutes before NotBefore: it starts by an hour from now.
    latest_start = not_before - timedelta(minutes=60)
    signal(make_ctx, old.id, retirement(not_before), at=t0)

    early = cycles(make_ctx, t0, 3)

    assert total(early, "repair_held_protected") == 3, [r.counters for r in early]
    assert store.find_worker(replacement_id(old.id, "repair")) is None
    assert store.get_worker(old.id).owner is None
    assert drains_started == []

    late = cycles(make_ctx, latest_start, 2)

    assert total(late, "repair_imposed") >= 1
    assert total(late, "repair_drains") == 1, [r.counters for r in late]
    assert store.find_worker(replacement_id(old.id, "repair")) is not None
    drained = store.get_worker(old.id)
    assert drained.status == S.DRAINING
    assert drained.drain is not None
    assert drained.drain.deadline <= not_before - timedelta(minutes=30)
    assert drained.owner is not None
    assert drained.owner.reason == "scheduled_event"
    assert drained.drain.reason is not None
    assert "imposed: its date forced it; do_not_disrupt overridden" in drained.drain.reason


def test_given_three_retirements_and_a_repair_budget_of_one_then_one_at_a_time_until_their_date_forces_them(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, drains_started
) -> None:
    fleet = pool_of(store, ec2, 6, drain_timeout_hours=0.5)
    catalog.put_pool(
        store,
        "labs",
        actor="test",
        disruption=DisruptionPolicy(budgets=[Budget(max=1, reasons=[DisruptionReason.REPAIR])]),
    )
    retiring = fleet[:3]
    t0 = utcnow()
    not_before = t0 + timedelta(hours=3)
    latest_start = not_before - timedelta(minutes=60)
    for worker in retiring:
        signal(make_ctx, worker.id, retirement(not_before, f"instance-event-{worker.id}"), at=t0)

    far: list[CycleReport] = []
    disrupting: list[int] = []
    # Three cycles: each holds the other two for the budget while the first one's drain goes on.
    for minute in range(3):
        far.append(reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=minute)))
        disrupting.append(disruption.pool_view(make_ctx(), "labs").in_use)

    # Half the pool is unhealthy, but a retirement passes the brake; the budget paces it to one at once.
    assert max(disrupting) == 1, disrupting
    assert total(far, "repair_held_repair_brake") == 0
    assert total(far, "repair_held_budget") >= 2
    assert total(far, "repair_imposed") == 0
    (first,) = drains_started
    assert first["reason"] == (
        f"repair: EC2 scheduled event instance-retirement not before {not_before.isoformat()}"
    )
    owners = [store.get_worker(w.id).owner for w in retiring]
    assert [o.reason if o is not None else None for o in owners].count("repair") == 1

    close = reconcile_fleet(make_ctx(), now=latest_start)

    assert close.counters["repair_imposed"] == 2, close.counters
    assert close.counters["repair_drains"] == 2
    imposed = [store.get_worker(w.id) for w in retiring if w.id != first["worker_id"]]
    assert {(w.status, w.owner.reason if w.owner else None) for w in imposed} == {
        (S.DRAINING, "scheduled_event")
    }
    assert all("imposed: its date forced it" in (d["reason"] or "") for d in drains_started[1:])
    assert disruption.pool_view(make_ctx(), "labs").in_use == 3


def test_given_a_retirement_admitted_in_budget_when_its_latest_start_comes_then_it_is_imposed_in_its_place(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, drains_started
) -> None:
    old, *_ = pool_of(store, ec2, 4, drain_timeout_hours=0.5)
    catalog.put_pool(
        store,
        "labs",
        actor="test",
        disruption=DisruptionPolicy(budgets=[Budget(max=1, reasons=[DisruptionReason.REPAIR])]),
    )
    t0 = utcnow()
    not_before = t0 + timedelta(hours=3)
    signal(make_ctx, old.id, retirement(not_before), at=t0)

    reconcile_fleet(make_ctx(), now=t0)

    admitted = store.get_worker(old.id)
    assert admitted.owner is not None
    assert (admitted.status, admitted.owner.reason) == (S.RUNNING, "repair")
    assert disruption.pool_view(make_ctx(), "labs").in_use == 1

    late = reconcile_fleet(make_ctx(), now=not_before - timedelta(minutes=60))

    assert late.counters["repair_imposed"] == 1
    taken = store.get_worker(old.id)
    assert taken.owner is not None
    assert (taken.status, taken.owner.reason) == (S.DRAINING, "scheduled_event")
    # The imposed repair takes the admission's place in the budget, not a second one.
    assert disruption.pool_view(make_ctx(), "labs").in_use == 1
    (drain,) = drains_started
    assert drain["timeout_seconds"] == 1800
    assert "imposed: its date forced it" in drain["reason"]


def test_given_a_retirement_cancelled_before_the_drain_then_the_repair_ends(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2, drains_started
) -> None:
    (old,) = pool_of(store, ec2, 1, drain_timeout_hours=0.5)
    t0 = utcnow()
    signal(make_ctx, old.id, retirement(t0 + timedelta(days=10)), at=t0)
    reconcile_fleet(make_ctx(), now=t0)
    assert store.get_worker(old.id).owner is not None

    ended = ScheduledEvent(
        code="instance-retirement", not_before=t0 + timedelta(days=10), event_id="instance-event-0a1b2c"
    )
    signal(
        make_ctx,
        old.id,
        Signal(WELL, HealthSource.SCHEDULED_EVENT, "[Canceled]", ended),
        at=t0 + timedelta(minutes=1),
    )
    cycles(make_ctx, t0 + timedelta(minutes=2), 3)

    left = store.get_worker(old.id)
    assert (left.status, left.owner) == (S.RUNNING, None)
    assert drains_started == []


@pytest.mark.usefixtures("handler_context")
def test_given_a_retirement_of_a_worker_running_a_session_then_it_is_replaced_first_and_drained_in_time(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
) -> None:
    """Through the real handlers: AWS Health's event through ec2_events, the reconcile cycles, the drain
    workflow on the emulator's Step Functions, and the session ending as its user ends it."""
    (old,) = pool_of(store, ec2, 1, drain_timeout_hours=0.5)
    store.place_instance(Instance(id="s-lab-1", worker_id=""), old, actor="test")
    instances.change_instance_state(make_ctx(), "s-lab-1", InstanceState.RUNNING, actor="test")
    t0 = utcnow()
    not_before = (t0 + timedelta(hours=2)).replace(microsecond=0)
    assert old.ec2_instance_id is not None
    event = health_event(
        old.ec2_instance_id,
        code="instance-retirement",
        not_before=not_before,
        event_id="e-9",
        region="us-east-1",
    )
    assert invoke("ec2_events", event)["outcome"] == "applied"

    seen: list[tuple[S, S | None]] = []
    for minute in range(5):
        reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=minute))
        made = store.find_worker(replacement_id(old.id, "repair"))
        seen.append((store.get_worker(old.id).status, made.status if made is not None else None))

    # The old worker serves until its replacement runs; its drain starts in the cycle that finds it RUNNING.
    first_drain = next(i for i, (status, _) in enumerate(seen) if status == S.DRAINING)
    assert all(status == S.RUNNING for status, _ in seen[:first_drain]), seen
    assert seen[first_drain][1] == S.RUNNING, seen
    drained = store.get_worker(old.id)
    assert drained.drain is not None
    assert drained.drain.deadline <= not_before - timedelta(minutes=30)

    instances.change_instance_state(make_ctx(), "s-lab-1", InstanceState.COMPLETED, actor="user")
    assert drained.drain.execution_arn is not None
    control_plane.wait_for_execution(drained.drain.execution_arn, timeout=60)

    ended = store.get_worker(old.id)
    assert ended.status in {S.TERMINATING, S.TERMINATED}
    assert ended.drain is not None
    assert (ended.drain.outcome, ended.drain.forced_instances) == (DrainOutcome.SUCCESS, 0)
    assert store.get_instance("s-lab-1").state == InstanceState.COMPLETED
    assert store.get_worker(replacement_id(old.id, "repair")).status == S.RUNNING


def test_given_a_sharded_reconciler_then_the_view_shows_the_word_of_the_shard_whose_brake_held(
    make_ctx: ContextFactory,
) -> None:
    sharded = make_ctx(RECONCILE_SHARDS="2")
    sharded.stats.record("reconcile#1of2", notes={repair.BRAKE_NOTE: {}})
    sharded.stats.record(
        "reconcile#2of2", notes={repair.BRAKE_NOTE: {"labs": "repair brake, 2 of 4 unhealthy"}}
    )

    assert repair.blocked(sharded, "labs") == "repair brake, 2 of 4 unhealthy"
    assert repair.blocked(sharded, "other") is None
    # Unsharded, only the `reconcile` scope is the cycle's.
    assert repair.blocked(make_ctx(), "labs") is None
