"""What a cancel means for the desired status: keep the worker running (docs/drains.md)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, Instance
from fleetkeeper.services import drains
from fleetkeeper.store.repository import FleetStore
from tests.integration.conftest import ControlPlane, eventually
from tests.integration.functions import reconcile_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.mark.parametrize("desired", [WorkerStatus.STOPPED, WorkerStatus.TERMINATED])
def test_given_a_drain_asked_by_a_desired_status_when_cancelled_then_the_next_cycle_keeps_the_worker_running(
    control_plane: ControlPlane, store: FleetStore, live_worker: Any, desired: WorkerStatus
) -> None:
    worker = live_worker()
    store.place_instance(Instance(id=f"i-busy-{desired.value}", worker_id=""), worker, actor="test")
    worker = store.get_worker(worker.id)
    store.update_worker(worker, {"desired_status": desired}, actor="test", action="DesiredStatusSet")
    assert reconcile_fleet(control_plane.ctx).counters["desired_status_drains"] == 1
    eventually(lambda: getattr(store.get_worker(worker.id).drain, "task_token", None))

    drains.cancel_worker_drain(control_plane.ctx, worker.id, actor="alice")
    report = reconcile_fleet(control_plane.ctx)

    after = store.get_worker(worker.id)
    assert after.status is WorkerStatus.RUNNING
    assert after.desired_status is None
    assert after.drain is not None
    assert (after.drain.generation, after.drain.outcome) == (1, DrainOutcome.CANCELLED)
    assert report.counters["desired_status_drains"] == 0
    cancel = next(e for e in store.audit_trail("worker", worker.id) if e.action == "WorkerDrainCancelled")
    assert (cancel.actor, cancel.reason) == ("alice", f"drain cancelled; desired status {desired} cleared")
