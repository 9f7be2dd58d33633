"""The pools' disruption budgets hold however the deciders meet: a property over the real services on
DynamoDB Local, judged by an oracle of its own.

An example draws a pool's budgets (counts, percentages, reasons, cron windows in three zones, from the
night Berlin's clocks jump), the stage default, a fleet (two rollouts' scopes, spare workers, some of
them expired, every one idle) and a plan of rounds. In a round, several deciders run at once, each on
its own thread with its own context and its own instant: each rollout's step, the rollbacks' step, a
scale-down pass, an expiry pass, a change of the budgets, an operator's drain. TransactWriteItems is
cancelled now and then as under contention on AWS. Between rounds the plan ends drains, brings
replacements up, cancels a drain, moves a rollout (pause, resume, cancel, roll back), settles owners
and moves the clock on. The drain workflow is not started (its start is recorded).

The oracle (bench/stress_check.judge_budgets) replays the example's audit trail, in the order of the
commits this process recorded: no voluntary place was taken beyond the most restrictive budget that
applies to its reason at the instant it was decided (a count, or a percentage of the pool's members
rounded up), or the stage default fleet-wide where none applies. Over the run, a share of examples
admit and a share refuse, and on each example's own trail the oracle catches one place too many.
"""

from __future__ import annotations

import contextlib
import os
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from bench.stress_check import (
    CommitSpans,
    Judged,
    Snapshot,
    Span,
    Trail,
    judge_budgets,
    snapshot,
)
from fleetkeeper.domain.admission import Ask
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.errors import Conflict, StaleWrite
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DesiredLaunch, DrainThen, Drift, DriftReason, Worker, WorkerTemplate
from fleetkeeper.domain.reconcile import Outcome, Step
from fleetkeeper.domain.rollouts import RolloutRequest, RolloutStatus, RolloutStrategy
from fleetkeeper.services import admission, catalog, drains, rollouts, workers
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.actions import Work
from fleetkeeper.services.reconcile.expiry import replace_expired
from fleetkeeper.services.reconcile.scale_down import plan_steady_running
from fleetkeeper.services.rollouts import engine
from fleetkeeper.services.rollouts.rollbacks import advance_rollbacks
from fleetkeeper_local import faults
from fleetkeeper_local.stack import LocalStack

pytestmark = [pytest.mark.integration, pytest.mark.slow]

START = datetime(2026, 3, 28, 20, 0, tzinfo=UTC)  # the night Berlin's clocks jump
POOL = "labs"
OPERATOR = "operator:alice"
EXAMPLES = int(os.environ.get("FLEETKEEPER_PROPERTY_EXAMPLES", "4"))  # `make stress` runs 60
# Over the run, at least this share of examples takes a place, and this share is refused one.
ADMITTING_SHARE = REFUSING_SHARE = 0.3
# Cancelled transactions (TransactionConflict), as AWS cancels them under contention.
CONFLICT_RATE = 0.05

always = st.builds(
    Budget,
    max=st.one_of(st.integers(0, 3), st.sampled_from(["0%", "20%", "34%", "50%", "100%"])),
    reasons=st.sampled_from([None, ["rollout"], ["expired", "scale_down"], ["rollout", "scale_down"]]),
)
# Windows that do not overlap themselves (overlapping ones cost `blocked_until` seconds of schedule
# walks, which this property is not about); 02:30 Berlin does not exist on the first night.
windows = st.sampled_from(
    [
        ("0 * * * *", "20m"),
        ("30 * * * *", "1h"),
        ("30 2 * * *", "90m"),
        ("0 21 * * *", "1h"),
        ("*/15 * * * *", "10m"),
    ]
)
windowed = st.builds(
    lambda window, **fields: Budget(schedule=window[0], duration=window[1], **fields),
    window=windows,
    max=st.one_of(st.integers(0, 2), st.sampled_from(["0%", "50%"])),
    reasons=st.sampled_from([None, ["rollout"], ["scale_down"], ["expired"]]),
    timezone=st.sampled_from(["Europe/Berlin", "America/New_York", "UTC"]),
)
policies = st.builds(DisruptionPolicy, budgets=st.lists(always | windowed, max_size=3))
# Every round runs these at once; a round may add a change of the budgets and an operator's drain.
DECIDERS = ("rollout A", "rollout B", "rollbacks", "scale-down", "expiry")
EXTRAS = ("budgets", "operator")
moves = st.one_of(
    st.tuples(st.just("finish"), st.integers(0, 9)),
    st.tuples(st.just("launch"), st.integers(0, 9)),
    st.tuples(st.just("cancel"), st.integers(0, 9)),
    st.just(("settle",)),
    st.tuples(
        st.just("rollout"),
        st.sampled_from(["A", "B"]),
        st.sampled_from(["pause", "resume", "cancel", "rollback"]),
    ),
)
rounds = st.lists(
    st.fixed_dictionaries(
        {
            "extras": st.lists(st.sampled_from(EXTRAS), max_size=2, unique=True),
            # Each decider's instant: the round's clock and these seconds.
            "offsets": st.lists(
                st.integers(0, 240), min_size=len(DECIDERS + EXTRAS), max_size=len(DECIDERS + EXTRAS)
            ),
            "budgets": policies,
            "pick": st.integers(0, 99),
            # Between rounds: this many disruptions end and this many new workers come up, then the
            # other moves, one at a time.
            "finish": st.integers(1, 3),
            "launch": st.integers(1, 3),
            "moves": st.lists(moves, max_size=4),
            "advance": st.integers(1, 100),
        }
    ),
    min_size=3,
    max_size=5,
)


@dataclass
class Tally:
    """What the run's examples did, for the shares asserted at its end."""

    examples: int = 0
    admitting: int = 0
    refusing: int = 0
    judged: int = 0
    at_limit: int = 0
    forged: int = 0
    refusals: Counter[str] = field(default_factory=Counter)


class Example:
    """One example's fleet on a fresh table: templates, the pool with the example's budgets, RUNNING
    workers idle for long; every write of this process recorded with when it committed."""

    def __init__(self, local_stack: LocalStack, make_ctx: Callable[..., Context], **settings: str) -> None:
        self.table = f"fk-prop-{uuid.uuid4().hex[:10]}"
        self.local_stack = local_stack
        local_stack.create_table(self.table)
        self.settings = {"TABLE_NAME": self.table, **settings}
        self.make_ctx = make_ctx
        self.spans = CommitSpans()
        self.errors: list[str] = []
        self.refused: list[str] = []

    def ctx(self) -> Context:
        return self.make_ctx(**self.settings)

    def running(self, ctx: Context, template: str) -> Worker:
        worker = workers.create_worker(ctx.store, template=template, region="us-east-1", pool=POOL, actor="t")
        return self.launch(ctx, worker)

    def launch(self, ctx: Context, worker: Worker) -> Worker:
        worker = ctx.store.transition_worker(
            worker,
            WorkerStatus.PROVISIONING,
            cause=Cause.CONTROL,
            actor="test",
            changes={"ec2_instance_id": f"i-{uuid.uuid4().hex[:17]}"},
        )
        # Idle since long before the example's clock: scale-down proposes every RUNNING worker.
        return ctx.store.transition_worker(
            worker,
            WorkerStatus.RUNNING,
            cause=Cause.EC2,
            actor="test",
            changes={"idle_since": START - timedelta(days=1)},
        )

    def pool(self, ctx: Context) -> list[Worker]:
        return ctx.store.get_workers([w.id for w in ctx.store.workers_in_pool(POOL)])

    def pick(self, ctx: Context, statuses: set[WorkerStatus], index: int) -> Worker | None:
        found = sorted((w for w in self.pool(ctx) if w.status in statuses), key=lambda w: w.id)
        return found[index % len(found)] if found else None


@pytest.fixture
def examples(local_stack: LocalStack, make_ctx: Any, drains_started: list[dict[str, Any]]) -> Iterator[Any]:
    made: list[Example] = []

    def make(**settings: str) -> Example:
        example = Example(local_stack, make_ctx, **settings)
        made.append(example)
        return example

    yield make
    for example in made:
        local_stack.delete_table(example.table)


def expired(now: datetime) -> dict[str, Any]:
    """The drift a cycle would plan for an expired worker."""
    return {
        "drift": Drift(
            reasons=[DriftReason.EXPIRED],
            desired=DesiredLaunch(instance_type="m5.large"),
            since=now - timedelta(hours=1),
        )
    }


def decide(example: Example, who: str, now: datetime, draw: dict[str, Any], state: dict[str, Any]) -> None:
    """One decider's turn, on its own context (its own thread)."""
    ctx = example.ctx()
    pool = [w for w in example.pool(ctx) if w.status == WorkerStatus.RUNNING]
    if who.startswith("rollout "):
        rollout = ctx.rollouts.find(state["rollouts"].get(who[-1], ""))
        if rollout is not None and rollout.status == RolloutStatus.RUNNING:
            # An operator's move that came first drops the step: the next one decides.
            with contextlib.suppress(StaleWrite):
                engine.step(ctx, rollout, now)
    elif who == "rollbacks":
        advance_rollbacks(ctx, Counter(), time_left=lambda: 60.0, margin_seconds=0, now=now)
    elif who == "scale-down":
        work = [Work(w, Step(Outcome.SUCCESS), None) for w in pool]
        plan_steady_running(ctx, work, {}, now, Counter())
    elif who == "expiry":
        work = [
            Work(w, Step(Outcome.SUCCESS, changes=expired(now)), None) for w in pool if w.id in state["old"]
        ]
        replace_expired(ctx, work, now, Counter(), time_left=lambda: 60.0, margin_seconds=0)
    elif who == "budgets":
        catalog.put_pool(ctx.store, POOL, actor=OPERATOR, disruption=draw["budgets"])
    elif who == "operator" and pool:
        chosen = pool[draw["pick"] % len(pool)]
        # Never refused by a budget; a worker someone just took is the answer's 409.
        with contextlib.suppress(Conflict):
            drains.start_worker_drain(ctx, chosen.id, actor=OPERATOR, then=DrainThen.TERMINATE)


def serial(example: Example, move: tuple[Any, ...], now: datetime, state: dict[str, Any]) -> None:
    """What happens between rounds, one at a time."""
    ctx = example.ctx()
    kind = move[0]
    if kind == "finish":
        leaving = {WorkerStatus.DRAINING, WorkerStatus.STOPPING, WorkerStatus.TERMINATING}
        chosen = example.pick(ctx, leaving, move[1])
        if chosen is not None:
            gone = WorkerStatus.STOPPED if chosen.status == WorkerStatus.STOPPING else WorkerStatus.TERMINATED
            ctx.store.transition_worker(chosen, gone, cause=Cause.EC2, actor="test")
    elif kind == "launch":
        chosen = example.pick(ctx, {WorkerStatus.PENDING}, move[1])
        if chosen is not None:
            example.launch(ctx, chosen)
    elif kind == "cancel":
        chosen = example.pick(ctx, {WorkerStatus.DRAINING}, move[1])
        if chosen is not None:
            drains.cancel_worker_drain(ctx, chosen.id, actor=OPERATOR)
    elif kind == "settle":
        admission.settle_owners(ctx, example.pool(ctx), Counter(), now)
    elif kind == "rollout" and (rollout_id := state["rollouts"].get(move[1])) is not None:
        with contextlib.suppress(Conflict):  # not a move its status allows
            getattr(rollouts, move[2])(ctx, rollout_id, actor=OPERATOR)


def run_round(
    example: Example, clock: datetime, draw: dict[str, Any], state: dict[str, Any]
) -> list[datetime]:
    """The round's deciders at once, each on its own thread at its own instant; the instants."""
    deciding = [*DECIDERS, *draw["extras"]]
    offsets = dict(zip(DECIDERS + EXTRAS, draw["offsets"], strict=True))
    instants = [clock + timedelta(seconds=offsets[who]) for who in deciding]

    def turn(who: str, now: datetime) -> None:
        try:
            decide(example, who, now, draw, state)
        except Exception as exc:  # the round's failure, reported with the example
            example.errors.append(f"{who} at {now.isoformat()}: {exc!r}")

    threads = [threading.Thread(target=turn, args=pair) for pair in zip(deciding, instants, strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return instants


def refusals(example: Example, since: datetime) -> list[str]:
    """The refusals a budget or a window made in the pool since `since`, from its waiting list."""
    listed = example.ctx().waiting.read(POOL).entries
    return [f"{e.reason}:{e.why}" for e in listed if e.why in ("budget", "window") and e.refused_at >= since]


def one_too_many(shot: Snapshot, spans: dict[tuple[str, str], Span], judged: Judged, default: str) -> bool:
    """Add to the trail one place more, taken just before `judged`'s and given back just after, by a
    worker of its scope that holds none then and stays a member: the oracle must now find it beyond."""
    trail = Trail(shot, spans)
    at = judged.place.taken
    busy = {
        p.worker_id
        for p in trail.places
        if p.taken.lo <= at.hi and (p.given_back is None or p.given_back.hi >= at.lo)
    }
    scope = judged.place.pool if judged.budget.startswith("budget") else None
    candidates = [
        wid
        for wid, stints in sorted(trail.statuses.items())
        if wid != judged.place.worker_id
        and wid not in busy
        and (scope is None or trail.pool_of.get(wid) == scope)
        and any(s.status == "RUNNING" and s.certainly_holds(at) for s in stints)
    ]
    if not candidates:
        return False
    forged = candidates[0]
    taken = Span(at.lo - timedelta(milliseconds=2), at.lo - timedelta(milliseconds=1))
    given_back = Span(at.hi + timedelta(milliseconds=1), at.hi + timedelta(milliseconds=2))
    pk = f"AUDIT#worker#{forged}"
    since = judged.place.since or at.lo
    for span, moved in ((taken, 1), (given_back, -1)):
        sk = f"{span.lo.isoformat()}#forged"
        details: dict[str, Any] = {"in_use": moved, "owner": judged.place.reason}
        if moved > 0:
            details |= {"owner_since": since.isoformat(), "pool_version": judged.place.pool_version}
        shot.audit[("worker", forged)].append(
            {
                "PK": pk,
                "SK": sk,
                "at": span.lo.isoformat(),
                "action": "Forged",
                "actor": "forger",
                "details": details,
            }
        )
        spans[(pk, sk)] = span
    shot.audit[("worker", forged)].sort(key=lambda e: str(e["SK"]))
    again, _ = judge_budgets(Trail(shot, spans), default=default, simulated_clock=True)
    return any(
        j.place.worker_id == judged.place.worker_id and j.place.taken == at and j.beyond for j in again
    )


def test_property_no_interleaving_of_deciders_takes_a_place_beyond_a_budget(
    examples: Any, local_stack: LocalStack, dynamodb: Any
) -> None:
    tally = Tally()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        # Each example is a table and a few hundred service calls on threads: a failure is reported as
        # found, not shrunk (shrinking would replay it hundreds of times).
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(
        policy=policies,
        default=st.sampled_from(["1", "2", "3", "50%"]),
        min_workers=st.integers(0, 1),
        scopes=st.tuples(st.integers(3, 5), st.integers(2, 4)),
        spare=st.integers(3, 6),
        old=st.integers(1, 4),
        max_unavailable=st.tuples(st.integers(1, 3), st.integers(1, 3)),
        strategies=st.tuples(st.sampled_from(list(RolloutStrategy)), st.sampled_from(list(RolloutStrategy))),
        plan=rounds,
    )
    def run(  # noqa: PLR0917 (hypothesis passes each strategy by name)
        policy: DisruptionPolicy,
        default: str,
        min_workers: int,
        scopes: tuple[int, int],
        spare: int,
        old: int,
        max_unavailable: tuple[int, int],
        strategies: tuple[RolloutStrategy, RolloutStrategy],
        plan: list[dict[str, Any]],
    ) -> None:
        example: Example = examples(
            MAX_CONCURRENT_DRAINS=default,
            SCALE_DOWN_ENABLED="true",
            SCALE_DOWN_COOLDOWN_SECONDS="0",
            IDLE_WINDOW_SECONDS="60",
            MIN_WORKERS=str(min_workers),
        )
        with ExitStack() as hooks:
            hooks.enter_context(faults.installed_hooks(example.spans.hooks()))
            hooks.enter_context(
                faults.FaultPlan(len(plan), [faults.dynamodb_conflicts(CONFLICT_RATE)]).installed()
            )
            ctx = example.ctx()
            for template in ("lab", "web", "spare"):
                catalog.put_template(
                    ctx.store,
                    WorkerTemplate(
                        name=template, instance_type="m5.large", ami_name_filter="lab-*", capacity=4
                    ),
                    actor="test",
                )
            catalog.put_pool(ctx.store, POOL, actor="test", disruption=policy)
            fleet = {
                t: [example.running(ctx, t).id for _ in range(n)]
                for t, n in zip(("lab", "web", "spare"), (*scopes, spare), strict=True)
            }
            state: dict[str, Any] = {
                # The expired: spare workers first, then one of rollout A's (the rollout holds it).
                "old": set(fleet["spare"][:old] + fleet["lab"][: max(0, old - spare)]),
                "rollouts": {},
            }
            for name, template, limit, strategy in zip(
                ("A", "B"), ("lab", "web"), max_unavailable, strategies, strict=True
            ):
                if fleet[template]:
                    request = RolloutRequest(
                        template=template, pool=POOL, max_unavailable=limit, strategy=strategy
                    )
                    state["rollouts"][name] = rollouts.start(ctx, request, actor="test").id
            clock = START
            refused: list[str] = []
            for draw in plan:
                instants = run_round(example, clock, draw, state)
                refused += refusals(example, min(instants))
                ends = [("finish", n) for n in range(draw["finish"])]
                for move in [*ends, *(("launch", 0) for _ in range(draw["launch"])), *draw["moves"]]:
                    serial(example, move, clock, state)
                clock += timedelta(minutes=draw["advance"])
        assert not example.errors, example.errors
        shot = snapshot(dynamodb, example.table)
        spans = dict(example.spans.spans)
        judged, problems = judge_budgets(Trail(shot, spans), default=default, simulated_clock=True)
        assert not problems, problems
        beyond = [j.describe() for j in judged if j.beyond]
        assert not beyond, (policy, default, beyond)

        tally.examples += 1
        tally.judged += len(judged)
        tally.admitting += bool(judged)
        tally.refusing += bool(refused)
        tally.refusals.update(refused)
        at_limit = [j for j in judged if j.in_use == j.allowed]
        tally.at_limit += len(at_limit)
        # The oracle is not blind here: one place more on this very trail is found beyond.
        if at_limit:
            assert one_too_many(shot, spans, at_limit[0], default), at_limit[0].describe()
            tally.forged += 1

    run()
    print(f"budget property: {tally}")
    assert tally.examples == EXAMPLES
    assert tally.admitting >= ADMITTING_SHARE * tally.examples, tally
    assert tally.refusing >= REFUSING_SHARE * tally.examples, tally
    assert tally.forged >= 1, tally


def test_given_a_place_taken_ahead_and_given_back_then_the_audit_trail_says_so(
    make_ctx: Any, store: Any
) -> None:
    catalog.put_template(
        store,
        WorkerTemplate(name="spare", instance_type="m5.large", ami_name_filter="lab-*", capacity=4),
        actor="t",
    )
    catalog.put_pool(store, POOL, actor="t", disruption=DisruptionPolicy(budgets=[Budget(max=1)]))
    worker = workers.create_worker(store, template="spare", region="us-east-1", pool=POOL, actor="t")
    worker = store.transition_worker(worker, WorkerStatus.PROVISIONING, cause=Cause.CONTROL, actor="t")
    store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="t")
    ctx = make_ctx()
    ask = Ask(DisruptionReason.EXPIRED, "reconciler", ahead=True)

    with admission.door(ctx, START) as door:
        admission.hold_ahead(ctx, door, worker.id, ask)
        door.release(worker.id, ask)

    trail = [e.details for e in store.audit_trail("worker", worker.id) if "in_use" in e.details]
    assert trail == [
        {"in_use": 1, "owner": "expired", "owner_since": START.isoformat(), "pool_version": 1},
        {"in_use": -1, "owner": "expired"},
    ]
    (created,) = [e for e in store.audit_trail("pool", POOL)]
    assert DisruptionPolicy.model_validate_json(str(created.details["disruption"])).budgets == [Budget(max=1)]
