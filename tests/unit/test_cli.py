"""The `fleetkeeper` CLI without a server: targets, signing, durations, fleet files, help and exit codes."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

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

    def _serve(self) -> None:
        Recorder.seen.append({k.lower(): v for k, v in self.headers.items()})
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        Recorder.requests.append((self.command, self.path, json.loads(raw) if raw else None))
        status, body = Recorder.answer
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = do_PUT = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Recorder.seen = []
    Recorder.requests = []
    Recorder.answer = (200, {"items": []})
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


def test_given_no_server_then_exit_1_with_a_hint():
    exit_code, output = run("--api", "http://127.0.0.1:9", "workers")
    assert exit_code == 1
    assert "cannot reach the API at http://127.0.0.1:9" in output


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
        ["orphans", "show"],
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
    from fleetkeeper_local.__main__ import DEFAULT_API_PORT

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


@pytest.mark.parametrize(("group", "commands"), [("worker", {"show"}), ("pool", {"drain", "cancel-drain"})])
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
