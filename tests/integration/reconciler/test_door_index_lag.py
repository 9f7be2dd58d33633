"""The door for disruption stays exact while the worker indexes show stale images (fleetkeeper_local's
index lag, old images on): workers drained or stopped a moment ago still stand RUNNING in by_shard and
by_pool, so scale-down's cycle and a rollout both meet them as candidates. The door decides on each
worker read from the base table and on the pool's counts, never on the index: nothing goes beyond the
budget and nothing already leaving is drained again."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.admission import counted
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.rollouts import RolloutRequest, RolloutStrategy
from fleetkeeper.services import catalog, drains
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper.services.rollouts import commands as rollouts
from fleetkeeper.services.rollouts import engine
from fleetkeeper.store.disruption import read_counts
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POOL = "labs"
BUDGET = 4
SCALE_DOWN = {"SCALE_DOWN_ENABLED": "true", "IDLE_WINDOW_SECONDS": "1800", "SCALE_DOWN_COOLDOWN_SECONDS": "0"}
# Longer than the whole test on a loaded machine: every write it makes stays stale in the indexes.
LAG_SECONDS = 600.0


def test_given_indexes_showing_stale_running_workers_then_scale_down_and_a_rollout_stay_within_the_budget(
    make_ctx: Callable[..., Context],
    store: FleetStore,
    live_worker: Callable[..., Worker],
    drains_started: list[dict[str, Any]],
) -> None:
    catalog.put_pool(store, POOL, actor="test", disruption=DisruptionPolicy(budgets=[Budget(max=BUDGET)]))
    fleet = sorted((live_worker(pool=POOL) for _ in range(8)), key=lambda w: w.id)
    for worker in fleet:
        store.update_worker(
            worker, {"idle_since": utcnow() - timedelta(hours=1)}, actor="test", action="IdleSeeded"
        )
    operator_drained = [w.id for w in fleet[:2]]
    plan = faults.FaultPlan(seed=9, index_lag_seconds=LAG_SECONDS)

    with plan.installed():
        ctx = make_ctx(**SCALE_DOWN)
        for worker_id in operator_drained:
            drains.start_worker_drain(ctx, worker_id, actor="operator", reason="kernel patch")
        # The indexes still list them as RUNNING candidates.
        stale = {w.id for w in ctx.store.placement_candidates(template="lab", pool=POOL)}
        assert set(operator_drained) <= stale

        cycle = reconcile_fleet(ctx)
        stopped = [w.id for w in fleet if ctx.store.get_worker(w.id).status is WorkerStatus.STOPPING]

        rollout = rollouts.start(
            ctx,
            RolloutRequest(
                template="lab", pool=POOL, max_unavailable=len(fleet), strategy=RolloutStrategy.DRAIN_FIRST
            ),
            actor="test",
        )
        stepped = engine.step(ctx, rollout, utcnow())

    # Scale-down took exactly the room the operator's drains left; the rest waited on the budget.
    assert (len(stopped), cycle.counters["scale_down_stop_count"]) == (BUDGET - 2, BUDGET - 2)
    assert cycle.counters["scale_down_refused_pool_budget"] == len(fleet) - BUDGET
    # The rollout's scope came from by_pool, stale: it lists every worker as RUNNING, the four leaving too.
    assert rollout.total == len(fleet)
    assert plan.old_images_by_lag >= BUDGET
    # The budget is full: the rollout drains nothing and says why; the operator's drains stay theirs.
    assert stepped.blocked is not None
    assert stepped.blocked.reason == "budget"
    assert sorted(d["worker_id"] for d in drains_started) == operator_drained
    final = {w.id: store.get_worker(w.id) for w in fleet}
    for worker_id in operator_drained:
        drained = final[worker_id]
        assert drained.status is WorkerStatus.DRAINING
        assert drained.drain is not None
        assert (drained.drain.generation, drained.drain.requested_by) == (1, "operator")
    assert Counter(w.status for w in final.values()) == {
        WorkerStatus.DRAINING: 2,
        WorkerStatus.STOPPING: BUDGET - 2,
        WorkerStatus.RUNNING: len(fleet) - BUDGET,
    }
    counts = read_counts(client("dynamodb"), ctx.settings.table_name, POOL)
    assert counts.in_use == counts.fleet == sum(1 for w in final.values() if counted(w.owner)) == BUDGET


def test_given_indexes_showing_drained_workers_as_running_then_a_rollout_step_drains_only_the_room_left(
    make_ctx: Callable[..., Context],
    store: FleetStore,
    live_worker: Callable[..., Worker],
    drains_started: list[dict[str, Any]],
) -> None:
    catalog.put_pool(store, POOL, actor="test", disruption=DisruptionPolicy(budgets=[Budget(max=BUDGET)]))
    fleet = sorted((live_worker(pool=POOL) for _ in range(8)), key=lambda w: w.id)
    operator_drained = [w.id for w in fleet[:2]]
    plan = faults.FaultPlan(seed=10, index_lag_seconds=LAG_SECONDS)

    with plan.installed():
        ctx = make_ctx()
        for worker_id in operator_drained:
            drains.start_worker_drain(ctx, worker_id, actor="operator", reason="kernel patch")
        rollout = rollouts.start(
            ctx,
            RolloutRequest(
                template="lab", pool=POOL, max_unavailable=len(fleet), strategy=RolloutStrategy.DRAIN_FIRST
            ),
            actor="test",
        )
        engine.step(ctx, rollout, utcnow())

    # The rollout's scope came from the stale by_pool: every worker, the operator's two as RUNNING.
    assert rollout.total == len(fleet)
    assert plan.old_images_by_lag >= 2
    # The step drained the two the budget had room for, none of the operator's, each once.
    by_rollout = [d["worker_id"] for d in drains_started if d["worker_id"] not in operator_drained]
    assert len(by_rollout) == len(set(by_rollout)) == BUDGET - 2
    assert len(drains_started) == BUDGET
    final = {w.id: store.get_worker(w.id) for w in fleet}
    for worker_id in operator_drained:
        drained = final[worker_id]
        assert drained.drain is not None
        assert (drained.status, drained.drain.generation, drained.drain.requested_by) == (
            WorkerStatus.DRAINING,
            1,
            "operator",
        )
    assert Counter(w.status for w in final.values()) == {
        WorkerStatus.DRAINING: BUDGET,
        WorkerStatus.RUNNING: len(fleet) - BUDGET,
    }
    counts = read_counts(client("dynamodb"), ctx.settings.table_name, POOL)
    assert counts.in_use == sum(1 for w in final.values() if counted(w.owner)) == BUDGET
