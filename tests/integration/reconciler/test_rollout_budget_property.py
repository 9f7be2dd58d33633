"""A property over the rollout engine, the pools' disruption budgets and operators' drains, through the
real services on DynamoDB Local.

However rollout steps, other voluntary disruptions (expiry, scale-down), operators' drains, drains
ending, replacements coming up and the clock (budget windows, `max: 0` freezes) interleave:

- no voluntary admission (rollout, expired, scale_down) takes a pool beyond the budget that applies to
  its reason, counting every disruption of the pool, operators' drains included (those are never
  refused, so they alone may go beyond it); where no budget applies, the stage default bounds drains
  fleet-wide;
- never more than `max_unavailable` of the rollout's scope is out of placement because of the rollout:
  an old worker the rollout drained whose replacement has not run yet.

The engine's decisions need the store and the ledger (services/rollout_engine.py `step`,
services/disruption.py `admit`), so the property drives the services, a fresh table per example, with
few examples, derandomized. The drain workflow is not started (its start is recorded): the example
itself decides when a drain ends, as it decides when a replacement runs.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fleetkeeper.domain.disruption import (
    DISRUPTING,
    MEMBERS,
    Budget,
    DisruptionPolicy,
    DisruptionReason,
    assess,
)
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainThen, Worker
from fleetkeeper.domain.rollouts import RolloutRequest, RolloutStatus, RolloutStrategy, replacement_id
from fleetkeeper.domain.scale_down import DisruptionBudget
from fleetkeeper.services import catalog, disruption, drains, rollout_engine, rollouts, workers
from fleetkeeper.services.context import Context
from fleetkeeper.services.drains import commands
from fleetkeeper.store.repository import FleetStore
from tests.integration.reconciler.support import ensure_template

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START = datetime(2026, 3, 28, 20, 0, tzinfo=UTC)  # the night Berlin's clocks jump
POOL = "labs"
STATE_MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:fk-drain"
OPERATOR = "operator:alice"
# The stage default where no budget of the pool applies to a reason.
STAGE_DEFAULT = "2"

always = st.builds(
    Budget,
    max=st.one_of(st.integers(0, 3), st.sampled_from(["0%", "25%", "50%"])),
    reasons=st.sampled_from([None, ["rollout"], ["expired", "scale_down"], ["rollout", "scale_down"]]),
    schedule=st.none(),
)
# Windows that do not overlap: a refusal under overlapping ones (e.g. "*/15 * * * *" for 90m) costs
# seconds of cronsim walks in `blocked_until`, which this property is not about.
windows = st.sampled_from(
    [
        ("0 * * * *", "20m"),
        ("0 * * * *", "1h"),
        ("30 2 * * *", "90m"),
        ("0 21 * * *", "1h"),
        ("*/15 * * * *", "10m"),
    ]
)
windowed = st.builds(
    lambda window, **fields: Budget(schedule=window[0], duration=window[1], **fields),
    window=windows,
    max=st.integers(0, 2),
    reasons=st.sampled_from([None, ["rollout"], ["scale_down"]]),
    timezone=st.sampled_from(["Europe/Berlin", "America/New_York", "UTC"]),
)
policies = st.builds(DisruptionPolicy, budgets=st.lists(always | windowed, max_size=3))
plans = st.lists(
    st.one_of(
        st.just(("rollout",)),
        st.just(("rollout",)),
        st.just(("rollout",)),
        st.tuples(st.just("voluntary"), st.sampled_from(["expired", "scale_down"]), st.integers(0, 9)),
        st.tuples(st.just("operator"), st.integers(0, 9)),
        st.tuples(st.just("finish"), st.integers(0, 9)),
        st.tuples(st.just("launch"), st.integers(0, 9)),
        st.tuples(st.just("clock"), st.integers(1, 90)),
    ),
    min_size=8,
    max_size=24,
)


@pytest.fixture
def unstarted_workflows(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The drain workflow's start, recorded: the worker is DRAINING until the example ends its drain."""
    started: list[str] = []

    def record(ctx: Context, worker_id: str, record: Any) -> str:
        started.append(worker_id)
        return f"{STATE_MACHINE}:{worker_id}"

    monkeypatch.setattr(commands, "launch_worker_drain", record)
    return started


class Example:
    """One example's fleet: a fresh table, a pool with the example's budgets, the rollout's scope and a
    few other workers of the pool."""

    def __init__(self, local_stack: Any, dynamodb: Any, make_ctx: Any, policy: DisruptionPolicy) -> None:
        self.table = f"fk-prop-{uuid.uuid4().hex[:10]}"
        local_stack.create_table(self.table)
        self.store = FleetStore(dynamodb, self.table)
        self.ctx: Context = make_ctx(
            TABLE_NAME=self.table,
            DRAIN_STATE_MACHINE_ARN=STATE_MACHINE,
            MAX_CONCURRENT_DRAINS=STAGE_DEFAULT,
        )
        self.policy = policy
        ensure_template(self.store, "lab")
        ensure_template(self.store, "other")
        catalog.put_pool(self.store, POOL, actor="test", disruption=policy)
        self.ran: set[str] = set()

    def running(self, template: str) -> Worker:
        worker = workers.create_worker(
            self.store, template=template, region="us-east-1", pool=POOL, actor="t"
        )
        return self.launch(worker)

    def launch(self, worker: Worker) -> Worker:
        worker = self.store.transition_worker(
            worker,
            WorkerStatus.PROVISIONING,
            cause=Cause.CONTROL,
            actor="test",
            changes={"ec2_instance_id": f"i-{uuid.uuid4().hex[:17]}"},
        )
        self.ran.add(worker.id)
        return self.store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="test")

    def pool(self) -> list[Worker]:
        """The pool's workers, whole (the index's summaries hold no drain)."""
        return list(self.store.get_workers([w.id for w in self.store.workers_in_pool(POOL)]))

    def pick(self, status: WorkerStatus, index: int) -> Worker | None:
        found = sorted((w for w in self.pool() if w.status == status), key=lambda w: w.id)
        return found[index % len(found)] if found else None


def _allowed(
    example: Example, reason: DisruptionReason, now: datetime, before: list[Worker], fleet: Any
) -> tuple[int, int]:
    """What may be disrupted at once for `reason` and how many count as in use, as the budgets see the
    pool before the admission; where no budget applies, the stage default and the fleet's drains
    (`fleet`: its counts before the admission)."""
    members = sum(1 for w in before if w.status in MEMBERS)
    in_use = sum(1 for w in before if w.status in DISRUPTING)
    found = assess(example.policy, reason, now, members=members, in_use=in_use)
    if found.allowed is not None:
        return found.allowed, in_use
    return DisruptionBudget.parse(STAGE_DEFAULT).allowed(fleet.fleet_size), fleet.draining


def _newly_draining(before: list[Worker], after: list[Worker], by: str) -> list[str]:
    was = {w.id: w.status for w in before}
    return [
        w.id
        for w in after
        if w.status == WorkerStatus.DRAINING
        and was.get(w.id) != WorkerStatus.DRAINING
        and w.drain is not None
        and w.drain.requested_by == by
    ]


@pytest.fixture
def examples(local_stack: Any, dynamodb: Any, make_ctx: Any, unstarted_workflows: list[str]) -> Iterator[Any]:
    made: list[Example] = []

    def make(policy: DisruptionPolicy) -> Example:
        example = Example(local_stack, dynamodb, make_ctx, policy)
        made.append(example)
        return example

    yield make
    for example in made:
        local_stack.delete_table(example.table)


def test_property_no_interleaving_takes_a_pool_beyond_its_budget_or_a_scope_beyond_max_unavailable(
    examples: Any,
) -> None:
    @settings(
        max_examples=int(os.environ.get("FLEETKEEPER_PROPERTY_EXAMPLES", "6")),  # `make stress` runs 60
        deadline=None,
        derandomize=True,
        # Each example is a table and a few dozen service calls: a failure is reported as found, not
        # shrunk (shrinking would replay it hundreds of times).
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        policy=policies,
        scope=st.integers(2, 6),
        others=st.integers(0, 3),
        max_unavailable=st.integers(1, 4),
        strategy=st.sampled_from(list(RolloutStrategy)),
        plan=plans,
    )
    def run(  # noqa: PLR0917 (hypothesis passes each strategy by name)
        policy: DisruptionPolicy,
        scope: int,
        others: int,
        max_unavailable: int,
        strategy: RolloutStrategy,
        plan: list[tuple[Any, ...]],
    ) -> None:
        example: Example = examples(policy)
        old = [example.running("lab").id for _ in range(scope)]
        for _ in range(others):
            example.running("other")
        rollout = rollouts.start(
            example.ctx,
            RolloutRequest(template="lab", pool=POOL, max_unavailable=max_unavailable, strategy=strategy),
            actor="test",
        )
        actor = rollout_engine.ACTOR_PREFIX + rollout.id
        replacements = {w: replacement_id(rollout.id, w) for w in old}
        now = START
        admitted = 0
        for move in plan:
            kind = move[0]
            before = example.pool()
            fleet = example.store.fleet_counts()
            if kind == "clock":
                now += timedelta(minutes=move[1])
            elif kind == "rollout":
                current = example.ctx.rollouts.find(rollout.id)
                if current is None or current.status != RolloutStatus.RUNNING:
                    continue
                rollout_engine.step(example.ctx, current, now)
                started = _newly_draining(before, example.pool(), actor)
                if started:
                    allowed, in_use = _allowed(example, DisruptionReason.ROLLOUT, now, before, fleet)
                    assert in_use + len(started) <= allowed, (policy, now, in_use, started)
                    admitted += len(started)
                # Out of placement because of the rollout: old workers it drained whose replacement
                # has not run yet. Surge drains none before its replacement runs.
                out = [
                    w
                    for w in example.store.get_workers(old)
                    if w.drain is not None
                    and w.drain.requested_by == actor
                    and replacements[w.id] not in example.ran
                ]
                assert len(out) <= current.max_unavailable, out
                if strategy == RolloutStrategy.SURGE:
                    assert not out, out
            elif kind == "voluntary":
                reason = DisruptionReason(move[1])
                chosen = example.pick(WorkerStatus.RUNNING, move[2])
                if chosen is None or chosen.id in old:
                    continue  # a rollout's worker is the rollout's to replace
                refusal = disruption.admit(example.ctx, chosen.id, reason, now=now)
                if refusal is None:
                    allowed, in_use = _allowed(example, reason, now, before, fleet)
                    assert in_use + 1 <= allowed, (policy, now, reason, in_use)
                    drains.start_worker_drain(
                        example.ctx,
                        chosen.id,
                        actor="reconciler",
                        reason=str(reason),
                        then=DrainThen.TERMINATE,
                    )
                    admitted += 1
            elif kind == "operator":
                chosen = example.pick(WorkerStatus.RUNNING, move[1])
                if chosen is not None:  # never refused, whatever the budgets say
                    drains.start_worker_drain(
                        example.ctx, chosen.id, actor=OPERATOR, then=DrainThen.TERMINATE
                    )
            elif kind == "finish":
                chosen = example.pick(WorkerStatus.DRAINING, move[1])
                if chosen is not None:
                    example.store.transition_worker(
                        chosen, WorkerStatus.TERMINATED, cause=Cause.EC2, actor="test"
                    )
            elif kind == "launch":
                chosen = example.pick(WorkerStatus.PENDING, move[1])
                if chosen is not None:
                    example.launch(chosen)
        assert admitted >= 0

    run()
