"""The repair rules: how signals fold into a worker's health, when a repair is due, the brake, and a
repair's drain."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerSummary
from fleetkeeper.domain.operations import Catalogue, OperationSpec
from fleetkeeper.domain.repair import (
    EVENT_MARGIN,
    STALE_AFTER,
    AgentReading,
    Brake,
    EventReading,
    Health,
    HealthSource,
    HealthStatus,
    RepairPolicy,
    Restart,
    ScheduledEvent,
    Signal,
    StatusReading,
    brake,
    event_ended,
    observe,
    observe_all,
    plan_repair,
    repair_due,
    restart_signals,
    signals_of,
    stopped,
)

T0 = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
SICK = HealthStatus.UNHEALTHY
WELL = HealthStatus.HEALTHY
Src = HealthSource


def retirement(hours: float = 48, event_id: str = "instance-event-1") -> ScheduledEvent:
    return ScheduledEvent(
        code="instance-retirement", not_before=T0 + timedelta(hours=hours), event_id=event_id
    )


def test_given_no_health_when_a_status_check_fails_then_the_worker_is_unhealthy_since_then() -> None:
    health = observe(None, Signal(SICK, Src.STATUS_CHECK, "instance status impaired"), T0)

    assert health is not None
    assert (health.status, health.source, health.since, health.reason) == (
        SICK,
        Src.STATUS_CHECK,
        T0,
        "instance status impaired",
    )


def test_given_the_same_signal_again_then_nothing_changes_and_since_is_kept() -> None:
    first = observe(None, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0)

    again = observe(first, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0 + timedelta(minutes=5))

    assert again is first


def test_given_a_report_when_a_status_check_fails_then_the_report_counts_and_the_check_is_kept() -> None:
    reported = observe(None, Signal(SICK, Src.REPORTED, "disk full"), T0)

    after = observe(reported, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0 + timedelta(minutes=1))

    assert after is not None
    assert (after.status, after.source, after.since, after.reason) == (SICK, Src.REPORTED, T0, "disk full")
    assert set(after.standing()) == {Src.REPORTED, Src.STATUS_CHECK}


@pytest.mark.parametrize(
    ("standing", "cleared"),
    [
        (Signal(SICK, Src.STATUS_CHECK, "instance status impaired"), Signal(WELL, Src.STATUS_CHECK, "ok")),
        (
            Signal(SICK, Src.SCHEDULED_EVENT, "instance-retirement", retirement()),
            Signal(WELL, Src.SCHEDULED_EVENT, "[Canceled]", retirement()),
        ),
    ],
)
def test_given_a_report_made_while_another_source_stands_when_that_source_clears_then_the_report_stands(
    standing: Signal, cleared: Signal
) -> None:
    health = observe_all(None, [standing], T0)
    health = observe_all(health, [Signal(SICK, Src.REPORTED, "disk /var full")], T0 + timedelta(minutes=1))

    health = observe_all(health, [cleared], T0 + timedelta(minutes=2))

    assert health is not None
    assert (health.status, health.source, health.since) == (SICK, Src.REPORTED, T0 + timedelta(minutes=1))
    assert set(health.standing()) == {Src.REPORTED}


def test_given_two_sources_then_a_repair_is_due_once_either_has_lasted_its_toleration() -> None:
    # A report (5 minutes) made after a failed check (10 minutes) is due first.
    health = observe(None, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0)
    health = observe(health, Signal(SICK, Src.REPORTED, "disk full"), T0 + timedelta(minutes=1))

    assert not repair_due(health, RepairPolicy(), T0 + timedelta(minutes=5, seconds=59))
    assert repair_due(health, RepairPolicy(), T0 + timedelta(minutes=6))


def test_given_a_report_when_a_scheduled_event_comes_then_the_event_replaces_it() -> None:
    reported = observe(None, Signal(SICK, Src.REPORTED, "disk full"), T0)

    after = observe(reported, Signal(SICK, Src.SCHEDULED_EVENT, "retiring", retirement()), T0)

    assert after is not None
    assert after.scheduled
    assert after.event == retirement()


def test_given_a_failed_check_then_only_a_passing_check_clears_it() -> None:
    sick = observe(None, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0)

    assert observe(sick, Signal(WELL, Src.REPORTED), T0) is sick
    cleared = observe(sick, Signal(WELL, Src.STATUS_CHECK, "ok"), T0 + timedelta(minutes=3))

    assert cleared is not None
    assert (cleared.status, cleared.source, cleared.since) == (
        WELL,
        Src.STATUS_CHECK,
        T0 + timedelta(minutes=3),
    )


def test_given_no_health_when_a_healthy_signal_comes_then_nothing_is_recorded() -> None:
    assert observe(None, Signal(WELL, Src.STATUS_CHECK), T0) is None


def test_given_a_scheduled_event_when_another_event_ends_then_it_stands() -> None:
    sick = observe(None, Signal(SICK, Src.SCHEDULED_EVENT, "retiring", retirement(event_id="a")), T0)

    other = observe(sick, Signal(WELL, Src.SCHEDULED_EVENT, "cancelled", retirement(event_id="b")), T0)
    same = observe(sick, Signal(WELL, Src.SCHEDULED_EVENT, "cancelled", retirement(event_id="a")), T0)

    assert other is sick
    assert same is not None
    assert same.status == WELL


def test_given_an_event_closed_when_an_older_word_opening_it_comes_then_it_is_stale() -> None:
    arn = "arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/e-1"
    event = ScheduledEvent(code="instance-retirement", not_before=T0 + timedelta(days=3), event_id=arn)
    closed = observe(None, Signal(WELL, Src.SCHEDULED_EVENT, "closed", event, at=T0), T0)

    late_open = observe(
        closed, Signal(SICK, Src.SCHEDULED_EVENT, "upcoming", event, at=T0 - timedelta(minutes=9)), T0
    )
    reopened = observe(
        closed, Signal(SICK, Src.SCHEDULED_EVENT, "upcoming", event, at=T0 + timedelta(minutes=1)), T0
    )

    assert closed is not None
    assert (closed.status, closed.heard) == (WELL, {arn: T0})
    assert late_open is closed
    # Within one second a close outranks an open, whichever came first.
    assert observe(closed, Signal(SICK, Src.SCHEDULED_EVENT, "upcoming", event, at=T0), T0) is closed
    opened = observe(None, Signal(SICK, Src.SCHEDULED_EVENT, "upcoming", event, at=T0), T0)
    same_second = observe(opened, Signal(WELL, Src.SCHEDULED_EVENT, "closed", event, at=T0), T0)
    assert same_second is not None
    assert same_second.status == WELL
    assert reopened is not None
    assert reopened.status == SICK


def test_given_a_stop_then_the_checks_signals_are_cleared_and_a_report_stands() -> None:
    sick = observe_all(
        None,
        [Signal(SICK, Src.STATUS_CHECK, "impaired"), Signal(SICK, Src.REPORTED, "disk full")],
        T0,
    )
    only_checks = observe(None, Signal(SICK, Src.UNREACHABLE, "insufficient-data"), T0)

    after = stopped(sick, T0 + timedelta(hours=1))
    cleared = stopped(only_checks, T0 + timedelta(hours=1))

    assert after is not None
    assert (after.status, set(after.standing())) == (SICK, {Src.REPORTED})
    assert cleared is not None
    assert cleared.status == WELL
    # A worker never found sick keeps its stop too: a word said before it may still arrive.
    never_sick = stopped(None, T0)
    assert never_sick is not None
    assert (never_sick.status, never_sick.standing()) == (WELL, {})


@pytest.mark.parametrize(
    ("source", "tolerated"),
    [
        (Src.STATUS_CHECK, timedelta(minutes=10)),
        (Src.UNREACHABLE, timedelta(minutes=15)),
        (Src.CONNECTION_LOST, timedelta(minutes=15)),
        (Src.REPORTED, timedelta(minutes=5)),
        (Src.SCHEDULED_EVENT, timedelta(0)),
    ],
)
def test_a_repair_is_due_once_its_source_toleration_has_passed(
    source: HealthSource, tolerated: timedelta
) -> None:
    health = Health(status=SICK, source=source, since=T0)
    policy = RepairPolicy()

    assert repair_due(health, policy, T0 + tolerated)
    if tolerated:
        assert not repair_due(health, policy, T0 + tolerated - timedelta(seconds=1))


def test_a_pool_sets_its_own_tolerations_and_refuses_what_is_not_a_duration() -> None:
    policy = RepairPolicy.model_validate({"status_check": "2m", "max_unhealthy_percent": 50})

    assert policy.toleration(Src.STATUS_CHECK) == timedelta(minutes=2)
    with pytest.raises(ValidationError, match="status_check"):
        RepairPolicy.model_validate({"status_check": "10 minutes"})
    with pytest.raises(ValidationError, match="max_unhealthy_percent"):
        RepairPolicy.model_validate({"max_unhealthy_percent": 101})


def test_a_healthy_worker_is_never_due() -> None:
    assert not repair_due(
        Health(status=WELL, source=Src.REPORTED, since=T0), RepairPolicy(), T0 + timedelta(days=1)
    )
    assert not repair_due(None, RepairPolicy(), T0)


R = WorkerStatus.RUNNING


@pytest.mark.parametrize(
    ("unhealthy", "members", "holds"),
    [(2, 8, True), (1, 8, False), (1, 5, False), (2, 10, False), (2, 4, True), (3, 10, True)],
)
def test_the_brake_holds_when_more_than_the_share_is_unhealthy(
    unhealthy: int, members: int, holds: bool
) -> None:
    found = brake({R: members}, {R: unhealthy}, RepairPolicy())

    assert found.holds is holds
    assert found.detail == f"repair brake, {unhealthy} of {members} unhealthy"


@pytest.mark.parametrize("members", [1, 2, 3, 4])
def test_given_a_small_pool_with_one_sick_member_then_the_brake_lets_its_repair_through(members: int) -> None:
    found = brake({R: members}, {R: 1}, RepairPolicy())

    assert found.holds is False, found.detail


def test_given_a_brake_of_zero_percent_then_one_sick_worker_is_repaired_and_two_are_held() -> None:
    policy = RepairPolicy(max_unhealthy_percent=0)

    one = brake({R: 10}, {R: 1}, policy)
    two = brake({R: 10}, {R: 2}, policy)

    assert (one.holds, two.holds) == (False, True)


def test_the_brake_counts_the_members_only_a_draining_one_included() -> None:
    statuses = [WorkerStatus.DRAINING, R, WorkerStatus.STOPPED, WorkerStatus.PENDING, WorkerStatus.TERMINATED]
    sick = [WorkerStatus.DRAINING, WorkerStatus.STOPPED, WorkerStatus.PENDING, WorkerStatus.TERMINATED]

    found = brake(Counter(statuses), Counter(sick), RepairPolicy())

    assert (found.unhealthy, found.members) == (1, 2)


def test_the_counts_of_a_pool_are_its_scopes_and_its_unhealthy_ones_are_its_workers_read_in_full() -> None:
    sick = Health(status=SICK, source=Src.STATUS_CHECK, since=T0)
    fleet = [
        Worker(id="w-1", template="lab", region="us-east-1", pool="labs", status=R, capacity=1, health=sick),
        Worker(id="w-2", template="gpu", region="us-east-1", pool="labs", status=R, capacity=1),
        Worker(id="w-3", template="lab", region="us-east-1", pool="other", status=R, capacity=1, health=sick),
        WorkerSummary(id="w-4", template="lab", region="us-east-1", pool="labs", status=R, capacity=1),
    ]

    workers, unhealthy = FleetCounts.of(fleet).in_pool("labs")

    assert (workers, unhealthy) == ({R: 3}, {R: 1})


# A pool of 10 members with 3 sick: the default brake (20 %) holds.
BRAKE_HOLDS = Brake(unhealthy=3, members=10, max_percent=20)
BRAKE_FREE = Brake(unhealthy=0, members=10, max_percent=20)


def scheduled(hours: float) -> Health:
    return Health(status=SICK, source=Src.SCHEDULED_EVENT, since=T0, event=retirement(hours=hours))


def test_a_scheduled_drain_ends_the_margin_before_not_before_and_starts_by_its_latest_start() -> None:
    plan = plan_repair(scheduled(48), BRAKE_FREE, 3600, T0)

    assert plan.timeout_seconds == 3600
    assert plan.start_by == T0 + timedelta(hours=48) - EVENT_MARGIN - timedelta(hours=1)


def test_a_scheduled_repair_before_its_latest_start_is_an_ordinary_repair_the_brake_does_not_hold() -> None:
    plan = plan_repair(scheduled(48), BRAKE_HOLDS, 3600, T0)

    assert (plan.imposed, plan.braked) == (False, False)


def test_a_scheduled_repair_is_imposed_from_its_latest_start_on() -> None:
    latest_start = T0 + timedelta(hours=48) - EVENT_MARGIN - timedelta(hours=1)

    before = plan_repair(scheduled(48), BRAKE_FREE, 3600, latest_start - timedelta(seconds=1))
    at = plan_repair(scheduled(48), BRAKE_FREE, 3600, latest_start)
    after = plan_repair(scheduled(48), BRAKE_HOLDS, 3600, latest_start + timedelta(minutes=10))

    assert not before.imposed
    assert at.imposed
    assert at.timeout_seconds == 3600
    assert (after.imposed, after.braked) == (True, False)
    # Ten minutes late: the drain is shortened so that it still ends the margin before NotBefore.
    assert after.timeout_seconds == 3000


def test_a_scheduled_event_with_no_date_is_imposed_at_once() -> None:
    health = Health(
        status=SICK,
        source=Src.SCHEDULED_EVENT,
        since=T0,
        event=ScheduledEvent(code="instance-stop", not_before=None),
    )

    plan = plan_repair(health, BRAKE_HOLDS, 3600, T0)

    assert (plan.imposed, plan.braked, plan.start_by, plan.timeout_seconds) == (True, False, None, 3600)


def test_a_scheduled_drain_past_its_latest_start_is_shortened_to_end_before_the_event() -> None:
    plan = plan_repair(scheduled(1), BRAKE_FREE, 4 * 3600, T0)

    assert T0 + timedelta(seconds=plan.timeout_seconds) <= T0 + timedelta(hours=1) - EVENT_MARGIN
    assert plan.start_by is not None
    assert plan.start_by < T0
    assert plan.imposed


def test_a_sick_machine_drains_within_half_an_hour_and_a_reported_one_on_its_template() -> None:
    sick = Health(status=SICK, source=Src.STATUS_CHECK, since=T0)
    reported = Health(status=SICK, source=Src.REPORTED, since=T0)

    assert plan_repair(sick, BRAKE_FREE, 4 * 3600, T0).timeout_seconds == 1800
    lost = Health(status=SICK, source=Src.CONNECTION_LOST, since=T0)
    assert plan_repair(lost, BRAKE_FREE, 4 * 3600, T0).timeout_seconds == 1800
    assert plan_repair(reported, BRAKE_FREE, 4 * 3600, T0).timeout_seconds == 4 * 3600
    assert plan_repair(reported, BRAKE_FREE, 4 * 3600, T0).start_by is None


@pytest.mark.parametrize("source", [Src.STATUS_CHECK, Src.UNREACHABLE, Src.CONNECTION_LOST, Src.REPORTED])
def test_every_other_repair_is_ordinary_and_held_by_the_brake_when_it_holds(source: HealthSource) -> None:
    sick = Health(status=SICK, source=source, since=T0)

    held = plan_repair(sick, BRAKE_HOLDS, 3600, T0 + timedelta(days=30))
    free = plan_repair(sick, BRAKE_FREE, 3600, T0 + timedelta(days=30))

    assert (held.imposed, held.braked) == (False, True)
    assert (free.imposed, free.braked) == (False, False)


def test_a_completed_or_cancelled_event_is_ended() -> None:
    assert event_ended("[Completed] The instance is running on degraded hardware")
    assert event_ended("[Canceled] The instance is running on degraded hardware")
    assert not event_ended("The instance is running on degraded hardware")
    assert not event_ended(None)


def test_a_reason_longer_than_500_characters_is_cut() -> None:
    health = observe(None, Signal(SICK, Src.REPORTED, "x" * 900), T0)

    assert health is not None
    assert health.reason == "x" * 500


def line(system: str = "ok", instance: str = "ok", events: tuple[EventReading, ...] = ()) -> StatusReading:
    return StatusReading("i-1", "running", system, instance, events)


def reboot_event(description: str, not_before: datetime) -> EventReading:
    return EventReading("system-reboot", not_before, description, "instance-event-7")


def test_given_a_stop_then_a_scheduled_event_is_stale_too() -> None:
    sick = observe_all(
        None,
        [Signal(SICK, Src.SCHEDULED_EVENT, "instance-stop", retirement()), Signal(SICK, Src.REPORTED)],
        T0,
    )

    after = stopped(sick, T0 + timedelta(minutes=5))

    assert after is not None
    assert set(after.standing()) == {Src.REPORTED}
    assert STALE_AFTER[Restart.STOP] == {
        Src.SCHEDULED_EVENT,
        Src.STATUS_CHECK,
        Src.UNREACHABLE,
        Src.CONNECTION_LOST,
    }


def test_given_a_restart_then_only_the_signals_begun_before_it_are_stale() -> None:
    before = observe(None, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0)
    since = observe(None, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0 + timedelta(minutes=10))

    now = T0 + timedelta(minutes=15)
    cleared = observe_all(before, restart_signals(Restart.STOP, T0 + timedelta(minutes=5)), now)
    kept = observe_all(since, restart_signals(Restart.STOP, T0 + timedelta(minutes=5)), now)

    assert cleared is not None
    assert cleared.status == WELL
    assert kept is not None
    assert since is not None
    assert (kept.status, kept.standing()) == (SICK, since.standing())


@pytest.mark.parametrize("source", sorted(STALE_AFTER[Restart.STOP]))
def test_given_a_machine_signal_said_before_a_stop_and_recorded_after_it_then_it_is_stale(
    source: HealthSource,
) -> None:
    event = retirement(event_id="arn:aws:health:us-east-1::event/EC2/e-1")
    said = Signal(SICK, source, "said before the stop", event if source == Src.SCHEDULED_EVENT else None)
    stop = T0 + timedelta(minutes=1)
    restarted = stopped(None, stop)

    # A sweep that began before the stop (its `now`), or an AWS Health event timed before it, late.
    swept = observe(restarted, said, T0)
    delivered = observe(restarted, Signal(SICK, source, "late", said.event, at=T0), stop + timedelta(hours=3))
    # Said since the restart, it stands.
    since = observe(restarted, said, stop + timedelta(minutes=5))

    assert swept is restarted
    assert delivered is restarted
    assert since is not None
    assert (since.status, set(since.standing())) == (SICK, {source})


def test_given_a_report_said_before_a_stop_and_recorded_after_it_then_it_stands() -> None:
    restarted = stopped(None, T0 + timedelta(minutes=1))

    after = observe(restarted, Signal(SICK, Src.REPORTED, "disk full"), T0)

    assert after is not None
    assert (after.status, after.source) == (SICK, Src.REPORTED)


def test_given_a_reboot_completed_before_its_date_then_the_checks_toleration_runs_on() -> None:
    # The machine was rebooted before its event's NotBefore: the event is completed, its date ahead.
    sick = observe(None, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0)
    completed = (reboot_event("[Completed] reboot", T0 + timedelta(days=2)),)
    now = T0 + timedelta(hours=1)

    after = observe_all(sick, signals_of(line(instance="impaired", events=completed)), now)
    later = observe_all(
        after, signals_of(line(instance="impaired", events=completed)), now + timedelta(minutes=5)
    )

    assert after is not None
    assert (after.status, after.source, after.since) == (SICK, Src.STATUS_CHECK, T0)
    assert later is after


def test_given_a_reboot_completed_before_its_date_then_its_date_passing_makes_nothing_stale() -> None:
    # AWS lists a completed event for a week: sweeps after its NotBefore still find the early reboot,
    # and its date must not then restart the toleration of a check that failed since.
    not_before = T0 + timedelta(days=2)
    completed = (reboot_event("[Completed] reboot", not_before),)
    early = observe_all(None, signals_of(line(instance="impaired", events=completed)), T0)

    past_date = observe_all(
        early, signals_of(line(instance="impaired", events=completed)), not_before + timedelta(minutes=5)
    )

    assert early is not None
    assert past_date is not None
    assert (past_date.status, past_date.source, past_date.since) == (SICK, Src.STATUS_CHECK, T0)


def test_given_a_completed_reboot_then_each_signal_stands_until_its_own_source_answers_again() -> None:
    sick = observe_all(
        None,
        [
            Signal(SICK, Src.STATUS_CHECK, "impaired"),
            Signal(SICK, Src.CONNECTION_LOST, "ConnectionLost"),
            Signal(SICK, Src.REPORTED, "disk full"),
        ],
        T0,
    )
    rebooted = line(
        "initializing", "initializing", (reboot_event("[Completed] reboot", T0 + timedelta(hours=1)),)
    )

    after = observe_all(sick, signals_of(rebooted), T0 + timedelta(hours=2))
    booted = line("ok", "ok", (reboot_event("[Completed] reboot", T0 + timedelta(hours=1)),))
    answering = observe_all(after, signals_of(booted), T0 + timedelta(hours=3))

    # Checks still initializing say nothing yet; once they pass, they end their own signal. No word on
    # the agent: its silence stands until it pings, and the agent's report until it withdraws it.
    assert after is not None
    assert set(after.standing()) == {Src.STATUS_CHECK, Src.CONNECTION_LOST, Src.REPORTED}
    assert answering is not None
    assert set(answering.standing()) == {Src.CONNECTION_LOST, Src.REPORTED}


def test_given_a_machine_still_impaired_after_its_reboot_then_its_check_counts_from_before_it() -> None:
    sick = observe(None, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0)
    completed = (reboot_event("[Completed] reboot", T0 + timedelta(hours=1)),)
    now = T0 + timedelta(hours=2)

    after = observe_all(sick, signals_of(line(instance="impaired", events=completed)), now)
    # AWS lists a completed event for a week: the next sweeps find the reboot again and change nothing.
    later = observe_all(
        after, signals_of(line(instance="impaired", events=completed)), now + timedelta(minutes=5)
    )

    assert after is not None
    assert (after.status, after.source, after.since) == (SICK, Src.STATUS_CHECK, T0)
    assert later is after


def test_given_a_cancelled_reboot_then_the_checks_stand() -> None:
    sick = observe(None, Signal(SICK, Src.STATUS_CHECK, "impaired"), T0)
    cancelled = (reboot_event("[Canceled] reboot", T0 + timedelta(hours=1)),)

    after = observe_all(sick, signals_of(line(instance="insufficient-data", events=cancelled)), T0)

    assert after is not None
    assert set(after.standing()) == {Src.STATUS_CHECK, Src.UNREACHABLE}
    assert after.since == T0


def test_given_an_agent_connection_lost_then_only_its_own_online_clears_it() -> None:
    lost = AgentReading("ConnectionLost", T0 - timedelta(minutes=3))

    sick = observe_all(None, signals_of(line(), lost), T0)
    checks_ok = observe_all(sick, signals_of(line()), T0 + timedelta(minutes=5))
    online = observe_all(sick, signals_of(line(), AgentReading("Online", T0)), T0 + timedelta(minutes=5))

    assert sick is not None
    assert (sick.status, sick.source, sick.since) == (SICK, Src.CONNECTION_LOST, T0)
    assert sick.reason == "SSM agent ConnectionLost, last ping 2026-03-02T11:57:00+00:00"
    # EC2's checks passing, or no word on the agent, says nothing of it.
    assert checks_ok is sick
    assert online is not None
    assert online.status == WELL


def test_given_a_machine_started_again_then_its_agents_connection_lost_is_no_signal_until_it_booted() -> None:
    # Right after a start EC2 says running, checks initializing, while SSM still says ConnectionLost with
    # the last ping from before the stop: the agent has not had the time to ping.
    before_the_stop = AgentReading("ConnectionLost", T0 - timedelta(minutes=30))

    booting = observe_all(None, signals_of(line("initializing", "initializing"), before_the_stop), T0)
    booted = observe_all(None, signals_of(line(), before_the_stop), T0 + timedelta(minutes=5))

    assert booting is None
    assert booted is not None
    assert (booted.status, booted.source) == (SICK, Src.CONNECTION_LOST)


def test_the_signals_of_a_worker_in_order_the_one_that_counts_first() -> None:
    health = observe_all(
        None,
        [Signal(SICK, Src.REPORTED, "disk full"), Signal(SICK, Src.STATUS_CHECK, "impaired")],
        T0,
    )
    health = observe(
        health, Signal(SICK, Src.SCHEDULED_EVENT, "retirement", retirement()), T0 + timedelta(hours=1)
    )

    assert health is not None
    assert [source for source, _ in health.in_order()] == [
        Src.SCHEDULED_EVENT,
        Src.REPORTED,
        Src.STATUS_CHECK,
    ]
    assert health.source == Src.SCHEDULED_EVENT


def test_a_worker_uses_operations_when_its_template_runs_some_at_stop_or_system_info_is_collected() -> None:
    spec = OperationSpec(document="Doc-1")
    both = Catalogue(operations={"collect-system-info": spec, "deregister-license": spec})
    licenses = Catalogue(operations={"deregister-license": spec})

    assert both.used_by([], 3600)
    assert not both.used_by([], 0)
    assert both.used_by(["deregister-license"], 0)
    assert not licenses.used_by([], 3600)
    assert not Catalogue().used_by(["deregister-license"], 3600)
