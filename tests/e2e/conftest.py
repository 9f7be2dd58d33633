"""One local control plane (`python -m fleetkeeper_local run`) for the e2e tests, on free ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.stack import free_port

ROOT = Path(__file__).parents[2]
# Short local schedules, and machines that boot at once: a new worker is launched and seen running
# within a few seconds.
FAST_SCHEDULES = {
    "FLEETKEEPER_LOCAL_RECONCILE_SECONDS": "1",
    "FLEETKEEPER_LOCAL_EVENT_PUMP_SECONDS": "0.5",
    "FLEETKEEPER_LOCAL_LAUNCH_SECONDS": "0",
    "FLEETKEEPER_LOCAL_START_SECONDS": "0",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep the e2e tests on one xdist worker, so the session starts one control plane."""
    if not items or not items[0].config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.xdist_group("e2e-control-plane"))


def control_plane_environment(api_port: int, dynamodb_port: int) -> dict[str, str]:
    """This process's environment without its AWS settings, with the local stack on these ports."""
    return {
        **{
            k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TABLE_NAME", "DRAIN_", "MOTO_"))
        },
        "FLEETKEEPER_API_PORT": str(api_port),
        "FLEETKEEPER_DYNAMODB_PORT": str(dynamodb_port),
        "FLEETKEEPER_MOTO_PORT": str(free_port()),
        "PYTHONUNBUFFERED": "1",
        **FAST_SCHEDULES,
    }


# Package scope: the control plane reconciles every second, so it stops as soon as the e2e tests are done
# rather than taking CPU from the rest of the session.
@pytest.fixture(scope="package")
def control_plane_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    api_port = free_port()
    # The control plane evaluates its functions' requests and writes its record here when it stops.
    record = tmp_path_factory.mktemp("iam") / "record.json"
    env = {**control_plane_environment(api_port, free_port()), iam_session.RECORD_ENVIRONMENT: str(record)}
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
            # A stop lets the cycle in flight finish and evaluates the run's IAM record: seconds when the
            # machine is idle, far longer when the other test process keeps both cores busy.
            remaining, _ = process.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        assert process.returncode == 0, remaining
        assert "stopped" in remaining
        iam_session.merge_records(record)
