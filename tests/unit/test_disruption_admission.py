"""Admission of voluntary disruptions through the ledger against a pool's budgets: however cycles with
stale views, operator drains, disruptions ending and the clock interleave, what is admitted never takes
the pool beyond the budget that applied when it was admitted."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetkeeper.domain.disruption import (
    Budget,
    DisruptionPolicy,
    DisruptionReason,
    PoolLoad,
    assess,
)
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker
from fleetkeeper.domain.scale_down import Action, DisruptionBudget, Guard
from fleetkeeper.domain.scale_down_ledger import MAX_IN_FLIGHT, InFlight, Limits, check

START = datetime(2026, 3, 28, 20, 0, tzinfo=UTC)  # the night Berlin's clocks jump
POOL = "labs"
SCOPE = f"lab#{POOL}"
REASON = DisruptionReason.SCALE_DOWN

budgets = st.builds(
    Budget,
    max=st.one_of(st.integers(0, 4), st.sampled_from(["0%", "10%", "25%", "50%", "100%"])),
    reasons=st.sampled_from([None, ["scale_down"], ["rollout"], ["scale_down", "drift"]]),
    schedule=st.none(),
)
windowed = st.builds(
    Budget,
    max=st.integers(0, 3),
    reasons=st.sampled_from([None, ["scale_down"]]),
    schedule=st.just("0 * * * *") | st.just("30 2 * * *") | st.just("*/15 * * * *"),
    duration=st.sampled_from(["20m", "1h", "90m"]),
    timezone=st.sampled_from(["Europe/Berlin", "America/New_York", "UTC"]),
)
policies = st.builds(DisruptionPolicy, budgets=st.lists(budgets | windowed, max_size=4))
steps = st.lists(
    st.one_of(
        st.tuples(st.just("view"), st.integers(0, 2)),
        st.tuples(st.just("admit"), st.integers(0, 2), st.integers(0, 11)),
        st.tuples(st.just("act"), st.integers(0, 30)),
        st.tuples(st.just("finish"), st.integers(0, 11)),
        st.tuples(st.just("operator"), st.integers(0, 11)),
        st.tuples(st.just("clock"), st.integers(1, 90)),
    ),
    max_size=60,
)


def worker(worker_id: str) -> Worker:
    return Worker(
        id=worker_id, template="lab", pool=POOL, region="us-east-1", capacity=4, status=WorkerStatus.RUNNING
    )


@dataclass
class View:
    statuses: dict[str, WorkerStatus]

    @property
    def load(self) -> PoolLoad:
        statuses = self.statuses.values()
        members = sum(1 for s in statuses if s in (WorkerStatus.RUNNING, WorkerStatus.DRAINING))
        return PoolLoad(members=members, disrupting=sum(1 for s in statuses if s == WorkerStatus.DRAINING))


@dataclass
class Fleet:
    real: dict[str, WorkerStatus]
    entries: list[InFlight] = field(default_factory=list)
    by_operator: set[str] = field(default_factory=set)

    def view(self) -> View:
        return View(dict(self.real))


@settings(max_examples=100, deadline=None)
@given(
    policy=policies,
    size=st.integers(1, 12),
    default=st.integers(0, 3),
    plan=steps,
)
def test_given_any_interleaving_then_no_admission_takes_the_pool_beyond_its_budget(
    policy, size, default, plan
):
    fleet = Fleet({f"w-{n:02d}": WorkerStatus.RUNNING for n in range(size)})
    views = {c: fleet.view() for c in range(3)}
    now = START
    for step in plan:
        kind = step[0]
        if kind == "view":
            views[step[1]] = fleet.view()
        elif kind == "clock":
            now += timedelta(minutes=step[1])
        elif kind == "operator":
            running = sorted(w for w, s in fleet.real.items() if s == WorkerStatus.RUNNING)
            if running:
                chosen = running[step[1] % len(running)]
                fleet.real[chosen] = WorkerStatus.DRAINING  # never refused
                fleet.by_operator.add(chosen)
        elif kind == "finish":
            draining = sorted(w for w, s in fleet.real.items() if s == WorkerStatus.DRAINING)
            if draining:
                fleet.real[draining[step[1] % len(draining)]] = WorkerStatus.STOPPED
        elif kind == "act":
            # An admitted disruption takes effect (its worker drains), whenever the cycle gets to it.
            if fleet.entries:
                entry = fleet.entries[step[1] % len(fleet.entries)]
                if fleet.real[entry.worker_id] == WorkerStatus.RUNNING:
                    fleet.real[entry.worker_id] = WorkerStatus.DRAINING
        else:
            _, cycle, pick = step
            view = views[cycle]
            candidates = sorted(w for w, s in view.statuses.items() if s == WorkerStatus.RUNNING)
            if not candidates:
                continue
            candidate = candidates[pick % len(candidates)]
            load = view.load
            limits = Limits(
                at=now,
                default=DisruptionBudget(count=default),
                fleet_size=load.members,
                draining=load.disrupting,
                policies={POOL: policy},
                loads={POOL: load},
            )
            refusal = check(
                worker(candidate),
                Action.DRAIN,
                REASON,
                entries=fleet.entries,
                statuses=view.statuses,
                limits=limits,
            )
            if refusal is not None:
                assert refusal.guard in (Guard.POOL_BUDGET, Guard.DISRUPTION_BUDGET, Guard.IN_FLIGHT)
                continue
            # What the admission adds to, in reality: every voluntary disruption admitted and not over
            # (taken effect or not), and the operator's drains the admitting view could see.
            voluntary = {
                e.worker_id for e in fleet.entries if fleet.real[e.worker_id] != WorkerStatus.STOPPED
            }
            seen_by_operator = {
                w for w in fleet.by_operator if view.statuses.get(w) == WorkerStatus.DRAINING
            } - voluntary
            found = assess(policy, REASON, now, members=load.members, in_use=0)
            allowed = found.allowed if found.allowed is not None else default
            assert len(voluntary) + len(seen_by_operator) + 1 <= allowed
            fleet.entries.append(
                InFlight(worker_id=candidate, scope=SCOPE, action=Action.DRAIN, until=now, reason=REASON)
            )
        assert len(fleet.entries) <= MAX_IN_FLIGHT
