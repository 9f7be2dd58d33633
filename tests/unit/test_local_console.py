"""What the local control plane's console shows: one line per event, no metric blobs, no tracebacks for
clients that left."""

from __future__ import annotations

import io
import json
import socket
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from fleetkeeper_local.console import WithoutMetrics, hide_metrics_when_disabled
from fleetkeeper_local.controlplane import _LocalServer

EMF = json.dumps({"_aws": {"Timestamp": 1, "CloudWatchMetrics": []}, "OperationSucceeded": 1.0})


def test_given_metric_lines_among_others_then_only_the_others_reach_the_console():
    console = io.StringIO()
    out = WithoutMetrics(console)

    print("08:12:03  drain of w-1 started by alice", file=out)
    print(EMF, file=out)
    out.write('{"not": "a metric"}\n')
    print(EMF[:5], end="", file=out)  # a metric line written in two parts
    print(EMF[5:], file=out)

    assert console.getvalue() == '08:12:03  drain of w-1 started by alice\n{"not": "a metric"}\n'


def test_given_a_line_without_its_end_then_it_shows_at_once_unless_it_may_be_a_metric():
    console = io.StringIO()
    out = WithoutMetrics(console)

    out.write("\rIAM: synthesizing: 12 s, about 30 s left")
    assert console.getvalue() == "\rIAM: synthesizing: 12 s, about 30 s left"
    out.write('{"_a')
    assert console.getvalue() == "\rIAM: synthesizing: 12 s, about 30 s left"


@pytest.mark.parametrize(("disabled", "hidden"), [("true", True), ("false", False)])
def test_given_metrics_off_then_the_console_hides_their_lines_and_shows_them_when_on(
    monkeypatch: pytest.MonkeyPatch, disabled: str, hidden: bool
):
    console = io.StringIO()
    monkeypatch.setattr(sys, "stdout", console)
    monkeypatch.setenv("POWERTOOLS_METRICS_DISABLED", disabled)

    hide_metrics_when_disabled()
    print(EMF)

    assert (console.getvalue() == "") == hidden


class _Failing(BaseHTTPRequestHandler):
    """Fails every request with `error` before answering."""

    error: ClassVar[type[Exception]] = ConnectionResetError

    def do_GET(self) -> None:
        raise self.error


@pytest.fixture
def server() -> Iterator[_LocalServer]:
    httpd = _LocalServer(("127.0.0.1", 0), _Failing)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield httpd
    httpd.shutdown()
    httpd.server_close()


def _ask(server: _LocalServer) -> None:
    host, port = server.server_address[:2]
    with socket.create_connection((str(host), int(port)), timeout=5) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        client.recv(1)  # until the server closed the connection


@pytest.mark.parametrize(
    ("error", "traceback"), [(BrokenPipeError, False), (ConnectionResetError, False), (ValueError, True)]
)
def test_given_a_request_that_fails_then_a_traceback_only_when_the_client_did_not_just_leave(
    server: _LocalServer, capsys: pytest.CaptureFixture[str], error: type[Exception], traceback: bool
):
    _Failing.error = error

    _ask(server)

    assert ("Traceback" in capsys.readouterr().err) == traceback
