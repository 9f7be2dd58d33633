"""The `fleetkeeper` CLI against the local control plane, as an operator would use it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests
from typer.testing import CliRunner

from fleetkeeper_cli import output as cli_output
from fleetkeeper_cli.app import app

pytestmark = [pytest.mark.slow]

ROOT = Path(__file__).parents[2]
RUN = uuid.uuid4().hex[:6]
TEMPLATE = f"e2e-lab-{RUN}"
POOL = f"e2e-{RUN}"
DRAIN_POOL = f"e2e-drain-{RUN}"
ROLLOUT_POOL = f"e2e-rollout-{RUN}"
FLEET_FILE = f"""
templates:
  - name: {TEMPLATE}
    instance_type: m5.large
    ami_name_filter: fleet-lab-*
    capacity: 3
    drain_timeout_hours: 1
pools:
  - name: {POOL}
    description: e2e workers
  - name: {DRAIN_POOL}
    description: drained whole
"""


def wait_until(probe: Callable[[], Any], timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.3)
    raise AssertionError(f"condition not met in time (last: {last!r})")


class Cli:
    def __init__(self, api: str) -> None:
        self.api = api
        self.runner = CliRunner()
        # Wide enough that no table cell wraps the text a test looks for, whatever terminal (or none)
        # the test run has: rich sizes a console without a terminal from its environment.
        cli_output.console.width = 200

    def __call__(self, *args: str) -> tuple[int, str]:
        # Wide enough that no table cell wraps the text a test looks for.
        result = self.runner.invoke(app, ["--api", self.api, *args], env={"COLUMNS": "200"})
        return result.exit_code, result.output

    def json(self, *args: str) -> Any:
        code, output = self(*args, "--output", "json")
        assert code == 0, output
        return json.loads(output)

    def background(self, *args: str) -> subprocess.Popen[str]:
        """A command in its own process (it runs while this test drives the API)."""
        command = [sys.executable, "-m", "fleetkeeper_cli", "--api", self.api, *args]
        return subprocess.Popen(  # noqa: S603 - our own module, arguments from the test
            command,
            cwd=ROOT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )


@pytest.fixture(scope="module")
def cli(control_plane_url: str, tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """The CLI, after `apply` declared this module's template and pools."""
    runner = Cli(control_plane_url)
    fleet = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
    fleet.write_text(FLEET_FILE)
    code, output = runner("apply", "-f", str(fleet))
    assert code == 0, output
    assert f"+ template {TEMPLATE}: create" in output
    assert "applied 3 change(s)" in output
    return runner


def new_worker(cli: Cli, pool: str = POOL, instances: int = 0) -> str:
    """A RUNNING worker of the e2e template (launched by the reconciler) with `instances` placed."""
    response = requests.post(
        f"{cli.api}/api/v1/workers", json={"template": TEMPLATE, "pool": pool}, timeout=10
    )
    assert response.status_code == 201, response.text
    worker_id = str(response.json()["id"])
    wait_until(lambda: cli.json("worker", "show", worker_id)["status"] == "RUNNING")
    for _ in range(instances):
        placed = cli.json("place", "--worker", worker_id)
        assert placed["worker_id"] == worker_id
    return worker_id


def active_instances(cli: Cli, worker_id: str) -> list[str]:
    return [
        i["id"]
        for i in cli.json("instances", "--worker", worker_id)
        if i["state"] in ("SCHEDULED", "RUNNING")
    ]


def test_given_an_applied_fleet_file_when_applied_again_then_nothing_changes(cli, tmp_path):
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET_FILE)

    plan = cli.json("apply", "-f", str(fleet))

    assert plan["applied"] is False
    assert {c["action"] for c in plan["changes"]} == {"unchanged"}
    code, output = cli("apply", "-f", str(fleet))
    assert (code, "nothing to change" in output) == (0, True)


def test_given_a_busy_worker_when_drained_with_wait_then_it_ends_after_its_work_with_exit_0(cli):
    worker_id = new_worker(cli, instances=2)
    # --no-reschedule: the placed instances are SCHEDULED, and another worker of the template could take them.
    waiting = cli.background(
        "drain", worker_id, "--reason", "kernel patch", "--no-reschedule", "--wait", "--interval", "0.3"
    )
    assert waiting.stdout is not None
    # The watcher prints this line, then takes its first look; complete the work only once it watches.
    started = waiting.stdout.readline()
    assert f"drain of {worker_id} started" in started
    time.sleep(2)

    for instance_id in active_instances(cli, worker_id):
        assert cli("complete", instance_id)[0] == 0
    rest, _ = waiting.communicate(timeout=60)
    output = started + rest

    assert waiting.returncode == 0, output
    for instance_id in cli.json("instances", "--worker", worker_id):
        assert f"instance {instance_id['id']} ended: COMPLETED" in output
    assert "SUCCESS - 2 instance(s) ended gracefully, 0 forced" in output


def test_given_a_busy_worker_when_its_drain_is_forced_then_the_wait_reports_forced_instances_and_exit_1(cli):
    # The deadline's own timer is the workflow's (tests/integration/test_drain_workflow.py); here the wait
    # must see a drain end forced and say so, so forcing it now stands in for a minute of waiting.
    worker_id = new_worker(cli, instances=1)
    waiting = cli.background(
        "drain",
        worker_id,
        "--no-reschedule",
        "--timeout",
        "1h",
        "--wait",
        "--interval",
        "0.3",
        "--output",
        "json",
    )

    def drain_running() -> bool:
        code, output = cli("drain-status", worker_id, "--output", "json")  # 404 until the drain starts
        return code == 0 and bool(json.loads(output)["status"] == "RUNNING")

    wait_until(drain_running)
    assert cli("drain", worker_id, "--force-now", "--reason", "deadline")[0] == 0
    output, _ = waiting.communicate(timeout=60)

    assert waiting.returncode == 1, output
    outcome = json.loads(output)
    assert (outcome["status"], outcome["forced_instances"], outcome["graceful_instances"]) == (
        "TIMED_OUT",
        1,
        0,
    )
    assert cli.json("instances", "--worker", worker_id)[0]["reason"] == "forced"


def test_given_a_drain_forced_now_then_the_watch_counts_its_instance_forced_and_none_graceful(cli):
    worker_id = new_worker(cli, instances=1)
    assert cli.json("drain", worker_id, "--no-reschedule", "--reason", "patch")["status"] == "RUNNING"

    code, output = cli("drain", worker_id, "--force-now", "--reason", "cve fix")
    assert code == 0, output
    code, output = cli("drain-status", worker_id, "--watch", "--interval", "0.5")

    assert code == 1, output
    assert f"drain of {worker_id}: TIMED_OUT - 0 instance(s) ended gracefully, 1 forced" in output
    assert cli.json("instances", "--worker", worker_id)[0]["reason"] == "forced"


def test_given_a_draining_worker_when_the_drain_is_cancelled_then_it_runs_again_and_a_second_cancel_is_3(cli):
    worker_id = new_worker(cli, instances=1)
    drained = cli.json("drain", worker_id, "--reason", "wrong worker", "--no-reschedule")
    assert drained["status"] == "RUNNING"

    cancelled = cli.json("cancel-drain", worker_id, "--reason", "changed my mind")

    assert cancelled["status"] == "RUNNING"
    assert cli.json("drain-status", worker_id)["status"] == "CANCELLED"
    code, output = cli("cancel-drain", worker_id)
    assert code == 3
    assert output.startswith("error: CONFLICT (409): ")
    assert len(output.strip().splitlines()) == 1
    for instance_id in active_instances(cli, worker_id):
        cli("complete", instance_id)


def test_given_a_pool_when_drained_then_it_ends_once_its_work_is_done(cli):
    worker_id = new_worker(cli, pool=DRAIN_POOL, instances=1)

    started = cli.json("pool", "drain", DRAIN_POOL, "--timeout", "5m")
    assert (started["status"], started["drain_outcome"]) == ("draining", "RUNNING")
    code, output = cli("place", "--pool", DRAIN_POOL)
    # A draining pool takes no new work: an answer about the fleet (409, exit 3), not a failure.
    assert (code, output) == (
        3,
        f"error: NO_CAPACITY (409): pool {DRAIN_POOL} is draining and accepts no instances\n",
    )
    for instance_id in active_instances(cli, worker_id):
        assert cli("complete", instance_id)[0] == 0

    def pool_drained() -> Any:
        pool = next(p for p in cli.json("pools") if p["name"] == DRAIN_POOL)
        return pool if pool["drain_outcome"] != "RUNNING" else None

    assert wait_until(pool_drained)["drain_outcome"] == "SUCCESS"


def test_given_a_drained_worker_then_audit_names_who_drained_it_and_why_newest_first(cli):
    worker_id = new_worker(cli)
    assert cli("drain", worker_id, "--reason", "rack move")[0] == 0
    wait_until(lambda: cli.json("drain-status", worker_id)["status"] == "SUCCESS")

    events = cli.json("audit", worker_id)

    assert [e["at"] for e in events] == sorted((e["at"] for e in events), reverse=True)
    started = next(e for e in events if e["reason"] == "rack move")
    assert started["actor"].startswith("arn:aws:iam::")
    assert (started["from_status"], started["to_status"]) == ("RUNNING", "DRAINING")
    code, table = cli("audit", worker_id)
    assert code == 0
    assert "rack move" in table
    assert cli.json("audit", POOL, "--pool")[-1]["to_status"] == "active"


def test_given_every_listing_then_its_json_parses(cli):
    assert any(w["template"] == TEMPLATE for w in cli.json("workers"))
    assert any(t["name"] == TEMPLATE for t in cli.json("templates"))
    assert any(p["name"] == POOL for p in cli.json("pools"))
    assert cli.json("stats")["workers_by_status"]["RUNNING"] >= 1


def test_given_mistakes_then_exit_codes_say_which(cli):
    assert cli("worker", "show", "w-nobody")[0] == 3
    assert cli("drain", "w-nobody", "--timeout", "2x")[0] == 2
    assert cli("audit", "w-nobody")[0] == 3
    code, output = cli("place", "--template", "no-such-template")
    assert code == 2
    assert output == "error: INVALID_INPUT (422): template: unknown template 'no-such-template'\n"
    code, output = cli("operation", "run", "w-nobody", "no-such-operation")
    assert code == 2
    assert output.startswith("error: INVALID_INPUT (422): name: unknown operation 'no-such-operation'")
    assert output.count("no-such-operation") == 1, output


def test_given_a_started_instance_when_its_worker_is_drained_then_the_drain_waits_and_cancel_drain_works(cli):
    worker_id = new_worker(cli, instances=1)
    (instance_id,) = active_instances(cli, worker_id)
    code, output = cli("instance", "state", instance_id, "RUNNING")
    assert (code, output) == (0, f"instance {instance_id} RUNNING\n")

    # A RUNNING instance cannot move to another worker: the drain waits for it.
    drained = cli.json("drain", worker_id, "--reason", "tour")
    assert (drained["status"], drained["worker_status"], drained["active_instances"]) == (
        "RUNNING",
        "DRAINING",
        1,
    )
    assert cli.json("drain-status", worker_id)["status"] == "RUNNING"
    code, output = cli("cancel-drain", worker_id)

    assert (code, output) == (0, f"drain of {worker_id} cancelled; worker RUNNING\n")
    assert cli("complete", instance_id)[0] == 0


def test_given_two_workers_when_rolled_out_with_wait_then_it_follows_both_waves_to_succeeded_and_exit_0(cli):
    # A budget of its own: the pool rolls at the budget's pace, not the stage default's ledger.
    response = requests.put(
        f"{cli.api}/api/v1/pools/{ROLLOUT_POOL}", json={"disruption": {"budgets": [{"max": 1}]}}, timeout=10
    )
    assert response.status_code == 201, response.text
    old = sorted(new_worker(cli, pool=ROLLOUT_POOL) for _ in range(2))
    plan = cli.json(
        "rollout", "start", TEMPLATE, "--pool", ROLLOUT_POOL, "--max-unavailable", "1", "--dry-run"
    )
    assert [wave["worker_ids"] for wave in plan["waves"]] == [[old[0]], [old[1]]]

    # In its own process: the test bounds how long it may take.
    waiting = cli.background(
        "rollout",
        "start",
        TEMPLATE,
        "--pool",
        ROLLOUT_POOL,
        "--max-unavailable",
        "1",
        "--reason",
        "e2e AMI",
        "--wait",
        "--interval",
        "0.5",
    )
    output, _ = waiting.communicate(timeout=180)

    assert waiting.returncode == 0, output
    assert "started: 2 worker(s) in 2 wave(s)" in output
    assert "wave 2/2 started" in output
    assert "SUCCEEDED: wave 2/2, 2/2 replaced (100%)" in output
    for worker_id in old:
        assert cli.json("worker", "show", worker_id)["status"] == "TERMINATED"
    newest = cli.json("rollouts", "--limit", "1")
    assert (newest[0]["status"], newest[0]["pool"], newest[0]["reason"]) == (
        "SUCCEEDED",
        ROLLOUT_POOL,
        "e2e AMI",
    )
    code, listing = cli("rollouts")
    assert code == 0
    assert newest[0]["id"] in listing

    code, output = cli("rollout", "pause", newest[0]["id"])
    assert code == 3
    assert output.startswith("error: CONFLICT (409): ")
    assert "SUCCEEDED" in output
    code, output = cli("rollout", "status", "ro-nobody")
    assert code == 3
    assert output.startswith("error: NOT_FOUND (404): ")
