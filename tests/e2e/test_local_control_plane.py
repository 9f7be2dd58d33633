"""`make run`'s control plane as a subprocess, driven over HTTP like an operator would."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
import requests

from fleetkeeper_local.stack import free_port
from tests.e2e.conftest import ROOT, control_plane_environment

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


def test_given_the_seeded_fleet_then_a_started_instance_holds_its_workers_drain_until_it_is_cancelled(
    control_plane_url,
):
    api = control_plane_url
    query = f"{api}/api/v1/instances?state=RUNNING&limit=100"
    seeded = [i for i in requests.get(query, timeout=10).json()["items"] if i["pool"] in ("labs", "batch")]
    workers = {
        i["worker_id"]: requests.get(f"{api}/api/v1/workers/{i['worker_id']}", timeout=10).json()
        for i in seeded
    }
    worker_id = next(w for w, body in workers.items() if body["status"] == "RUNNING")

    drained = requests.post(f"{api}/api/v1/workers/{worker_id}/drain", json={"reason": "tour"}, timeout=10)
    assert drained.status_code == 202, drained.text
    time.sleep(2)  # the workflow's first steps ran: the drain still waits for the started instance
    status = requests.get(f"{api}/api/v1/workers/{worker_id}/drain", timeout=10).json()
    assert (status["status"], status["worker_status"]) == ("RUNNING", "DRAINING")
    cancelled = requests.post(f"{api}/api/v1/workers/{worker_id}/cancel-drain", timeout=10)

    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "RUNNING"


def test_given_the_api_then_bad_input_never_gets_a_500(control_plane_url):
    api = control_plane_url
    assert requests.post(f"{api}/api/v1/workers", data="{oops", headers=JSON, timeout=10).status_code == 400
    assert requests.post(f"{api}/api/v1/workers", json={"template": 7}, timeout=10).status_code == 422
    assert requests.get(f"{api}/api/v1/workers/w-missing", timeout=10).status_code == 404
    assert requests.get(f"{api}/openapi.json", timeout=10).json()["info"]["title"] == "fleetkeeper admin API"


def test_given_the_api_port_taken_after_the_pre_check_then_the_run_says_so_without_a_traceback_and_exits_2():
    api_port, dynamodb_port = free_port(), free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetkeeper_local", "run", "--no-seed"],
        cwd=ROOT,
        env=control_plane_environment(api_port, dynamodb_port),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def dynamodb_answers() -> bool:
        try:
            requests.get(f"http://127.0.0.1:{dynamodb_port}", timeout=1)
        except requests.ConnectionError:
            return process.poll() is not None
        return True

    # DynamoDB Local answers once the pre-checks passed; the API binds seconds later, after moto, the
    # table and the state machine: take its port in between.
    wait_until(dynamodb_answers, timeout=120)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", api_port))
        other.listen()
        out, err = process.communicate(timeout=120)

    assert process.returncode == 2, out + err
    assert "Traceback" not in out + err
    assert err.strip().splitlines()[-1] == (
        f"error: port {api_port} for the admin API is already taken; "
        "stop what uses it or set FLEETKEEPER_API_PORT to another port"
    )
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{dynamodb_port}", timeout=1)  # DynamoDB Local stopped too
