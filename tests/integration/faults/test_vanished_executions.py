"""A drain whose execution is gone (stopped behind our back, or never started) does not wait forever.

The reconcile cycle's watchdog must notice: the drain is restarted for the same generation (and then
completes), or it is closed with ERROR and the operators are alerted. Either way it never stays
RUNNING with no execution behind it, and no generation ever has two live executions.
"""

from __future__ import annotations

import json
from datetime import timedelta
from functools import partial
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, utcnow
from fleetkeeper.services.context import default_context
from fleetkeeper_local import faults
from tests.integration.conftest import ControlPlane, WorkerFactory, eventually
from tests.integration.faults.support import (
    alert_feed,
    complete,
    drain,
    drain_pool,
    place,
    reconcile,
    token_stored,
)
from tests.integration.functions import run_watchdog

pytestmark = [pytest.mark.integration, pytest.mark.slow]

LIVE = ("RUNNING", "SUCCEEDED")
# The watchdog acts within this many reconcile cycles once its grace period is over.
CYCLES = 3


def executions_for(plane: ControlPlane, *, key: str, value: str, generation: int) -> list[dict[str, Any]]:
    """Every execution of the drain state machine serving this worker (or pool) and generation."""
    sfn = boto3.client("stepfunctions")
    found: list[dict[str, Any]] = []
    for page in sfn.get_paginator("list_executions").paginate(
        stateMachineArn=plane.resources.state_machine_arn
    ):
        for summary in page["executions"]:
            described = sfn.describe_execution(executionArn=summary["executionArn"])
            payload = json.loads(described.get("input") or "{}")
            if payload.get(key) == value and payload.get("generation") == generation:
                found.append(dict(described))
    return found


def live_executions(plane: ControlPlane, *, key: str, value: str, generation: int) -> list[dict[str, Any]]:
    return [
        e for e in executions_for(plane, key=key, value=value, generation=generation) if e["status"] in LIVE
    ]


def stopping(plane: ControlPlane, worker_id: str) -> bool:
    return plane.ctx.store.get_worker(worker_id).status is WorkerStatus.STOPPING


def cycle_past_grace() -> None:
    """A reconcile cycle, then the watchdog as it will run once a just-written drain's start grace is over.

    The cycle runs the sweep and the watchdog with the wall clock; a drain written seconds ago is still
    in its start grace there, so the watchdog is also asked as of a later cycle.
    """
    reconcile()
    run_watchdog(default_context(), now=utcnow() + timedelta(minutes=10))


def worker_watchdog(plane: ControlPlane, worker_id: str, generation: int) -> str:
    """Run reconcile cycles until the drain is restarted or closed; returns which."""
    store = plane.ctx.store
    for _ in range(CYCLES):
        cycle_past_grace()
        record = store.get_worker(worker_id).drain
        assert record is not None
        assert record.generation == generation  # the watchdog never invents a new drain
        if record.outcome != DrainOutcome.RUNNING:
            return "closed"
        if live_executions(plane, key="worker_id", value=worker_id, generation=generation):
            return "restarted"
    raise AssertionError(f"drain of {worker_id} still RUNNING with no live execution after {CYCLES} cycles")


def assert_worker_converged(
    plane: ControlPlane, worker_id: str, generation: int, how: str, *, alerts: Any, instance_id: str | None
) -> None:
    store = plane.ctx.store
    if how == "restarted":
        live = live_executions(plane, key="worker_id", value=worker_id, generation=generation)
        assert len(live) == 1, live  # one generation, one live execution
        if instance_id is not None:
            complete(plane, instance_id)
        assert plane.wait_for_execution(live[0]["executionArn"], timeout=30)["status"] == "SUCCEEDED"
        final = store.get_worker(worker_id)
        assert final.status is WorkerStatus.STOPPING
        assert final.drain is not None
        assert (final.drain.generation, final.drain.outcome) == (generation, DrainOutcome.SUCCESS)
    else:
        final = store.get_worker(worker_id)
        assert final.drain is not None
        assert final.drain.outcome is DrainOutcome.ERROR
        assert final.drain.finished_at is not None
        assert any(worker_id in json.dumps(alert) for alert in alerts()), "closed without an alert"
        # Closed means out of the way: the operator can drain the worker again.
        status, body = plane.api("POST", f"/api/v1/workers/{worker_id}/drain", {})
        assert status == 202, body


def test_given_a_waiting_drain_whose_execution_is_stopped_behind_our_back_then_the_watchdog_recovers_it(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    alerts = alert_feed(control_plane)
    worker = ec2_worker()
    instance = place(control_plane, worker_id=worker.id)
    started = drain(control_plane, worker.id)
    eventually(lambda: token_stored(control_plane, worker.id))
    boto3.client("stepfunctions").stop_execution(
        executionArn=started["execution_arn"], cause="behind our back"
    )

    how = worker_watchdog(control_plane, worker.id, started["generation"])

    assert_worker_converged(
        control_plane, worker.id, started["generation"], how, alerts=alerts, instance_id=instance["id"]
    )


def test_given_a_drain_whose_execution_never_started_then_the_watchdog_recovers_it(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    alerts = alert_feed(control_plane)
    worker = ec2_worker()
    never = faults.sfn_execution_never_starts()
    plan = faults.FaultPlan(seed=21, faults=[never])
    with plan.installed(), pytest.raises(faults.InvocationCrashed):
        # The API invocation dies between recording the drain and StartExecution.
        control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {})
    stranded = control_plane.ctx.store.get_worker(worker.id)
    assert stranded.status is WorkerStatus.DRAINING
    assert stranded.drain is not None
    assert stranded.drain.outcome is DrainOutcome.RUNNING
    generation = stranded.drain.generation
    assert executions_for(control_plane, key="worker_id", value=worker.id, generation=generation) == []

    how = worker_watchdog(control_plane, worker.id, generation)

    assert never.injected == 1
    assert_worker_converged(control_plane, worker.id, generation, how, alerts=alerts, instance_id=None)


def test_given_pool_finish_dies_while_starting_worker_drains_then_no_worker_is_left_draining_forever(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    """The retry of pool_finish skips workers no longer RUNNING: the one it stranded must be recovered."""
    alerts = alert_feed(control_plane)
    members = [ec2_worker(pool="fleet") for _ in range(3)]
    # The Lambda dies on its way to starting the second worker drain (the pool's own is "pool-...").
    dies = faults.Fault(
        "stepfunctions",
        "Crashed",
        frozenset({"StartExecution"}),
        crash=True,
        skip=1,
        limit=1,
        when=lambda _op, params: str(params.get("name", "")).startswith("drain-"),
    )
    plan = faults.FaultPlan(seed=22, faults=[dies])
    with plan.installed():
        pool = drain_pool(control_plane, "fleet", then="stop")
        assert (
            control_plane.wait_for_execution(pool["drain_execution_arn"], timeout=30)["status"] == "SUCCEEDED"
        )
    assert dies.injected == 1
    assert control_plane.ctx.store.get_pool("fleet").status is PoolStatus.INACTIVE

    store = control_plane.ctx.store
    for member in members:
        record = store.get_worker(member.id).drain
        assert record is not None, f"{member.id} was never drained"
        if not live_executions(control_plane, key="worker_id", value=member.id, generation=record.generation):
            how = worker_watchdog(control_plane, member.id, record.generation)
            assert_worker_converged(
                control_plane, member.id, record.generation, how, alerts=alerts, instance_id=None
            )
        else:
            eventually(partial(stopping, control_plane, member.id), 30)


def test_given_a_pool_drain_whose_execution_is_stopped_behind_our_back_then_the_watchdog_recovers_it(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    alerts = alert_feed(control_plane)
    ec2_worker(pool="batch")
    instance = place(control_plane, pool="batch")
    started = drain_pool(control_plane, "batch")
    store = control_plane.ctx.store
    eventually(lambda: store.get_pool("batch").drain_task_token)
    boto3.client("stepfunctions").stop_execution(executionArn=started["drain_execution_arn"])
    generation = started["drain_generation"]

    how = None
    for _ in range(CYCLES):
        cycle_past_grace()
        pool = store.get_pool("batch")
        assert pool.drain_generation == generation
        if pool.drain_outcome is not DrainOutcome.RUNNING:
            how = "closed"
            break
        if live_executions(control_plane, key="pool", value="batch", generation=generation):
            how = "restarted"
            break
    assert how is not None, "pool drain still RUNNING with no live execution"

    if how == "restarted":
        complete(control_plane, instance["id"])
        eventually(lambda: store.get_pool("batch").status is PoolStatus.INACTIVE, 30)
        assert store.get_pool("batch").drain_outcome is DrainOutcome.SUCCESS
    else:
        assert store.get_pool("batch").drain_outcome is DrainOutcome.ERROR
        assert any("batch" in json.dumps(alert) for alert in alerts()), "closed without an alert"
        # A failed pool drain keeps the pool out of placement until an operator cancels it.
        status, body = control_plane.api("POST", "/api/v1/pools/batch/cancel-drain")
        assert status == 200, body
        assert store.get_pool("batch").status is PoolStatus.ACTIVE
