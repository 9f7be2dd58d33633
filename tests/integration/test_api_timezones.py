"""Placement's timeslots: a naive time is a 422 naming the field; an aware one is stored in UTC."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.integration


def test_given_a_naive_timeslot_when_placing_then_422_names_the_field(control_plane, running_worker):
    worker = running_worker()

    status, body = control_plane.api(
        "POST",
        "/api/v1/instances",
        {
            "worker_id": worker.id,
            "timeslot_start": "2026-11-22T12:00:00",
            "timeslot_end": "2026-11-22T13:00:00Z",
        },
    )

    assert status == 422
    assert body["error"] == "VALIDATION_FAILED"
    assert {d["field"] for d in body["details"]} == {"body.timeslot_start"}


def test_given_an_aware_timeslot_in_another_zone_when_placing_then_it_is_stored_in_utc(
    control_plane, running_worker
):
    worker = running_worker()

    status, body = control_plane.api(
        "POST", "/api/v1/instances", {"worker_id": worker.id, "timeslot_start": "2026-11-22T13:00:00+01:00"}
    )

    assert status == 201, body
    assert body["timeslot_start"] in ("2026-11-22T12:00:00Z", "2026-11-22T12:00:00+00:00")
