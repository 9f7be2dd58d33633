"""Tracing: the X-Ray SDK is paid for only where tracing is on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.observability import tracer, tracing_disabled

LAYER = Path(__file__).resolve().parents[2] / "layers" / "fleetkeeper" / "python"


def _imports_xray_core(environment: dict[str, str], probe: str = "aws_xray_sdk.core") -> str:
    code = f"import sys, fleetkeeper.observability as o; print({probe!r} in sys.modules, o.tracer.disabled)"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("POWERTOOLS_TRACE", "LAMBDA_TASK", "AWS_SAM"))
    }
    env |= {"PYTHONPATH": str(LAYER), "AWS_DEFAULT_REGION": "us-east-1", **environment}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)  # noqa: S603
    return done.stdout.strip()


def test_given_tracing_disabled_in_lambda_when_imported_then_the_xray_sdk_core_is_not_loaded() -> None:
    assert (
        _imports_xray_core({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "true"})
        == "False True"
    )


def test_given_tracing_on_in_lambda_when_imported_then_the_tracer_uses_xray() -> None:
    assert _imports_xray_core({"LAMBDA_TASK_ROOT": "/var/task"}) == "True False"


def test_given_tracing_on_when_imported_then_only_botocore_is_patched() -> None:
    # requests is installed in the test environment; patch_all would import it for the X-Ray SDK to patch.
    assert _imports_xray_core({"LAMBDA_TASK_ROOT": "/var/task"}, probe="requests") == "False False"


@pytest.mark.parametrize(
    ("environment", "disabled"),
    [
        ({"LAMBDA_TASK_ROOT": "/var/task"}, False),
        ({"LAMBDA_TASK_ROOT": "/var/task", "POWERTOOLS_TRACE_DISABLED": "1"}, True),
        ({"LAMBDA_TASK_ROOT": "/var/task", "AWS_SAM_LOCAL": "true"}, True),
        ({}, True),
    ],
)
def test_given_an_environment_when_asked_then_tracing_is_on_only_in_lambda_and_not_disabled(
    monkeypatch: pytest.MonkeyPatch, environment: dict[str, str], disabled: bool
) -> None:
    for name in ("LAMBDA_TASK_ROOT", "POWERTOOLS_TRACE_DISABLED", "AWS_SAM_LOCAL", "AWS_CHALICE_CLI_MODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert tracing_disabled() is disabled


def test_given_tracing_disabled_when_a_traced_handler_runs_then_it_answers_and_its_errors_propagate() -> None:
    @tracer.capture_lambda_handler
    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        if event.get("fail"):
            raise ValueError("bad event")
        return {"ok": event["value"]}

    assert tracer.disabled
    assert handler({"value": 1}, None) == {"ok": 1}
    with pytest.raises(ValueError, match="bad event"):
        handler({"fail": True}, None)
