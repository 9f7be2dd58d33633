"""`make run`'s control plane as a subprocess, driven over HTTP like an operator would."""

from __future__ import annotations

import time

import pytest
import requests

pytestmark = [pytest.mark.slow]

JSON = {"Content-Type": "application/json"}


def wait_until(probe, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError("condition not met in time")


def test_given_the_seeded_fleet_when_a_busy_worker_is_drained_then_it_stops_after_its_work(control_plane_url):
    api = control_plane_url
    workers = requests.get(f"{api}/api/v1/workers", params={"status": "RUNNING"}, timeout=10).json()["items"]
    # The seeded pools only: other e2e tests bring workers of their own.
    busy = next(w for w in workers if w["active_instances"] > 0 and w["pool"] in ("labs", "batch"))
    response = requests.post(f"{api}/api/v1/workers/{busy['id']}/drain", json={"reason": "e2e"}, timeout=10)
    assert response.status_code == 202
    assert requests.post(f"{api}/api/v1/workers/{busy['id']}/drain", json={}, timeout=10).status_code == 409

    running = requests.get(f"{api}/api/v1/instances", params={"worker_id": busy["id"]}, timeout=10).json()[
        "items"
    ]
    for instance in running:
        done = requests.post(
            f"{api}/api/v1/instances/{instance['id']}/state", json={"state": "COMPLETED"}, timeout=10
        )
        assert done.status_code == 200

    def drained():
        body = requests.get(f"{api}/api/v1/workers/{busy['id']}/drain", timeout=10).json()
        return body if body["status"] == "SUCCESS" else None

    status = wait_until(drained)
    assert status["worker_status"] in ("STOPPING", "STOPPED")


def test_given_the_api_then_bad_input_never_gets_a_500(control_plane_url):
    api = control_plane_url
    assert requests.post(f"{api}/api/v1/workers", data="{oops", headers=JSON, timeout=10).status_code == 400
    assert requests.post(f"{api}/api/v1/workers", json={"template": 7}, timeout=10).status_code == 422
    assert requests.get(f"{api}/api/v1/workers/w-missing", timeout=10).status_code == 404
    assert requests.get(f"{api}/openapi.json", timeout=10).json()["info"]["title"] == "fleetkeeper admin API"
