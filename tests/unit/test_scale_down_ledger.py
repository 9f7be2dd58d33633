"""The scale-down ledger: what a view may miss is counted with it, and nothing is counted twice."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker
from fleetkeeper.domain.reconcile import newest_per_worker
from fleetkeeper.domain.scale_down import Action, DisruptionBudget, Guard, ScaleDownPolicy
from fleetkeeper.domain.scale_down_ledger import (
    INDEX_LAG,
    MAX_IN_FLIGHT,
    MAX_VIEW_AGE,
    InFlight,
    ScaleDownLedger,
    admit,
    in_flight,
    still_needed,
    view_too_old,
)

NOW = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)
SCOPE = "lab#-"
POLICY = ScaleDownPolicy(
    enabled=True,
    min_workers=1,
    cooldown=timedelta(0),
    idle_window=timedelta(minutes=30),
    cpu_threshold=5.0,
    lookahead=timedelta(minutes=15),
    budget=DisruptionBudget(count=2),
)


def worker(worker_id: str) -> Worker:
    return Worker(id=worker_id, template="lab", region="us-east-1", capacity=4, status=WorkerStatus.RUNNING)


def entry(
    worker_id: str, action: Action = Action.STOP, *, until: datetime = NOW, scope: str = SCOPE
) -> InFlight:
    return InFlight(worker_id=worker_id, scope=scope, action=action, until=until)


def admitted(candidate: str, action: Action, entries: list[InFlight], statuses: dict[str, WorkerStatus]):
    """The view is the statuses of every worker, and the counts taken from them."""
    running = sum(1 for status in statuses.values() if status == WorkerStatus.RUNNING)
    return admit(
        worker(candidate),
        action,
        entries=entries,
        statuses=statuses,
        running_in_scope={SCOPE: running},
        draining=sum(1 for status in statuses.values() if status == WorkerStatus.DRAINING),
        policy=POLICY,
        fleet_size=len(statuses),
    )


def test_given_an_entry_past_its_invocations_deadline_and_the_index_lag_then_the_view_is_trusted():
    ledger = ScaleDownLedger(
        version=3, entries=[entry("w-old", until=NOW - INDEX_LAG - timedelta(seconds=1))]
    )
    fresh = entry("w-new", until=NOW - INDEX_LAG)

    kept = in_flight(ledger.model_copy(update={"entries": [*ledger.entries, fresh]}), NOW)

    assert [e.worker_id for e in kept] == ["w-new"]


def test_given_another_cycle_stopped_a_worker_its_view_shows_running_then_it_counts_as_leaving():
    statuses = {"w-1": WorkerStatus.RUNNING, "w-2": WorkerStatus.RUNNING, "w-3": WorkerStatus.RUNNING}

    # Three running, minimum one: one stop in flight leaves room for exactly one more.
    assert admitted("w-2", Action.STOP, [entry("w-1")], statuses) is None
    assert admitted("w-3", Action.STOP, [entry("w-1"), entry("w-2")], statuses) is Guard.MIN_WORKERS


def test_given_the_view_already_shows_the_stop_then_it_is_not_subtracted_twice():
    statuses = {"w-1": WorkerStatus.STOPPING, "w-2": WorkerStatus.RUNNING, "w-3": WorkerStatus.RUNNING}

    assert admitted("w-2", Action.STOP, [entry("w-1")], statuses) is None


def test_given_a_drain_both_in_the_view_and_in_flight_then_the_budget_counts_it_once():
    statuses = {"w-1": WorkerStatus.DRAINING, "w-2": WorkerStatus.RUNNING, "w-3": WorkerStatus.RUNNING}
    other_scope = {"w-1": WorkerStatus.DRAINING, "w-9": WorkerStatus.DRAINING} | statuses

    assert admitted("w-2", Action.DRAIN, [entry("w-1", Action.DRAIN, scope="x#-")], statuses) is None
    assert admitted("w-2", Action.DRAIN, [], other_scope) is Guard.DISRUPTION_BUDGET


def test_given_drains_in_flight_that_no_view_shows_yet_then_they_fill_the_budget():
    statuses = {f"w-{n}": WorkerStatus.RUNNING for n in range(6)}
    entries = [entry("w-0", Action.DRAIN), entry("w-1", Action.DRAIN)]

    assert admitted("w-2", Action.DRAIN, entries, statuses) is Guard.DISRUPTION_BUDGET
    # A stop needs no drain: only the minimum per scope applies to it.
    assert admitted("w-2", Action.STOP, entries, statuses) is None


def test_given_the_candidate_is_already_in_flight_or_the_ledger_is_full_then_it_is_refused():
    statuses = {f"w-{n}": WorkerStatus.RUNNING for n in range(4)}
    crowd = [entry(f"x-{n}", scope="other#-") for n in range(MAX_IN_FLIGHT)]

    assert admitted("w-1", Action.STOP, [entry("w-1")], statuses) is Guard.IN_FLIGHT
    assert admitted("w-1", Action.STOP, crowd, statuses) is Guard.IN_FLIGHT


@given(
    running=st.integers(min_value=0, max_value=12),
    draining=st.integers(min_value=0, max_value=4),
    choices=st.lists(st.sampled_from([Action.STOP, Action.DRAIN]), max_size=20),
)
def test_given_any_sequence_of_choices_through_the_ledger_then_the_limits_hold(running, draining, choices):
    """Cycles with the same stale view enter one after another: whatever they ask, the admitted ones
    never take the scope under its minimum or the drains over the budget."""
    statuses = {f"r-{n}": WorkerStatus.RUNNING for n in range(running)}
    statuses |= {f"d-{n}": WorkerStatus.DRAINING for n in range(draining)}
    entries: list[InFlight] = []
    candidates = iter(sorted(w for w, s in statuses.items() if s == WorkerStatus.RUNNING))

    for action in choices:
        candidate = next(candidates, None)
        if candidate is None:
            break
        if admitted(candidate, action, entries, statuses) is None:
            entries.append(entry(candidate, action))

    left_running = running - len(entries)
    drains = draining + sum(1 for e in entries if e.action is Action.DRAIN)
    assert left_running >= min(POLICY.min_workers, running)
    assert drains <= max(draining, 2)


@given(
    untils=st.lists(st.integers(min_value=-900, max_value=900), max_size=20),
    view_age=st.integers(min_value=0, max_value=int(MAX_VIEW_AGE.total_seconds())),
)
def test_given_any_writer_then_it_keeps_every_entry_a_view_young_enough_to_decide_from_still_counts(
    untils, view_age
):
    """A writer prunes by the clock, not by its own view: a slower cycle whose view is older (but not
    too old to decide from) still finds every entry it must count."""
    ledger = ScaleDownLedger(
        entries=[entry(f"w-{n}", until=NOW + timedelta(seconds=offset)) for n, offset in enumerate(untils)]
    )
    slower_view = NOW - timedelta(seconds=view_age)

    kept = {e.worker_id for e in still_needed(ledger, NOW)}

    assert not view_too_old(slower_view, NOW)
    assert {e.worker_id for e in in_flight(ledger, slower_view)} <= kept


def test_given_a_view_older_than_the_limit_then_it_is_too_old_to_decide_from():
    assert view_too_old(NOW - MAX_VIEW_AGE - timedelta(seconds=1), NOW)
    assert not view_too_old(NOW - MAX_VIEW_AGE, NOW)


def test_given_a_worker_read_twice_as_it_changed_status_then_the_view_keeps_its_newer_row():
    """The index is read one status at a time: a worker stopped during the read comes back as RUNNING
    from an early page and STOPPING from a later one. Counted twice, another cycle's stop would look
    like a worker still running, and the scope could go under its minimum."""
    running = worker("w-1").model_copy(update={"version": 4})
    stopping = running.model_copy(update={"status": WorkerStatus.STOPPING, "version": 5})
    other = worker("w-2")

    view = newest_per_worker([running, other, stopping])

    assert [(w.id, w.status) for w in view] == [("w-1", WorkerStatus.STOPPING), ("w-2", WorkerStatus.RUNNING)]
    statuses = {w.id: w.status for w in view}
    # Minimum one, one running in the view: nothing more may stop.
    assert admitted("w-2", Action.STOP, [entry("w-1")], statuses) is Guard.MIN_WORKERS


def test_given_a_drain_that_started_between_the_statuses_and_the_counts_then_it_counts_twice_not_never():
    """Once the table is migrated a ledger entry reads its workers' statuses, then the counters: a
    drain in flight that starts in between is in both (refused for the budget, safe), whereas read the
    other way round it would be in neither, and a second drain would pass a budget of one."""
    one_drain = ScaleDownPolicy(**{**POLICY.__dict__, "budget": DisruptionBudget(count=1)})
    entries = [entry("w-1", Action.DRAIN)]

    def decide(statuses: dict[str, WorkerStatus], draining: int) -> Guard | None:
        return admit(
            worker("w-2"),
            Action.DRAIN,
            entries=entries,
            statuses=statuses,
            running_in_scope={SCOPE: 3},
            draining=draining,
            policy=one_drain,
            fleet_size=3,
        )

    # Statuses first (w-1 still RUNNING), then the counters (w-1 now DRAINING).
    assert decide({"w-1": WorkerStatus.RUNNING}, draining=1) is Guard.DISRUPTION_BUDGET
    # Either read alone also refuses: the entry, or the counted drain.
    assert decide({"w-1": WorkerStatus.RUNNING}, draining=0) is Guard.DISRUPTION_BUDGET
    assert decide({"w-1": WorkerStatus.DRAINING}, draining=1) is Guard.DISRUPTION_BUDGET
