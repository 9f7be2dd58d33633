"""`make run`'s control plane as a subprocess, driven over HTTP like an operator would."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from fleetkeeper_local.stack import free_port

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).parents[2]
JSON = {"Content-Type": "application/json"}


@pytest.fixture(scope="module")
def control_plane_url() -> Iterator[str]:
    api_port = free_port()
    env = {
        **{
            k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TABLE_NAME", "DRAIN_", "MOTO_"))
        },
        "FLEETKEEPER_API_PORT": str(api_port),
        "FLEETKEEPER_DYNAMODB_PORT": str(free_port()),
        "FLEETKEEPER_MOTO_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetkeeper_local", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    output: list[str] = []
    try:
        deadline = time.monotonic() + 90
        assert process.stdout is not None
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                raise AssertionError("the control plane exited:\n" + "".join(output))
            output.append(line)
            if "Press Ctrl-C" in line:
                break
        else:
            raise AssertionError("the control plane did not come up:\n" + "".join(output))
        yield f"http://127.0.0.1:{api_port}"
    finally:
        process.send_signal(signal.SIGINT)
        try:
            remaining, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        assert process.returncode == 0, remaining
        assert "stopped" in remaining


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
    busy = next(w for w in workers if w["active_instances"] > 0)
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
