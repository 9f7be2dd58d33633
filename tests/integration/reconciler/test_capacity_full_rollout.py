"""A rollout in a pool at its max_workers: no room to surge, so each worker is replaced drain-first, and
the rollout finishes without the pool ever holding more than max_workers."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from tests.integration.functions import reconcile_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_CYCLES = 80


def test_given_a_surge_rollout_in_a_pool_at_max_workers_then_it_replaces_drain_first_and_finishes(
    control_plane: Any, live_worker: Any
) -> None:
    old = [live_worker(pool="labs").id for _ in range(2)]
    capacity = {"template": "lab", "min_workers": 2, "max_workers": 2}
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"capacity": capacity})
    assert status == 200
    _, started = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs"})
    assert started["strategy"] == "surge"
    ctx = control_plane.ctx
    members: list[int] = []
    view: dict[str, Any] = {}
    for _ in range(MAX_CYCLES):
        report = reconcile_fleet(ctx)
        members.append(ctx.capacity.members("labs"))
        _, view = control_plane.api("GET", f"/api/v1/rollouts/{started['id']}")
        if view["status"] != "RUNNING":
            break
        time.sleep(0.2)

    assert (view["status"], view["replaced"]) == ("SUCCEEDED", 2), view
    assert max(members) == 2
    assert report.counters["capacity_refused_at_cap"] == 0
    assert set(ctx.store.worker_statuses(old).values()) == {WorkerStatus.TERMINATED}
    # The places the old workers left are refilled (by the rollout or the pool's scale-out, whichever
    # comes first in a cycle) with new workers that come up.
    for _ in range(10):
        live = [w for w in ctx.store.workers_in_pool("labs") if w.id not in old]
        if all(w.status == WorkerStatus.RUNNING for w in live):
            break
        reconcile_fleet(ctx)
        time.sleep(0.2)
    assert [str(w.status) for w in live] == ["RUNNING", "RUNNING"]
    assert ctx.capacity.members("labs") == 2
