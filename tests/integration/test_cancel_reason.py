"""A cancel's reason: accepted as an optional body, kept on the drain record and in the audit trail."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, utcnow
from fleetkeeper.services import catalog
from tests.integration.conftest import ControlPlane

pytestmark = pytest.mark.integration


def draining(control_plane: ControlPlane, worker: Any) -> None:
    """DRAINING with an open drain whose workflow has not stored its token yet (the cancel owns it)."""
    now = utcnow()
    record = DrainRecord(
        generation=1,
        started_at=now,
        deadline=now + timedelta(hours=1),
        timeout_seconds=3600,
        requested_by="op",
    )
    control_plane.ctx.store.transition_worker(
        worker, WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="op", changes={"drain": record}
    )


def test_given_a_reason_when_a_worker_drain_is_cancelled_then_the_record_and_the_audit_keep_it(
    control_plane: ControlPlane, running_worker: Any
) -> None:
    worker = running_worker()
    draining(control_plane, worker)
    path = f"/api/v1/workers/{worker.id}/cancel-drain"
    refused = [control_plane.api("POST", path, body) for body in ({"reason": "x" * 501}, {"reason": ""})]
    unknown = control_plane.api("POST", path, {"why": "no"})

    status, body = control_plane.api("POST", path, {"reason": "patch postponed"})

    for code, answer in refused:
        assert (code, answer["error"]) == (422, "VALIDATION_FAILED")
        assert {d["field"] for d in answer["details"]} == {"body.reason"}
    assert unknown[0] == 422
    assert {d["field"] for d in unknown[1]["details"]} == {"body.why"}
    assert status == 200, body
    assert (body["status"], body["drain"]["outcome"]) == ("RUNNING", "CANCELLED")
    assert body["drain"]["cancel_reason"] == "patch postponed"
    trail = control_plane.ctx.store.audit_trail("worker", worker.id)
    cancel = next(e for e in trail if e.action == "WorkerDrainCancelled")
    assert cancel.reason == "drain cancelled: patch postponed"


def test_given_a_reason_when_a_pool_drain_is_cancelled_then_the_pool_and_the_audit_keep_it(
    control_plane: ControlPlane,
) -> None:
    store = control_plane.ctx.store
    pool = catalog.ensure_pool(store, "reasons", actor="test")
    store.save_pool(
        pool,
        {"status": PoolStatus.DRAINING, "drain_generation": 1, "drain_outcome": DrainOutcome.RUNNING},
        actor="op",
        action="PoolDrainStarted",
    )

    status, body = control_plane.api("POST", "/api/v1/pools/reasons/cancel-drain", {"reason": "wrong pool"})

    assert status == 200, body
    assert (body["status"], body["drain_outcome"], body["drain_cancel_reason"]) == (
        "active",
        "CANCELLED",
        "wrong pool",
    )
    trail = store.audit_trail("pool", "reasons")
    assert str(next(e for e in trail if e.action == "PoolDrainCancelled").reason).endswith(": wrong pool")
