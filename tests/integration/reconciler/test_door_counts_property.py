"""The disruption counts never drift: however admissions, releases and ends interleave across threads
on DynamoDB Local, `DISRUPTING#<pool>.in_use` (and its per-template figures) is the number of the pool's
workers with a counted owner, and `DISRUPTING FLEET` the fleet's.

Each example runs a seeded random mix through the real services from several threads at once:
scale-down's stops and drains and a rollout's admissions ahead, drains and claims (each through the
door), expiry's leases (some lapsing at once) and their releases, operators' drains and cancels, spot
warnings taking workers over, EC2 stopping, stopping-finished and terminating machines, a rollout
ending under its admissions, new workers, and `settle_owners` releasing what lapsed. The drain workflow
is not started (its start is recorded): a drain ends by a cancel or by EC2's events.
"""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.admission import Ask, Claim, counted
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.errors import FleetkeeperError, StaleWrite
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Owner, Worker, utcnow
from fleetkeeper.domain.rollouts import Rollout, RolloutStrategy
from fleetkeeper.services import admission, catalog, drains, ec2_events
from fleetkeeper.services.context import Context
from fleetkeeper.services.rollouts import commands as rollouts
from fleetkeeper.services.rollouts.step import Step
from fleetkeeper.store.disruption import read_counts
from fleetkeeper.store.repository import FleetStore
from tests.integration.conftest import WorkerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = int(os.environ.get("FLEETKEEPER_PROPERTY_EXAMPLES", "1"))  # `make stress` runs 60
THREADS = 4
OPS_PER_THREAD = 30
POOLS: dict[str | None, DisruptionPolicy | None] = {
    "alpha": DisruptionPolicy(budgets=[Budget(max=3)]),
    "beta": DisruptionPolicy(budgets=[Budget(max="50%", reasons=[DisruptionReason.ROLLOUT]), Budget(max=2)]),
    None: None,  # the stage default bounds these
}
TEMPLATES = ("lab", "gpu")
REGION = "us-east-1"
SCALE_DOWN = Ask(DisruptionReason.SCALE_DOWN, "scale-down")
EXPIRY = Ask(DisruptionReason.EXPIRED, "expiry", ahead=True)


@dataclass
class Fleet:
    """One example's fleet and what its threads share: the workers made so far and the rollouts."""

    ctx: Context
    make: WorkerFactory
    workers: list[str] = field(default_factory=list)
    rollouts: list[str] = field(default_factory=list)
    done: Counter[str] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_worker(self, rng: random.Random) -> str:
        pool = rng.choice(list(POOLS))
        worker = self.make(pool=pool, template=rng.choice(TEMPLATES))
        with self.lock:
            self.workers.append(worker.id)
        return worker.id

    def any_worker(self, rng: random.Random) -> Worker:
        with self.lock:
            worker_id = rng.choice(self.workers)
        return self.ctx.store.get_worker(worker_id)

    def step_of(self, rng: random.Random) -> Step:
        with self.lock:
            rollout_id = rng.choice(self.rollouts)
        return Step(self.ctx, self.ctx.rollouts.get(rollout_id), utcnow(), admission.Door(self.ctx))


def stop(ctx: Context, reason: str) -> admission.Start:
    """Scale-down's stop of an empty worker: RUNNING -> STOPPING, written with the door's owner and claim."""

    def write(current: Worker, owner: Owner, claim: Claim | None) -> Worker:
        return ctx.store.transition_worker(
            current,
            WorkerStatus.STOPPING,
            cause=Cause.CONTROL,
            actor="scale-down",
            reason=reason,
            changes={"owner": owner},
            claim=claim,
        )

    return write


def ec2_says(fleet: Fleet, worker: Worker, state: str) -> None:
    ec2_events.apply_state_change(
        fleet.ctx, instance_id=worker.ec2_instance_id or "", state=state, at=utcnow(), region=REGION
    )


# Each operation takes the fleet, the thread's random and a worker read a moment ago (it may have moved
# since: the services read it again), and does what an actor would do with it.
def scale_down_stop(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    with admission.door(fleet.ctx) as door:
        door.admit(worker.id, SCALE_DOWN, stop(fleet.ctx, "idle"), action="stop")


def scale_down_drain(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    with admission.door(fleet.ctx) as door:
        drains.open_drain(fleet.ctx, door, worker.id, SCALE_DOWN, actor="scale-down", reason="idle")


def rollout_ahead(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    fleet.step_of(rng).admit_ahead(worker)


def rollout_drain(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    fleet.step_of(rng).drain(worker)


def rollout_claims(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    step = fleet.step_of(rng)
    step.claim_ahead(stop=step.rollout.total)


def rollout_release(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    fleet.step_of(rng).release(worker)


def expiry_lease(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    # Half of the leases are taken as if twenty minutes ago: they have lapsed already.
    then = utcnow() - timedelta(minutes=20) if rng.random() < 0.5 else None
    with admission.door(fleet.ctx, then) as door:
        admission.hold_ahead(fleet.ctx, door, worker.id, EXPIRY)


def expiry_release(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    admission.Door(fleet.ctx).release(worker, EXPIRY)


def operator_drain(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    drains.start_worker_drain(fleet.ctx, worker.id, actor="operator", reason="patch")


def cancel(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    drains.cancel_worker_drain(fleet.ctx, worker.id, actor="operator")


def spot_warning(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    ec2_events.apply_spot_warning(
        fleet.ctx,
        instance_id=worker.ec2_instance_id or "",
        instance_action="terminate",
        at=utcnow(),
        region=REGION,
    )


def ec2_stopping(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    ec2_says(fleet, worker, "stopping")


def ec2_stopped(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    ec2_says(fleet, worker, "stopped")


def ec2_terminated(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    ec2_says(fleet, worker, "terminated")


def settle(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    with fleet.lock:
        ids = list(fleet.workers)
    admission.settle_owners(fleet.ctx, fleet.ctx.store.get_workers(ids), Counter())


def end_rollout(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    with fleet.lock:
        if len(fleet.rollouts) < 2:
            return
        ended = fleet.rollouts.pop(rng.randrange(len(fleet.rollouts)))
    rollouts.cancel(fleet.ctx, ended, actor="operator")


def new_worker(fleet: Fleet, rng: random.Random, worker: Worker) -> None:
    fleet.new_worker(rng)


Operation = Callable[[Fleet, random.Random, Worker], None]
OPERATIONS: list[tuple[Operation, int]] = [
    (scale_down_stop, 4),
    (scale_down_drain, 4),
    (rollout_ahead, 4),
    (rollout_drain, 3),
    (rollout_claims, 1),
    (rollout_release, 2),
    (expiry_lease, 4),
    (expiry_release, 2),
    (operator_drain, 2),
    (cancel, 4),
    (spot_warning, 2),
    (ec2_stopping, 1),
    (ec2_stopped, 3),
    (ec2_terminated, 2),
    (settle, 2),
    (end_rollout, 1),
    (new_worker, 2),
]


def run(fleet: Fleet, seed: int) -> None:
    rng = random.Random(seed)
    operations, weights = zip(*OPERATIONS, strict=True)
    for _ in range(OPS_PER_THREAD):
        operation = rng.choices(operations, weights)[0]
        worker = fleet.any_worker(rng)
        try:
            operation(fleet, rng, worker)
        except StaleWrite:
            fleet.done["stale"] += 1  # lost to the other threads more often than retries allow
        except FleetkeeperError as refused:  # an actor's refusal (409, not found): the mix goes on
            fleet.done[f"refused:{type(refused).__name__}"] += 1
        else:
            fleet.done[operation.__name__] += 1


def stored_rollout(ctx: Context, rollout_id: str, worker_ids: list[str]) -> Rollout:
    now = utcnow()
    return ctx.rollouts.start(
        Rollout(
            id=rollout_id,
            total=len(worker_ids),
            max_unavailable=len(worker_ids),
            max_unavailable_requested=len(worker_ids),
            strategy=RolloutStrategy.SURGE,
            started_by="test",
            created_at=now,
            updated_at=now,
        ),
        sorted(worker_ids),
        actor="test",
    )


@pytest.mark.parametrize("seed", range(EXAMPLES))
def test_given_a_random_mix_of_admissions_releases_and_ends_from_threads_then_the_counts_are_exact(
    make_ctx: Callable[..., Context],
    store: FleetStore,
    running_worker: WorkerFactory,
    drains_started: list[dict[str, Any]],
    seed: int,
) -> None:
    for pool, policy in POOLS.items():
        if pool is not None:
            catalog.put_pool(store, pool, actor="test", disruption=policy)
    fleet = Fleet(make_ctx(MAX_CONCURRENT_DRAINS="3"), running_worker)
    rng = random.Random(seed)
    for _ in range(18):
        fleet.new_worker(rng)
    for n in range(3):
        scope = rng.sample(fleet.workers, 6)
        fleet.rollouts.append(stored_rollout(fleet.ctx, f"ro-{seed}-{n}", scope).id)

    with ThreadPoolExecutor(max_workers=THREADS) as threads:
        list(threads.map(lambda n: run(fleet, seed * 100 + n), range(THREADS)))

    final = store.get_workers(fleet.workers)
    assert len(final) == len(fleet.workers)
    owned = Counter((w.pool, w.template) for w in final if counted(w.owner))
    for pool in POOLS:
        counts = read_counts(client("dynamodb"), fleet.ctx.settings.table_name, pool)
        expected = {template: n for (p, template), n in owned.items() if p == pool}
        assert (counts.in_use, counts.by_template) == (sum(expected.values()), expected), (pool, fleet.done)
        assert counts.fleet == sum(owned.values()), fleet.done
    # The mix did what it is about: owners were admitted and ended, and some hold at the end.
    assert fleet.done["ec2_stopped"] + fleet.done["ec2_terminated"] + fleet.done["cancel"] > 0, fleet.done
    assert sum(owned.values()) > 0, fleet.done
