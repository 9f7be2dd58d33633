"""Rollouts on the local stack: the console tells each wave and status change, and `--workload` keeps
placing while a rollout replaces the workers, never on a DRAINING one."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.rollouts import replacement_id
from fleetkeeper.services.context import default_context
from fleetkeeper_local.console import FleetConsole
from fleetkeeper_local.workload import WorkloadSettings, WorkloadSimulator
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import LiveWorkerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_CYCLES = 60


def _pool(control_plane: Any, live_worker: LiveWorkerFactory, count: int) -> list[str]:
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 2}]}})
    assert status == 201
    return [live_worker(pool="labs").id for _ in range(count)]


def _until(
    control_plane: Any, rollout_id: str, done: Callable[[dict[str, Any]], bool], each: Callable[[], None]
) -> dict[str, Any]:
    view: dict[str, Any] = {}
    for _ in range(MAX_CYCLES):
        reconcile_fleet(control_plane.ctx)
        each()
        view = control_plane.api("GET", f"/api/v1/rollouts/{rollout_id}")[1]
        if done(view):
            return view
        time.sleep(0.2)
    raise AssertionError(f"rollout did not get there in {MAX_CYCLES} cycles: {view}")


def test_given_a_rollout_then_the_console_tells_its_start_each_wave_its_end_and_its_rollback(
    control_plane, live_worker, store
):
    _pool(control_plane, live_worker, 2)
    lines: list[str] = []
    console = FleetConsole(store, printer=lines.append, rollouts=control_plane.ctx.rollouts)
    console.poll_once()
    assert lines == []

    status, started = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {"template": "lab", "pool": "labs", "max_unavailable": 1, "strategy": "drain_first", "reason": "AMI"},
    )
    assert status == 202, started
    rollout_id = started["id"]
    _until(control_plane, rollout_id, lambda v: v["status"] != "RUNNING", console.poll_once)
    status, _ = control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback", {"reason": "errors"})
    assert status == 202
    console.poll_once()

    operator = started["started_by"]
    said = [line.split("  ", 1)[1] for line in lines]
    told = [line for line in said if line.startswith(f"rollout {rollout_id} ")]
    assert told == [
        f"rollout {rollout_id} started by {operator}: 2 worker(s) of template lab in 2 wave(s) (AMI)",
        f"rollout {rollout_id} wave 1/2 started: 1 worker(s)",
        f"rollout {rollout_id} wave 2/2 started: 1 worker(s)",
        f"rollout {rollout_id} succeeded (2/2 replaced)",
        f"rollout {rollout_id} rollback started by {operator}: errors (2/2 replaced)",
    ]
    # Nothing more to tell until it moves again.
    console.poll_once()
    assert len(lines) == len(said)


def test_given_the_workload_during_a_rollout_then_it_keeps_placing_and_never_on_a_draining_worker(
    control_plane, live_worker, store
):
    # Two waves of one: the placements go on while the first old worker drains and land on its
    # replacement while the second does.
    old = _pool(control_plane, live_worker, 2)
    clock = [0.0]
    simulator = WorkloadSimulator(
        default_context,
        WorkloadSettings(placements_per_minute=120, min_seconds=1, max_seconds=3, seed=7),
        clock=lambda: clock[0],
    )
    landed: list[tuple[str, WorkerStatus]] = []

    def place_some() -> None:
        for _ in range(4):
            clock[0] += 0.5
            known = set(simulator._due)  # the instances it placed or adopted so far
            placed = simulator.counts.placed
            simulator.step()
            if simulator.counts.placed == placed:
                continue
            for instance_id in set(simulator._due) - known:
                worker_id = store.get_instance(instance_id).worker_id
                landed.append((worker_id, store.get_worker(worker_id).status))

    status, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "max_unavailable": 1}
    )
    assert status == 202, started
    done = _until(control_plane, started["id"], lambda v: v["status"] != "RUNNING", place_some)
    during = len(landed)
    for _ in range(3):
        place_some()

    assert (done["status"], done["replaced"]) == ("SUCCEEDED", 2), done
    assert during >= 5, landed
    assert {status for _, status in landed} == {WorkerStatus.RUNNING}, landed
    new = {replacement_id(started["id"], w) for w in old}
    # The workers the rollout brought in take work as they come: the last placements land on them.
    assert {worker for worker, _ in landed[during:]} <= new, landed
    assert any(worker in new for worker, _ in landed[:during]), landed
