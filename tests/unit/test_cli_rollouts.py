"""`fleetkeeper rollout ...` and `rollouts` against a recording server: what each command asks the API,
what it prints, and its exit code."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import pytest

from fleetkeeper_cli import watch
from tests.unit import test_cli
from tests.unit.test_cli import Recorder, run

# The recording API of the CLI's other tests, as this module's fixture.
server = test_cli.server

ROLLOUT_ID = "ro-0123456789abcdef"


def _view(**changes: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "id": ROLLOUT_ID,
        "status": "RUNNING",
        "template": "lab",
        "pool": "labs",
        "strategy": "surge",
        "max_unavailable": 1,
        "total": 2,
        "replaced": 0,
        "in_progress": 1,
        "remaining": 1,
        "skipped": 0,
        "percent": 0,
        "wave": 0,
        "waves": 2,
        "checkpoint": None,
        "checkpoints": [],
        "replace": True,
        "started_by": "arn:aws:iam::123456789012:user/ops",
        "reason": "AMI 2026-11",
        "created_at": "2026-11-28T01:00:00+00:00",
        "updated_at": "2026-11-28T01:00:00+00:00",
        "finished_at": None,
        "blocked": None,
    }
    return view | changes


def _blocked(reason: str, detail: str) -> dict[str, Any]:
    return {"reason": reason, "detail": detail, "since": "2026-11-28T01:00:05+00:00"}


def test_given_every_option_when_starting_then_the_body_says_each_in_the_apis_terms(server):
    Recorder.answer = (202, _view())

    exit_code, output = run(
        "--api",
        server,
        "rollout",
        "start",
        "lab",
        "--pool",
        "labs",
        "--max-unavailable",
        "25%",
        "--strategy",
        "drain_first",
        "--checkpoint",
        "30",
        "--checkpoint",
        "60",
        "--checkpoint-delay",
        "10m",
        "--bake",
        "90s",
        "--drain-timeout",
        "1h",
        "--no-replace",
        "--rollback-on-alarm",
        "lab-errors",
        "--rollback-on-alarm",
        "lab-latency",
        "--reason",
        "AMI 2026-11",
    )

    assert exit_code == 0, output
    assert Recorder.requests == [
        (
            "POST",
            "/api/v1/rollouts",
            {
                "template": "lab",
                "pool": "labs",
                "max_unavailable": "25%",
                "strategy": "drain_first",
                "checkpoints": [30, 60],
                "checkpoint_delay_seconds": 600,
                "bake_seconds": 90,
                "drain_timeout_seconds": 3600,
                "replace": False,
                "rollback_on_alarms": ["lab-errors", "lab-latency"],
                "reason": "AMI 2026-11",
            },
        )
    ]
    assert f"rollout {ROLLOUT_ID} RUNNING: wave 1/2, 0/2 replaced (0%), 1 in progress" in output


def test_given_workers_named_and_a_count_then_the_body_has_their_ids_and_an_integer(server):
    Recorder.answer = (202, _view(template=None, pool=None))

    exit_code, output = run(
        "--api", server, "rollout", "start", "--worker", "w-1", "--worker", "w-2", "--max-unavailable", "1"
    )

    assert exit_code == 0, output
    assert Recorder.requests[0][2] == {
        "strategy": "surge",
        "worker_ids": ["w-1", "w-2"],
        "max_unavailable": 1,
    }


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["lab", "--max-unavailable", "a quarter"], "--max-unavailable"),
        (["lab", "--bake", "soon"], "--bake"),
        (["lab", "--worker", "w-1"], "--worker"),
        ([], "TEMPLATE"),
        (["lab", "--checkpoint", "100"], "--checkpoint"),
    ],
)
def test_given_a_mistake_in_the_options_then_usage_exit_2_naming_the_option_and_no_request(
    server, args: list[str], named: str
):
    exit_code, output = run("--api", server, "rollout", "start", *args)

    assert exit_code == 2, output
    assert named in output
    assert Recorder.requests == []


def test_given_dry_run_then_the_plans_waves_print_as_a_table(server):
    plan = {
        "template": "lab",
        "pool": None,
        "strategy": "surge",
        "max_unavailable": 2,
        "total": 5,
        "waves": [
            {"index": 0, "count": 2, "worker_ids": ["w-a", "w-b"]},
            {"index": 1, "count": 2, "worker_ids": ["w-c", "w-d"]},
            # Past the workers a large plan lists: the count only.
            {"index": 2, "count": 1, "worker_ids": None},
        ],
        "checkpoints": [50],
    }
    Recorder.answer = (200, plan)

    exit_code, output = run("--api", server, "rollout", "start", "lab", "--max-unavailable", "2", "--dry-run")

    assert exit_code == 0, output
    assert Recorder.requests[0][2]["dry_run"] is True
    assert "plan (surge): 5 worker(s) of template lab, 3 wave(s) of at most 2; checkpoints 50%" in output
    rows = [line for line in output.splitlines() if "w-" in line or "not listed" in line]
    assert len(rows) == 3
    assert "w-a w-b" in rows[0]
    assert rows[0].split()[1:3] == ["1", "│"]
    assert "w-c w-d" in rows[1]
    assert rows[2].split()[1:6] == ["3", "│", "1", "│", "(not"], rows[2]
    code, raw = run("--api", server, "rollout", "start", "lab", "--dry-run", "-o", "json")
    assert (code, json.loads(raw)) == (0, plan)


def test_given_wait_then_it_shows_each_wave_and_blocker_until_succeeded_and_exits_0(server):
    Recorder.queue = [
        (202, _view()),
        (200, _view()),
        (200, _view(blocked=_blocked("capacity", "replacement w-r1 is PROVISIONING"))),
        (200, _view(wave=1, replaced=1, percent=50, remaining=0)),
    ]
    Recorder.answer = (
        200,
        _view(status="SUCCEEDED", wave=1, replaced=2, percent=100, in_progress=0, remaining=0),
    )

    exit_code, output = run("--api", server, "rollout", "start", "lab", "--wait", "--interval", "0.1")

    assert exit_code == 0, output
    assert f"rollout {ROLLOUT_ID} started: 2 worker(s) in 2 wave(s)" in output
    assert "blocked: capacity: replacement w-r1 is PROVISIONING" in output
    assert "wave 2/2 started" in output
    assert "RUNNING -> SUCCEEDED" in output
    assert f"rollout {ROLLOUT_ID} SUCCEEDED: wave 2/2, 2/2 replaced (100%)" in output
    gets = [path for method, path, _ in Recorder.requests if method == "GET"]
    assert set(gets) == {f"/api/v1/rollouts/{ROLLOUT_ID}"}
    assert len(gets) == 4  # three on the way, then SUCCEEDED


@pytest.mark.parametrize(
    ("final", "rolled_back_by", "code"),
    [
        ("FAILED", None, 1),
        ("CANCELLED", None, 1),
        ("ROLLED_BACK", "arn:aws:iam::123456789012:user/ops", 0),  # the operator's own rollback
        ("ROLLED_BACK", "alarm:lab-errors", 1),  # its alarms undid the deploy: a failure to a pipeline
    ],
)
def test_given_status_wait_then_the_exit_code_follows_the_final_status(
    server, final: str, rolled_back_by: str | None, code: int
):
    blocked = _blocked("launch_failed", "replacement w-r1 FAILED") if final == "FAILED" else None
    rollback = {"started_by": rolled_back_by} if rolled_back_by else None
    Recorder.queue = [(200, _view(status="PAUSED", blocked=_blocked("checkpoint", "paused by an operator")))]
    Recorder.answer = (200, _view(status=final, blocked=blocked, rollback=rollback))

    exit_code, output = run(
        "--api", server, "rollout", "status", ROLLOUT_ID, "--wait", "--interval", "0.1", "-o", "json"
    )

    assert exit_code == code, output
    assert json.loads(output)["status"] == final


def test_given_a_failed_rollout_when_waited_on_then_the_last_lines_say_why_and_exit_1(server):
    Recorder.answer = (
        200,
        _view(status="FAILED", blocked=_blocked("launch_failed", "replacement w-r1 is FAILED")),
    )

    exit_code, output = run("--api", server, "rollout", "status", ROLLOUT_ID, "--wait", "--interval", "0.1")

    assert exit_code == 1, output
    assert "blocked: launch_failed" in output
    assert "replacement w-r1 is FAILED" in output


def test_given_ctrl_c_while_waiting_then_it_detaches_saying_the_rollout_goes_on(server, monkeypatch):
    Recorder.answer = (200, _view())

    def interrupted(_: float) -> None:
        raise KeyboardInterrupt

    # Only the watch's pause is interrupted: other threads of this process (a server, a Live display)
    # keep the real sleep.
    monkeypatch.setattr(
        watch, "time", SimpleNamespace(sleep=interrupted, time=time.time, monotonic=time.monotonic)
    )

    exit_code, output = run("--api", server, "rollout", "status", ROLLOUT_ID, "--wait")

    assert exit_code == 0, output
    assert f"detached: rollout {ROLLOUT_ID} goes on" in output
    assert f"fleetkeeper rollout status {ROLLOUT_ID} --wait" in output
    assert [method for method, _, _ in Recorder.requests] == ["GET"]


@pytest.mark.parametrize("move", ["pause", "resume", "cancel", "rollback"])
def test_given_a_move_then_it_posts_to_its_path_with_the_reason_when_given(server, move: str):
    Recorder.answer = (200, _view(status="PAUSED"))

    with_reason = run("--api", server, "rollout", move, ROLLOUT_ID, "--reason", "error rate up")
    without = run("--api", server, "rollout", move, ROLLOUT_ID)

    assert (with_reason[0], without[0]) == (0, 0), with_reason[1] + without[1]
    path = f"/api/v1/rollouts/{ROLLOUT_ID}/{move}"
    assert Recorder.requests == [("POST", path, {"reason": "error rate up"}), ("POST", path, {})]
    assert f"rollout {ROLLOUT_ID} PAUSED" in without[1]
    assert f"fleetkeeper rollout resume {ROLLOUT_ID}" in without[1]


def test_given_a_rollback_then_it_prints_rolling_back_and_json_is_the_view(server):
    Recorder.answer = (202, _view(status="ROLLING_BACK"))

    exit_code, output = run("--api", server, "rollout", "rollback", ROLLOUT_ID, "-o", "json")

    assert exit_code == 0, output
    assert json.loads(output)["status"] == "ROLLING_BACK"


@pytest.mark.parametrize(
    ("status", "error", "message"),
    [
        (409, "CONFLICT", f"rollout {ROLLOUT_ID} is ROLLED_BACK; it cannot move to ROLLING_BACK"),
        (404, "NOT_FOUND", f"rollout {ROLLOUT_ID} not found"),
    ],
)
def test_given_the_api_refuses_a_move_then_one_line_with_its_message_and_exit_3(
    server, status: int, error: str, message: str
):
    Recorder.answer = (status, {"error": error, "message": message})

    exit_code, output = run("--api", server, "rollout", "rollback", ROLLOUT_ID)

    assert exit_code == 3
    assert output == f"error: {error} ({status}): {message}\n"


def test_given_more_rollouts_than_a_page_then_the_list_follows_next_token_up_to_the_limit(server):
    first = [
        _view(id="ro-3", status="RUNNING"),
        _view(id="ro-2", status="SUCCEEDED", replaced=2, percent=100),
    ]
    Recorder.queue = [
        (200, {"items": first, "next_token": "t1"}),
        (200, {"items": [_view(id="ro-1", status="FAILED", blocked=_blocked("launch_failed", "x"))]}),
    ]

    exit_code, output = run("--api", server, "rollouts", "--limit", "3")

    assert exit_code == 0, output
    assert [path for _, path, _ in Recorder.requests] == [
        "/api/v1/rollouts?limit=3",
        "/api/v1/rollouts?limit=1&next_token=t1",
    ]
    rows = [line for line in output.splitlines() if "ro-" in line]
    assert [row.split()[1] for row in rows] == ["ro-3", "ro-2", "ro-1"]
    assert "2/2 (100%)" in rows[1]
    assert "launch_failed" in rows[2]
    assert "2026-11-28 01:00:00" in rows[0]


def test_given_the_list_as_json_then_it_is_the_items(server):
    Recorder.answer = (200, {"items": [_view()], "next_token": None})

    exit_code, output = run("--api", server, "rollouts", "-o", "json")

    assert exit_code == 0, output
    assert [r["id"] for r in json.loads(output)] == [ROLLOUT_ID]


def test_given_a_rollback_when_waited_on_then_its_waves_show_until_rolled_back_and_exit_0(server):
    def rolling_back(wave: int, rolled_back: int, in_progress: int) -> dict[str, Any]:
        rollback = {"total": 2, "rolled_back": rolled_back, "skipped": 0, "in_progress": in_progress}
        return rollback | {"wave": wave, "waves": 2, "started_by": "ops", "started_at": None, "reason": None}

    Recorder.queue = [
        (202, _view(status="ROLLING_BACK", rollback=rolling_back(0, 0, 1))),
        (200, _view(status="ROLLING_BACK", rollback=rolling_back(0, 0, 1))),
        (200, _view(status="ROLLING_BACK", rollback=rolling_back(1, 1, 1))),
    ]
    Recorder.answer = (200, _view(status="ROLLED_BACK", rollback=rolling_back(1, 2, 0)))

    assert run("--api", server, "rollout", "rollback", ROLLOUT_ID)[0] == 0
    exit_code, output = run("--api", server, "rollout", "status", ROLLOUT_ID, "--wait", "--interval", "0.1")

    assert exit_code == 0, output
    assert "rollback wave 2/2 started" in output
    assert "ROLLING_BACK -> ROLLED_BACK" in output
    assert "; rollback wave 2/2, 2/2 rolled back, 0 in progress" in output
