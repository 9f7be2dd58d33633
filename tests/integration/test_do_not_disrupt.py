"""A time-limited do-not-disrupt through the API: a timestamp or a duration, aware times only."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from fleetkeeper.domain.models import utcnow
from tests.integration.conftest import ControlPlane

pytestmark = pytest.mark.integration


def test_given_a_duration_or_an_aware_timestamp_then_the_worker_is_protected_until_then_and_null_lifts_it(
    control_plane: ControlPlane, running_worker: Any
) -> None:
    worker = running_worker()
    path = f"/api/v1/workers/{worker.id}/do-not-disrupt"

    bad: list[object] = [
        "2030-01-01T10:00:00",
        "soon",
        "2h30",
        1893456000,
        "2020-01-01T00:00:00Z",
        "400d",
        "0s",
    ]
    refused = [control_plane.api("PUT", path, {"do_not_disrupt_until": value}) for value in bad]
    missing = control_plane.api("PUT", path, {})
    for (code, answer), value in zip([*refused, missing], [*bad, "(missing)"], strict=True):
        assert (code, answer["error"]) == (422, "VALIDATION_FAILED"), value
        assert {d["field"] for d in answer["details"]} == {"body.do_not_disrupt_until"}, value

    before = utcnow()
    tomorrow = (before + timedelta(days=1)).replace(microsecond=0)
    in_paris = tomorrow.astimezone(timezone(timedelta(hours=1))).isoformat()
    status, by_duration = control_plane.api("PUT", path, {"do_not_disrupt_until": "2h"})
    _, by_timestamp = control_plane.api("PUT", path, {"do_not_disrupt_until": in_paris})
    _, lifted = control_plane.api("PUT", path, {"do_not_disrupt_until": None})

    assert status == 200, by_duration
    until = datetime.fromisoformat(by_duration["do_not_disrupt_until"].replace("Z", "+00:00"))
    assert before + timedelta(hours=2) <= until <= utcnow() + timedelta(hours=2)
    stored = by_timestamp["do_not_disrupt_until"]
    assert stored.endswith(("Z", "+00:00"))
    assert datetime.fromisoformat(stored.replace("Z", "+00:00")) == tomorrow
    assert lifted["do_not_disrupt_until"] is None
    trail = control_plane.ctx.store.audit_trail("worker", worker.id)
    assert [e.action for e in trail].count("WorkerDoNotDisruptSet") == 3
