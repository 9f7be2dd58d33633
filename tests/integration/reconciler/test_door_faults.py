"""The door for disruption where AWS answers what the emulators never do: a drain workflow that will not
start after the door admitted its worker, and the admitting transaction cancelled for a concurrent one,
throttled, or committed with its answer lost. Faults are injected into the real clients (botocore
hooks, fleetkeeper_local.faults); the context is built inside the plan's block so its clients carry it."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.admission import Ask, Held, WaitReason
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.errors import DisruptionHeld, WorkflowUnavailable
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, Worker
from fleetkeeper.services import admission, catalog, drains
from fleetkeeper.services.context import Context
from fleetkeeper.store.disruption import DisruptionCounts, read_counts
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.conftest import ControlPlane, WorkerFactory
from tests.integration.faults.support import place

pytestmark = pytest.mark.integration

POOL = "labs"
SCALE_DOWN = Ask(DisruptionReason.SCALE_DOWN, "scale-down")


def budget_of(store: FleetStore, most: int) -> None:
    catalog.put_pool(store, POOL, actor="test", disruption=DisruptionPolicy(budgets=[Budget(max=most)]))


def counts(ctx: Context) -> DisruptionCounts:
    return read_counts(client("dynamodb"), ctx.settings.table_name, POOL)


def counted_owners(store: FleetStore, workers: list[Worker]) -> int:
    return sum(
        1 for w in store.get_workers([w.id for w in workers]) if w.owner is not None and w.owner.counted
    )


def start_execution_refused() -> faults.Fault:
    """Step Functions answers every StartExecution with a 503 (with_backoff tries it five times)."""
    return faults.Fault("stepfunctions", "ServiceUnavailable", frozenset({"StartExecution"}), status=503)


def test_given_the_workflow_refuses_to_start_after_admission_then_no_trace_is_left_and_the_next_goes_at_once(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, store: FleetStore
) -> None:
    first, second = ec2_worker(pool=POOL), ec2_worker(pool=POOL)
    budget_of(store, 1)
    place(control_plane, worker_id=first.id)
    refused = start_execution_refused()

    with faults.FaultPlan(seed=3, faults=[refused]).installed(), pytest.raises(WorkflowUnavailable):
        drains.start_worker_drain(control_plane.ctx, first.id, actor="scale-down", ask=SCALE_DOWN)

    assert refused.injected == 5  # with_backoff's attempts, then the door's admission is undone
    ctx = control_plane.ctx
    undone = store.get_worker(first.id)
    assert (undone.status, undone.owner) == (WorkerStatus.RUNNING, None)
    assert undone.drain is not None
    assert undone.drain.outcome is DrainOutcome.ERROR
    assert (counts(ctx).in_use, counts(ctx).fleet) == (0, 0)

    # The very next admission goes through: nothing of the failed one holds the worker or the budget.
    again = drains.start_worker_drain(ctx, first.id, actor="scale-down", ask=SCALE_DOWN)

    assert (again.status, again.worker_status, again.generation) == ("RUNNING", WorkerStatus.DRAINING, 2)
    assert (counts(ctx).in_use, counts(ctx).fleet) == (1, 1)
    owner = store.get_worker(first.id).owner
    assert owner is not None
    assert (owner.reason, owner.counted) == (str(DisruptionReason.SCALE_DOWN), True)
    # ...and the budget of one is taken by it alone.
    with pytest.raises(DisruptionHeld) as held:
        drains.start_worker_drain(ctx, second.id, actor="scale-down", ask=SCALE_DOWN)
    assert held.value.why == str(WaitReason.BUDGET)
    assert store.get_worker(second.id).status is WorkerStatus.RUNNING


def admitting(pool: str) -> Callable[[str, dict[str, Any]], bool]:
    """A transaction that admits a disruption in `pool`: its count's update carries the door's claim."""

    def matches(operation: str, params: dict[str, Any]) -> bool:
        return operation == "TransactWriteItems" and any(
            "ConditionExpression" in entry.get("Update", {})
            and entry["Update"]["Key"]["PK"]["S"] == f"DISRUPTING#{pool}"
            for entry in params.get("TransactItems", [])
        )

    return matches


@pytest.mark.parametrize("how", ["drain", "ahead"])
def test_given_conflicts_throttling_and_lost_answers_on_admitting_writes_then_the_budget_is_taken_exactly(
    make_ctx: Callable[..., Context],
    store: FleetStore,
    running_worker: WorkerFactory,
    drains_started: list[dict[str, Any]],
    how: str,
) -> None:
    """Six deciders ask at once for six workers of a pool whose budget allows three. The first admitting
    attempts are cancelled for a concurrent transaction (twice) and throttled (once), and one commits with
    its answer lost: four faults, within with_backoff's five attempts whichever transactions they hit, so
    exactly three are admitted, each once."""
    pool_workers = [running_worker(pool=POOL) for _ in range(6)]
    budget_of(store, 3)
    when = admitting(POOL)
    injected = [
        faults.dynamodb_conflicts(1.0, limit=2, when=when),
        faults.dynamodb_throttling(1.0, operations=frozenset({"TransactWriteItems"}), limit=1, when=when),
        faults.dynamodb_lost_answers(1.0, limit=1, when=when),
    ]

    with faults.FaultPlan(seed=5, faults=injected).installed():
        ctx = make_ctx()

        def ask(worker: Worker) -> Worker | Held:
            with admission.door(ctx) as door:
                if how == "ahead":
                    return admission.hold_ahead(
                        ctx, door, worker.id, Ask(DisruptionReason.EXPIRED, "expiry", ahead=True)
                    )
                return drains.open_drain(ctx, door, worker.id, SCALE_DOWN, actor="scale-down")

        with ThreadPoolExecutor(max_workers=len(pool_workers)) as threads:
            answers = list(threads.map(ask, pool_workers))

    assert [f.injected for f in injected] == [2, 1, 1]
    admitted = [a for a in answers if not isinstance(a, Held)]
    held = [a for a in answers if isinstance(a, Held)]
    assert (len(admitted), {h.why for h in held}) == (3, {WaitReason.BUDGET})
    assert (counts(ctx).in_use, counts(ctx).fleet) == (3, 3)
    assert counted_owners(store, pool_workers) == 3
    trail = {w.id: [e.action for e in store.audit_trail("worker", w.id)] for w in pool_workers}
    action = "WorkerDrainStarted" if how == "drain" else "WorkerDisruptionAdmitted"
    assert sorted(actions.count(action) for actions in trail.values()) == [0, 0, 0, 1, 1, 1]
    if how == "drain":
        assert sorted(d["worker_id"] for d in drains_started) == sorted(w.id for w in admitted)
        assert {store.get_worker(w.id).status for w in admitted} == {WorkerStatus.DRAINING}
