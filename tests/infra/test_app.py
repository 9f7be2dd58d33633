"""The CDK entry point selects one stage from the context and explains a missing or wrong one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from infra import app as cdk_app
from infra.config import STAGE_KEY
from infra.stack import FleetkeeperStack
from tests.infra.conftest import CDK_JSON, ROOT, cdk_json_context


def test_given_stage_prod_when_building_the_app_then_it_holds_the_prod_stack_only():
    app = cdk_app.build_app({**cdk_json_context(), STAGE_KEY: "prod"})
    stacks = [child for child in app.node.children if isinstance(child, FleetkeeperStack)]
    assert [stack.stack_name for stack in stacks] == ["fleetkeeper-prod"]
    assert stacks[0].region == "eu-west-1"
    assert stacks[0].termination_protection is True


def test_given_no_stage_when_the_cdk_cli_runs_the_app_then_it_exits_2_and_says_how_to_choose():
    # The CDK CLI hands the app its context in CDK_CONTEXT_JSON, as here; a fresh process reads it.
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(cdk_json_context())}
    result = subprocess.run(
        [sys.executable, "-m", "infra.app"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert "pass -c stage=<dev|prod>" in result.stderr


def test_given_the_cdk_json_then_the_app_runs_from_the_project_virtualenv_without_telemetry():
    settings = json.loads(CDK_JSON.read_text(encoding="utf-8"))
    assert settings["app"] == ".venv/bin/python -m infra.app"
    assert settings["versionReporting"] is False
