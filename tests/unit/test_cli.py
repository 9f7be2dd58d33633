"""The `fleetkeeper` CLI without a server: targets, signing, durations, fleet files, help and exit codes."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from fleetkeeper.domain.models import TemplateSpec
from fleetkeeper_cli import fleetfile
from fleetkeeper_cli.app import app
from fleetkeeper_cli.client import (
    LOCAL_API,
    ApiClient,
    ApiTarget,
    CliError,
    ExitCode,
    is_local,
    region_of,
    resolve_api_target,
    resolve_api_url,
)
from fleetkeeper_cli.commands.pools import POOL_DRAIN_DEFAULT_SECONDS
from fleetkeeper_cli.durations import format_seconds, parse_duration
from fleetkeeper_cli.output import console

DEPLOYED = "https://a1b2c3d4e5.execute-api.eu-west-1.amazonaws.com/prod/"


class Recorder(BaseHTTPRequestHandler):
    """Answers every request with `answer` and keeps the headers it received."""

    seen: ClassVar[list[dict[str, str]]] = []
    # (method, path, JSON body or None) of every request.
    requests: ClassVar[list[tuple[str, str, Any]]] = []
    answer: ClassVar[tuple[int, dict[str, Any]]] = (200, {"items": []})
    # Answers given in turn, before `answer` (for commands that page).
    queue: ClassVar[list[tuple[int, dict[str, Any]]]] = []

    def _serve(self) -> None:
        Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        Recorder.requests.append((self.command, self.path, json.loads(raw) if raw else None))
        status, body = Recorder.queue.pop(0) if Recorder.queue else Recorder.answer
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.seen = []
    Recorder.requests = []
    Recorder.answer = (200, {"items": []})
    Recorder.queue = []
    httpd = HTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-token")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def run(*args: str, width: int = 200) -> tuple[int, str]:
    # The console measured its width when the module was imported, under whatever terminal ran the
    # tests: tables must not wrap the cells the assertions look for.
    console.width = width
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": str(width)})
    return result.exit_code, result.output


def test_given_no_target_then_the_local_api_else_the_environment_else_the_flag(monkeypatch):
    monkeypatch.delenv("FLEETKEEPER_API", raising=False)
    monkeypatch.delenv("FLEETKEEPER_API_PORT", raising=False)
    assert resolve_api_url(None, None) == LOCAL_API
    monkeypatch.setenv("FLEETKEEPER_API", DEPLOYED)
    assert resolve_api_url(None, None) == DEPLOYED
    assert resolve_api_url("http://127.0.0.1:9", None) == "http://127.0.0.1:9"
    with pytest.raises(CliError) as both:
        resolve_api_url("http://x", "stack")
    assert both.value.exit_code == ExitCode.USAGE


def test_given_an_api_gateway_url_then_its_region_is_the_signing_region_and_it_is_not_local():
    assert region_of(DEPLOYED) == "eu-west-1"
    assert not is_local(DEPLOYED)
    assert is_local(LOCAL_API)


def test_given_credentials_when_calling_a_signed_target_then_botocore_signs_for_execute_api(
    server, credentials
):
    client = ApiClient(server, region="eu-west-1", sign=True)

    client.get("/api/v1/workers", status="RUNNING")

    headers = Recorder.seen[0]
    assert headers["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
    assert "/eu-west-1/execute-api/aws4_request" in headers["authorization"]
    assert headers["x-amz-security-token"] == "session-token"
    assert "x-amz-date" in headers


def test_given_a_local_target_then_requests_go_unsigned(server, credentials):
    ApiClient(server).get("/api/v1/stats")
    assert "authorization" not in Recorder.seen[0]


def test_given_no_credentials_when_a_call_must_be_signed_then_exit_4(server, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(CliError) as missing:
        ApiClient(server, region="eu-west-1", sign=True).get("/api/v1/stats")
    assert missing.value.exit_code == ExitCode.AUTH


@pytest.mark.parametrize(
    ("status", "body", "code", "line"),
    [
        (404, {"error": "NOT_FOUND", "message": "worker 'w-1' was not found"}, 3, "NOT_FOUND (404)"),
        (409, {"error": "CONFLICT", "message": "worker w-1 is RUNNING"}, 3, "CONFLICT (409)"),
        (
            422,
            {
                "error": "VALIDATION_FAILED",
                "message": "bad",
                "details": [{"field": "body.x", "reason": "no"}],
            },
            2,
            "body.x: no",
        ),
        (
            403,
            {"message": "Missing Authentication Token"},
            4,
            "FORBIDDEN (403): Missing Authentication Token",
        ),
        (500, {"error": "INTERNAL", "message": "internal error"}, 1, "INTERNAL (500)"),
    ],
)
def test_given_an_api_error_then_one_line_with_its_code_and_the_exit_code(server, status, body, code, line):
    Recorder.answer = (status, body)

    exit_code, output = run("--api", server, "worker", "show", "w-1")

    assert exit_code == code
    assert output.strip().splitlines() == [f"error: {output.strip().removeprefix('error: ')}"]
    assert line in output


def test_given_no_server_then_exit_1_with_a_hint_after_one_attempt(monkeypatch: pytest.MonkeyPatch):
    attempts: list[object] = []
    connect = socket.create_connection

    def counted(*args: Any, **kwargs: Any) -> socket.socket:
        attempts.append(args[0])
        return connect(*args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", counted)

    exit_code, output = run("--api", "http://127.0.0.1:9", "workers")

    assert exit_code == 1
    assert "cannot reach the API at http://127.0.0.1:9" in output
    # A refused connection is the answer: no retry, no backoff.
    assert attempts == [("127.0.0.1", 9)]


def test_given_a_local_api_then_a_command_loads_neither_botocore_nor_requests_nor_yaml(server: str):
    # What a command imports is what every run of it pays for: a fresh interpreter tells.
    script = (
        "import json, sys\n"
        "from fleetkeeper_cli.app import app\n"
        f"app(['--api', '{server}', 'workers'], standalone_mode=False)\n"
        "sys.stderr.write(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)  # noqa: S603

    loaded = {name.split(".")[0] for name in json.loads(done.stderr)}
    assert Recorder.requests[0][1].startswith("/api/v1/workers")
    assert loaded.isdisjoint({"boto3", "botocore", "requests", "urllib3", "yaml", "pydantic"}), loaded


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1h30m", 5400), ("1d", 86400)]
)
def test_given_a_duration_then_its_seconds(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "h", "1h 30m", "-5m"])
def test_given_a_bad_duration_then_value_error(text):
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_given_seconds_then_a_short_human_duration():
    assert [format_seconds(s) for s in (5, 65, 7260, -70)] == ["5s", "1m05s", "2h01m", "-1m10s"]


def test_given_a_bad_timeout_option_then_usage_exit_2():
    exit_code, output = run("--api", "http://127.0.0.1:9", "drain", "w-1", "--timeout", "soon")
    assert exit_code == 2
    assert "--timeout" in output


@pytest.mark.parametrize(
    "command",
    [
        [],
        ["workers"],
        ["worker", "show"],
        ["drain"],
        ["drain-status"],
        ["cancel-drain"],
        ["pools"],
        ["pool", "drain"],
        ["pool", "cancel-drain"],
        ["pool", "disruption"],
        ["pool", "capacity"],
        ["orphans", "show"],
        ["orphans", "held-back"],
        ["orphans", "confirm"],
        ["instances"],
        ["place"],
        ["complete"],
        ["instance", "state"],
        ["templates"],
        ["stats"],
        ["audit"],
        ["apply"],
        ["operations"],
        ["operation", "run"],
        ["rollouts"],
        ["rollout", "start"],
        ["rollout", "status"],
        ["rollout", "pause"],
        ["rollout", "resume"],
        ["rollout", "cancel"],
        ["rollout", "rollback"],
    ],
)
def test_given_any_command_then_help_works_and_offers_json_output(command):
    exit_code, output = run(*command, "--help")
    assert exit_code == 0, output
    assert "--output" in output


def test_given_a_fleet_file_with_an_unknown_field_then_usage_error_names_it(tmp_path: Path):
    path = tmp_path / "fleet.yaml"
    path.write_text("templates:\n  - name: lab\n    capacty: 3\n")
    with pytest.raises(CliError) as bad:
        fleetfile.load(path)
    assert bad.value.exit_code == ExitCode.USAGE
    assert "templates[0].capacty: unknown field" in bad.value.message


def test_given_the_example_fleet_file_then_it_loads():
    fleet = fleetfile.load(Path(__file__).parents[2] / "docs" / "fleet.example.yaml")
    assert set(fleet.templates) == {"lab-small", "batch"}
    assert set(fleet.pools) == {"labs", "batch"}


@pytest.mark.parametrize(
    ("command", "path"),
    [
        (["cancel-drain", "w-1"], "/api/v1/workers/w-1/cancel-drain"),
        (["pool", "cancel-drain", "labs"], "/api/v1/pools/labs/cancel-drain"),
    ],
)
def test_given_a_cancel_reason_then_the_cli_sends_it_in_the_body(server: str, command: list[str], path: str):
    Recorder.answer = (200, {"id": "w-1", "name": "labs", "status": "RUNNING"})

    exit_code, output = run("--api", server, *command, "--reason", "patch postponed")

    assert exit_code == 0, output
    assert Recorder.requests[-1] == ("POST", path, {"reason": "patch postponed"})


@pytest.mark.parametrize(
    ("flags", "path"),
    [
        ([], "/api/v1/workers/x-1/events"),
        (["--pool"], "/api/v1/pools/x-1/events"),
        (["--rollout"], "/api/v1/rollouts/x-1/events"),
    ],
)
def test_given_audit_then_the_cli_reads_the_trail_of_the_entity_it_names(
    server: str, flags: list[str], path: str
):
    Recorder.answer = (200, {"items": [], "next_token": None})

    exit_code, output = run("--api", server, "audit", "x-1", *flags)

    assert exit_code == 0, output
    assert Recorder.requests[-1][1].split("?")[0] == path


def test_given_audit_with_both_pool_and_rollout_then_usage_exit_2(server: str):
    exit_code, output = run("--api", server, "audit", "x-1", "--pool", "--rollout")

    assert exit_code == 2
    assert "--rollout" in output
    assert Recorder.requests == []


def test_given_orphans_confirm_then_the_cli_posts_the_region_and_the_checked_workers(server: str):
    Recorder.answer = (
        200,
        {"region": "eu-west-1", "confirmed_ids": ["w-1", "w-2"], "confirmed_until": "2026-11-22T13:00:00Z"},
    )

    exit_code, output = run(
        "--api", server, "orphans", "confirm", "eu-west-1", "--worker", "w-1", "--worker", "w-2"
    )

    assert exit_code == 0, output
    assert Recorder.requests[-1] == (
        "POST",
        "/api/v1/reconcile/orphans/confirm",
        {"region": "eu-west-1", "worker_ids": ["w-1", "w-2"]},
    )
    assert "2 held-back workers in eu-west-1 confirmed" in output


def test_given_orphans_held_back_then_the_cli_pages_through_one_set_and_names_it(server: str):
    fingerprint = "0123456789abcdef0123456789abcdef"
    first = {"region": "eu-west-1", "held_back_set": fingerprint, "count": 3, "items": ["w-1", "w-2"]}
    Recorder.queue = [
        (200, {**first, "next_token": "t1"}),
        (200, {**first, "items": ["w-3"], "next_token": None}),
    ]

    exit_code, output = run("--api", server, "orphans", "held-back", "eu-west-1")

    assert exit_code == 0, output
    paths = [path for _, path, _ in Recorder.requests]
    assert paths == [
        "/api/v1/reconcile/orphans/eu-west-1/held-back",
        f"/api/v1/reconcile/orphans/eu-west-1/held-back?held_back_set={fingerprint}&next_token=t1",
    ]
    assert [line for line in output.splitlines() if line.startswith("w-")] == ["w-1", "w-2", "w-3"]
    assert f"3 of 3 held back in eu-west-1; set {fingerprint}" in output


def test_given_orphans_confirm_with_a_set_then_the_cli_posts_it(server: str):
    Recorder.answer = (
        200,
        {"region": "eu-west-1", "confirmed_ids": ["w-1"], "confirmed_count": 5000, "confirmed_until": "x"},
    )

    exit_code, output = run("--api", server, "orphans", "confirm", "eu-west-1", "--set", "ab" * 16)

    assert exit_code == 0, output
    assert Recorder.requests[-1][2] == {"region": "eu-west-1", "held_back_set": "ab" * 16}
    assert "5000 held-back workers in eu-west-1 confirmed" in output


def test_given_operation_run_then_the_cli_posts_the_name_and_each_param(server: str):
    Recorder.answer = (202, {"id": "op-1", "name": "register-license", "status": "PENDING"})

    exit_code, output = run(
        "--api", server, "operation", "run", "w-1", "register-license", "--param", "licenseParameter=/a/b=c"
    )

    assert exit_code == 0, output
    assert "op-1" in output
    assert Recorder.requests[-1] == (
        "POST",
        "/api/v1/workers/w-1/operations",
        {"name": "register-license", "parameters": {"licenseParameter": "/a/b=c"}},
    )


def test_given_a_param_without_a_value_then_usage_exit_2(server: str):
    exit_code, output = run("--api", server, "operation", "run", "w-1", "register-license", "-p", "oops")

    assert exit_code == 2
    assert "KEY=VALUE" in output
    assert Recorder.requests == []


def test_given_operations_then_the_cli_lists_every_page(server: str):
    item = {
        "id": "op-1",
        "name": "collect-system-info",
        "status": "FAILED",
        "attempts": 1,
        "max_attempts": 1,
        "requested_by": "operations",
        "created_at": "2026-11-22T13:00:00Z",
        "error": "timed out after 120 s",
        "output": None,
    }
    Recorder.answer = (200, {"items": [item], "next_token": None})

    exit_code, output = run("--api", server, "operations", "w-1")

    assert exit_code == 0, output
    assert "timed out after 120 s" in output
    assert Recorder.requests[-1][1].startswith("/api/v1/workers/w-1/operations?")


@pytest.mark.parametrize(("flags", "reschedule"), [([], True), (["--no-reschedule"], False)])
def test_given_the_reschedule_flag_then_the_drain_body_carries_it(
    server: str, flags: list[str], reschedule: bool
):
    Recorder.answer = (202, {"worker_id": "w-1", "status": "RUNNING", "worker_status": "DRAINING"})

    exit_code, output = run("--api", server, "drain", "w-1", *flags)

    assert exit_code == 0, output
    method, path, body = Recorder.requests[-1]
    assert (method, path) == ("POST", "/api/v1/workers/w-1/drain")
    assert body["reschedule"] is reschedule


RUNNING_DRAIN = {
    "worker_id": "w-1",
    "status": "RUNNING",
    "worker_status": "DRAINING",
    "generation": 3,
    "timeout_seconds": 600,
    "deadline": "2099-01-01T00:10:00Z",
}


def test_given_extend_then_the_cli_moves_the_running_drains_deadline_by_that_much(server: str):
    Recorder.answer = (200, RUNNING_DRAIN)

    exit_code, output = run("--api", server, "drain", "w-1", "--extend", "30m", "--reason", "exam runs late")

    assert exit_code == 0, output
    assert [(m, p) for m, p, _ in Recorder.requests] == [
        ("GET", "/api/v1/workers/w-1/drain"),
        ("PATCH", "/api/v1/workers/w-1/drain"),
    ]
    # The whole new timeout, counted from the drain's start, for the drain that was read.
    assert Recorder.requests[-1][2] == {
        "timeout_seconds": 600 + 1800,
        "generation": 3,
        "reason": "exam runs late",
    }
    assert "extended by 30m" in output


def test_given_force_now_then_the_cli_forces_the_running_drain(server: str):
    Recorder.answer = (202, {**RUNNING_DRAIN, "forced_by": "alice"})

    exit_code, output = run("--api", server, "drain", "w-1", "--force-now", "--reason", "patch")

    assert exit_code == 0, output
    assert Recorder.requests == [("POST", "/api/v1/workers/w-1/drain/force", {"reason": "patch"})]
    assert "forced" in output


@pytest.mark.parametrize(
    ("reason", "graceful", "forced"), [("forced", 0, 1), ("drain_timeout", 0, 1), ("completed", 1, 0)]
)
def test_given_a_drain_that_ended_then_the_watch_counts_instances_forced_now_or_at_the_deadline_as_forced(
    server: str, reason: str, graceful: int, forced: int
):
    ended = {
        **RUNNING_DRAIN,
        "status": "TIMED_OUT" if forced else "SUCCESS",
        "worker_status": "STOPPING",
        "started_at": "2099-01-01T00:00:00Z",
        "forced_instances": forced,
    }
    instance = {"id": "i-1", "state": "TERMINATED" if forced else "COMPLETED", "reason": reason}
    Recorder.queue = [(200, ended), (200, {"items": [{**instance, "updated_at": "2099-01-01T00:01:00Z"}]})]

    exit_code, output = run("--api", server, "drain-status", "w-1", "--watch")

    assert exit_code == (1 if forced else 0), output
    assert f"{graceful} instance(s) ended gracefully, {forced} forced" in output


@pytest.mark.parametrize(
    "flags",
    [
        ["--extend", "30m", "--force-now"],
        ["--extend", "30m", "--timeout", "1h"],
        ["--force-now", "--dry-run"],
        ["--extend", "soon"],
        ["--extend", "0"],
    ],
)
def test_given_extend_or_force_now_with_what_starts_a_drain_then_it_is_a_usage_error(
    server: str, flags: list[str]
):
    exit_code, _ = run("--api", server, "drain", "w-1", *flags)

    assert exit_code == 2
    assert Recorder.requests == []


def test_given_no_running_drain_then_extend_says_so_and_changes_nothing(server: str):
    Recorder.answer = (200, {**RUNNING_DRAIN, "status": "SUCCESS"})

    exit_code, output = run("--api", server, "drain", "w-1", "--extend", "1h")

    assert exit_code == 3, output
    assert "no running drain to extend" in output
    assert [m for m, _, _ in Recorder.requests] == ["GET"]


def test_given_the_local_stack_on_another_port_then_a_bare_command_follows_it_and_says_so(
    server: str, monkeypatch: pytest.MonkeyPatch
):
    port = server.rsplit(":", 1)[1]
    monkeypatch.delenv("FLEETKEEPER_API", raising=False)
    monkeypatch.setenv("FLEETKEEPER_API_PORT", port)

    exit_code, output = run("workers")

    assert exit_code == 0, output
    assert [(method, path.split("?")[0]) for method, path, _ in Recorder.requests] == [
        ("GET", "/api/v1/workers")
    ]
    assert f"API http://127.0.0.1:{port} (from FLEETKEEPER_API_PORT={port})" in output


def test_given_the_default_port_then_no_note_and_a_bad_port_is_a_usage_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("FLEETKEEPER_API", raising=False)
    monkeypatch.setenv("FLEETKEEPER_API_PORT", "8080")
    assert resolve_api_target(None, None) == ApiTarget(LOCAL_API)
    monkeypatch.setenv("FLEETKEEPER_API_PORT", "eighty")
    exit_code, output = run("workers")
    assert exit_code == 2
    assert "FLEETKEEPER_API_PORT='eighty' is not a port number" in output


def test_given_the_cli_and_the_local_stack_then_they_default_to_the_same_port():
    from fleetkeeper_local.stack import DEFAULT_API_PORT

    assert f"http://127.0.0.1:{DEFAULT_API_PORT}" == LOCAL_API


def _worker(worker_id: str) -> dict[str, Any]:
    return {
        "id": worker_id,
        "status": "DRAINING",
        "pool": "research-labs-eu-west",
        "template": "lab-large-gpu-accelerated",
        "active_instances": 12,
        "capacity": 16,
        "drain": {"outcome": "RUNNING", "generation": 12},
    }


@pytest.mark.parametrize("width", [80, 60])
def test_given_a_narrow_terminal_then_worker_ids_print_whole_and_other_columns_give_way(
    server: str, width: int
):
    ids = ["w-8bb9fe4038174019", "w-28f13b9ecb3a446a"]
    Recorder.answer = (200, {"items": [_worker(i) for i in ids], "next_token": None})

    exit_code, output = run("--api", server, "workers", width=width)

    assert exit_code == 0, output
    assert max(len(line) for line in output.splitlines()) <= width
    for worker_id in ids:
        assert worker_id in output


@pytest.mark.parametrize(
    ("group", "commands"),
    [
        ("worker", {"show"}),
        ("pool", {"drain", "cancel-drain", "disruption", "capacity"}),
        ("rollout", {"start", "status", "pause", "resume", "cancel", "rollback"}),
    ],
)
def test_given_a_group_then_its_help_names_exactly_the_commands_it_has(group: str, commands: set[str]):
    exit_code, output = run(group, "--help")

    assert exit_code == 0, output
    description = output.split("Options")[0]
    assert set(re.findall(r"`([a-z-]+)`", description)) == commands
    for command in commands:
        assert run(group, command, "--help")[0] == 0


def test_given_a_pool_drain_without_timeout_then_the_help_gives_the_apis_default():
    from fleetkeeper.domain.models import DEFAULT_POOL_DRAIN_TIMEOUT_SECONDS

    exit_code, output = run("pool", "drain", "--help")

    assert exit_code == 0
    assert POOL_DRAIN_DEFAULT_SECONDS == DEFAULT_POOL_DRAIN_TIMEOUT_SECONDS
    assert f"default: {DEFAULT_POOL_DRAIN_TIMEOUT_SECONDS} s" in " ".join(output.split())
    drains_doc = (Path(__file__).parents[2] / "docs" / "drains.md").read_text(encoding="utf-8")
    assert f"({DEFAULT_POOL_DRAIN_TIMEOUT_SECONDS} s when absent" in drains_doc


def test_given_a_rule_broken_by_one_field_then_its_reason_prints_once(server: str):
    reason = "unknown operation 'reboot'; this stage offers: collect-system-info, register-license"
    Recorder.answer = (
        422,
        {
            "error": "INVALID_INPUT",
            "message": f"name: {reason}",
            "details": [{"field": "name", "reason": reason}],
        },
    )

    exit_code, output = run("--api", server, "operation", "run", "w-1", "reboot")

    assert exit_code == 2
    assert output.count("unknown operation") == 1, output


@pytest.mark.parametrize(
    ("items", "line"),
    [
        ([], "no region's breaker ever tripped: orphan GC holds nothing back"),
        (
            [
                {
                    "region": "eu-west-1",
                    "holding": False,
                    "held_back": [],
                    "share_percent": 0,
                    "confirmed_by": None,
                    "confirmed_until": None,
                }
            ],
            "orphan GC holds nothing back in any region",
        ),
    ],
)
def test_given_a_breaker_holding_nothing_then_orphans_show_says_so(
    server: str, items: list[dict[str, Any]], line: str
):
    Recorder.answer = (200, {"items": items})

    exit_code, output = run("--api", server, "orphans", "show")

    assert exit_code == 0, output
    assert line in output


def test_given_instance_state_then_the_cli_reports_it_in_upper_case(server: str):
    Recorder.answer = (200, {"id": "i-1", "state": "RUNNING"})

    exit_code, output = run("--api", server, "instance", "state", "i-1", "running", "--reason", "booted")

    assert exit_code == 0, output
    assert Recorder.requests[-1] == (
        "POST",
        "/api/v1/instances/i-1/state",
        {"state": "RUNNING", "reason": "booted"},
    )
    assert "instance i-1 RUNNING" in output


DISRUPTION_VIEW: dict[str, Any] = {
    "pool": "labs",
    "at": "2026-03-02T09:30:00+00:00",
    "members": 8,
    "in_use": 1,
    "disrupting": ["w-1"],
    "budgets": [
        {
            "index": 0,
            "max": "10%",
            "reasons": ["rollout", "expired", "scale_down", "drift"],
            "schedule": None,
            "duration": None,
            "timezone": None,
            "active": True,
            "allowed": 1,
            "until": None,
            "next_start": None,
        },
        {
            "index": 1,
            "max": 0,
            "reasons": ["scale_down"],
            "schedule": "0 9 * * mon-fri",
            "duration": "8h",
            "timezone": "Europe/Berlin",
            "active": True,
            "allowed": 0,
            "until": "2026-03-02T16:00:00+00:00",
            "next_start": None,
        },
    ],
    "reasons": [
        {
            "reason": "scale_down",
            "governed_by": "pool",
            "applying": [0, 1],
            "limiting": 1,
            "allowed": 0,
            "in_use": 1,
            "available": 0,
            "blocked_until": "2026-03-02T16:00:00+00:00",
        },
        {
            "reason": "rollout",
            "governed_by": "pool",
            "applying": [0],
            "limiting": 0,
            "allowed": 1,
            "in_use": 1,
            "available": 0,
            "blocked_until": None,
        },
    ],
    "stage_default": {"max": "10%", "allowed": 2, "in_use": 1},
    "next_change": "2026-03-02T16:00:00+00:00",
    "waiting": [
        {
            "worker_id": "w-8bb9fe4038174019",
            "reason": "scale_down",
            "action": "drain",
            "budget": 1,
            "allowed": 0,
            "in_use": 1,
            "refused_at": "2026-03-02T09:29:00+00:00",
            "until": "2026-03-02T16:00:00+00:00",
        }
    ],
}


def test_given_pool_disruption_then_budgets_reasons_and_waiting_workers_are_shown(server: str):
    Recorder.answer = (200, DISRUPTION_VIEW)

    exit_code, output = run("--api", server, "pool", "disruption", "labs")

    assert exit_code == 0, output
    assert Recorder.requests[-1] == ("GET", "/api/v1/pools/labs/disruption", None)
    assert "1 of 8 members being disrupted" in output
    assert "0 9 * * mon-fri for 8h (Europe/Berlin)" in output
    assert "until 2026-03-02 16:00:00" in output
    scale_down = next(line for line in output.splitlines() if line.strip("│ ").startswith("scale_down"))
    assert "budget 1" in scale_down
    assert "blocked" in scale_down
    assert "w-8bb9fe4038174019" in output


CAPACITY_VIEW: dict[str, Any] = {
    "pool": "labs",
    "policy": {"template": "lab", "max_workers": 6},
    "at": "2026-03-02T09:30:00+00:00",
    "running": 2,
    "launching": 1,
    "stopping": 0,
    "warm": 1,
    "members": 4,
    "free_slots": 3,
    "lead_time_seconds": 600,
    "bookings_waiting": 5,
    "bookings_due": 2,
    "bookings_at_risk": 1,
    "target": {
        "workers": 6, "warm": 0, "rule": "schedule", "schedule": 0, "active_schedules": [0],
        "headroom_slots": 40, "wanted": 12, "capped": True, "bookings_due": 0,
    },
    "last_cycle": {
        "at": "2026-03-02T09:29:00+00:00", "target": 6, "warm_target": 0, "rule": "schedule", "schedule": 0,
        "started": 1, "created": 0, "refused_at_cap": 0, "note": None,
    },
    "blocked": {
        "reason": "insufficient_capacity", "aws_error": "InsufficientInstanceCapacity", "message": None,
        "since": "2026-03-02T09:20:00+00:00", "retry_at": "2026-03-02T09:36:00+00:00", "refusals": 3,
    },
}  # fmt: skip


def test_given_pool_capacity_then_counts_target_rule_and_blocked_reason_are_shown(server: str):
    Recorder.answer = (200, CAPACITY_VIEW)

    exit_code, output = run("--api", server, "pool", "capacity", "labs")

    assert exit_code == 0, output
    assert Recorder.requests[-1] == ("GET", "/api/v1/pools/labs/capacity", None)
    assert "2 running, 1 launching, 1 warm, 3 free slots; 4 of 6 members" in output
    assert "target: 6 running (capped from 12 by max_workers), 0 warm, set by schedule 0" in output
    assert "started 1, created 0" in output
    assert "BLOCKED: insufficient_capacity (InsufficientInstanceCapacity)" in output
    assert "bookings: 5 waiting for capacity, 2 due, 1 at risk (lead time 10 min)" in output


def test_given_a_placement_booked_then_place_says_when_it_is_expected_ready(server: str):
    booked = {"id": "i-9", "state": "WAITING_FOR_CAPACITY", "worker_id": None,
              "expected_ready_by": "2030-03-04T08:50:00+00:00"}  # fmt: skip
    Recorder.answer = (202, booked)

    exit_code, output = run(
        "--api", server, "place", "--pool", "labs", "--timeslot-start", "2030-03-04T09:00Z"
    )

    assert exit_code == 0, output
    assert Recorder.requests[-1] == (
        "POST",
        "/api/v1/instances",
        {"pool": "labs", "strategy": "pack", "timeslot_start": "2030-03-04T09:00Z"},
    )
    assert (
        "instance i-9 WAITING_FOR_CAPACITY: expected on a RUNNING worker by 2030-03-04T08:50:00+00:00"
        in output
    )


def test_given_bookings_set_the_target_then_pool_capacity_says_how_many_are_due(server: str):
    target = {**CAPACITY_VIEW["target"], "rule": "bookings", "schedule": None, "bookings_due": 2}
    Recorder.answer = (200, {**CAPACITY_VIEW, "target": target})

    exit_code, output = run("--api", server, "pool", "capacity", "labs")

    assert exit_code == 0, output
    assert "set by bookings (2 due)" in output


def test_given_a_drain_beyond_a_budget_then_the_cli_says_which_one(server: str):
    exceeded = {"pool": "labs", "budget": 1, "max": 0, "allowed": 0, "in_use": 1, "until": None}
    Recorder.answer = (202, {"worker_id": "w-1", "status": "RUNNING", "budget_exceeded": exceeded})

    exit_code, output = run("--api", server, "drain", "w-1")

    assert exit_code == 0, output
    assert "goes beyond budget 1 of pool labs (max 0: 1 in use, 0 allowed)" in output


def test_given_budgets_in_a_fleet_file_when_the_api_echoes_them_then_apply_changes_nothing():
    echoed = {
        "name": "labs",
        "description": "labs",
        "disruption": {
            "budgets": [
                {"max": 2, "reasons": None, "schedule": None, "duration": None, "timezone": None},
                {
                    "max": 0,
                    "reasons": ["scale_down"],
                    "schedule": "0 9 * * mon-fri",
                    "duration": "8h",
                    "timezone": "Europe/Berlin",
                },
            ]
        },
    }
    declared = {
        "description": "labs",
        "disruption": {
            "budgets": [
                {"max": "2"},
                {
                    "max": 0,
                    "reasons": ["scale_down"],
                    "schedule": "0 9 * * mon-fri",
                    "duration": "8h",
                    "timezone": "Europe/Berlin",
                },
            ]
        },
    }

    assert fleetfile._diff("pool", "labs", declared, echoed).action == "unchanged"
    tighter = {**declared, "disruption": {"budgets": [{"max": 1}]}}
    change = fleetfile._diff("pool", "labs", tighter, echoed)
    assert (change.action, change.body) == ("update", tighter)


def _worker_body(worker_id: str, drift: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": worker_id,
        "status": "RUNNING",
        "pool": "labs",
        "template": "lab",
        "active_instances": 0,
        "capacity": 4,
        "drain": None,
        "drift": drift,
    }


def test_given_workers_drifted_then_the_cli_asks_for_drifted_workers_and_shows_why(server: str):
    drift = {
        "reasons": ["image", "expired"],
        "desired": {"image_id": "ami-new", "instance_type": "m5.large"},
        "since": "2026-02-01T12:00:00Z",
    }
    Recorder.answer = (200, {"items": [_worker_body("w-1", drift)], "next_token": None})

    exit_code, output = run("--api", server, "workers", "--drifted")

    assert exit_code == 0, output
    path = Recorder.requests[0][1]
    assert path.startswith("/api/v1/workers?")
    assert "drifted=true" in path
    assert "image,expired" in output


def test_given_worker_show_then_the_drift_and_what_the_worker_should_run_are_shown(server: str):
    drift = {
        "reasons": ["instance_type"],
        "desired": {"image_id": "ami-new", "instance_type": "m5.xlarge"},
        "since": "2026-02-01T12:00:00Z",
    }
    Recorder.answer = (200, {**_worker_body("w-1", drift), "region": "us-east-1", "version": 3})

    exit_code, output = run("--api", server, "worker", "show", "w-1")

    assert exit_code == 0, output
    assert "instance_type" in output
    assert "m5.xlarge" in output
    assert "2026-02-01T12:00:00Z" in output


def test_given_workers_without_drifted_then_no_drift_filter_is_sent(server: str):
    Recorder.answer = (200, {"items": [_worker_body("w-1", None)], "next_token": None})

    exit_code, output = run("--api", server, "workers")

    assert exit_code == 0, output
    assert "drifted" not in Recorder.requests[0][1]


def test_given_a_lifetime_in_a_fleet_file_then_apply_sets_it_and_a_file_without_it_lifts_it():
    echoed = {
        "name": "lab",
        "instance_type": "m5.large",
        "ami_name_filter": "lab-*",
        "capacity": 4,
        "drain_timeout_hours": 4.0,
        "tags": {},
        "max_lifetime_hours": None,
        "version": 1,
    }
    declared = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 4}

    unchanged = fleetfile._diff("template", "lab", {**fleetfile.TEMPLATE_DEFAULTS, **declared}, echoed)
    assert unchanged.action == "unchanged"
    limited = {**fleetfile.TEMPLATE_DEFAULTS, **declared, "max_lifetime_hours": 720}
    automatic = fleetfile._diff("template", "lab", {**limited, "auto_rollout": True}, echoed)
    assert automatic.fields["auto_rollout"] == (None, True)
    assert automatic.body["auto_rollout"] is True
    change = fleetfile._diff("template", "lab", limited, echoed)
    assert (change.action, change.fields) == ("update", {"max_lifetime_hours": (None, 720)})
    assert change.body["max_lifetime_hours"] == 720
    lifted = fleetfile._diff(
        "template", "lab", {**fleetfile.TEMPLATE_DEFAULTS, **declared}, {**echoed, "max_lifetime_hours": 720}
    )
    assert lifted.fields == {"max_lifetime_hours": (720, None)}


def test_given_a_template_update_then_its_body_keeps_every_field_the_file_does_not_declare():
    # A template PUT replaces the whole spec: a field the body leaves out is lost on the server.
    current = {
        "name": "licensed",
        "instance_type": "m5.large",
        "ami_name_filter": "lab-*",
        "capacity": 4,
        "drain_timeout_hours": 4.0,
        "tags": {},
        "before_stop": ["deregister-license"],
        "max_lifetime_hours": None,
        "version": 3,
    }
    declared = {**fleetfile.TEMPLATE_DEFAULTS, "instance_type": "m5.xlarge", "ami_name_filter": "lab-*"}

    change = fleetfile._diff("template", "licensed", {**declared, "capacity": 4}, current)

    assert change.action == "update"
    assert change.body["before_stop"] == ["deregister-license"]
    assert set(fleetfile.TEMPLATE_FIELDS) == set(TemplateSpec.model_fields)
