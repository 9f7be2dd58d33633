"""A cancel's reason: accepted as an optional body, kept on the drain record and in the audit trail."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.domain.models import Instance
from tests.integration.conftest import ControlPlane

pytestmark = pytest.mark.integration


def test_given_a_reason_when_a_worker_drain_is_cancelled_then_the_record_and_the_audit_keep_it(
    control_plane: ControlPlane, running_worker: Any
) -> None:
    worker = running_worker()
    store = control_plane.ctx.store
    store.place_instance(Instance(id="i-reason", worker_id=""), worker, actor="test")
    status, _ = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {})
    assert status == 202

    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/cancel-drain", {"reason": "patch postponed"}
    )

    assert status == 200, body
    assert (body["status"], body["drain"]["cancel_reason"]) == ("RUNNING", "patch postponed")
    cancel = next(e for e in store.audit_trail("worker", worker.id) if e.action == "WorkerDrainCancelled")
    assert cancel.reason == "drain cancelled: patch postponed"


def test_given_a_reason_when_a_pool_drain_is_cancelled_then_the_pool_and_the_audit_keep_it(
    control_plane: ControlPlane, running_worker: Any
) -> None:
    worker = running_worker(pool="reasons")
    control_plane.ctx.store.place_instance(Instance(id="i-pool-reason", worker_id=""), worker, actor="test")
    assert control_plane.api("POST", "/api/v1/pools/reasons/drain", {})[0] == 202

    status, body = control_plane.api("POST", "/api/v1/pools/reasons/cancel-drain", {"reason": "wrong pool"})

    assert status == 200, body
    assert (body["status"], body["drain_cancel_reason"]) == ("active", "wrong pool")
    trail = control_plane.ctx.store.audit_trail("pool", "reasons")
    assert str(next(e for e in trail if e.action == "PoolDrainCancelled").reason).endswith(": wrong pool")


def test_given_a_bad_cancel_body_then_422_names_the_field(
    control_plane: ControlPlane, running_worker: Any
) -> None:
    worker = running_worker()
    path = f"/api/v1/workers/{worker.id}/cancel-drain"

    answers = [control_plane.api("POST", path, body) for body in ({"reason": "x" * 501}, {"reason": ""})]
    unknown = control_plane.api("POST", path, {"why": "no"})

    for status, answer in answers:
        assert (status, answer["error"]) == (422, "VALIDATION_FAILED")
        assert {d["field"] for d in answer["details"]} == {"body.reason"}
    assert unknown[0] == 422
    assert {d["field"] for d in unknown[1]["details"]} == {"body.why"}
