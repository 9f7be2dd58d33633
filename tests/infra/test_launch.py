"""Launch hardening: every RunInstances requires IMDSv2 and one of the stage's instance types, and a
stage whose launches are not pinned to a subnet and security groups says so on every synth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config import STAGE_KEY, ConfigError
from tests.infra.conftest import ROOT, cdk_json_context, shipped_cdk_json_context
from tests.infra.helpers import flat, function_properties, grants_of_function
from tests.infra.test_config import load, with_setting

STAGES = ("dev", "prod", "pinned")


def instance_statement_conditions(template, stage):
    """The one condition every RunInstances grant on instances carries (one resource per worker region)."""
    (condition,) = {
        g.condition
        for g in grants_of_function(template, f"fleetkeeper-{stage}-reconcile")
        if g.action == "ec2:RunInstances" and flat(json.loads(g.resource)).endswith(":instance/*")
    }
    return json.loads(condition)


@pytest.mark.parametrize("stage", STAGES)
def test_given_run_instances_then_the_instance_must_require_imdsv2_and_be_of_the_stages_types(
    synthesized, stage
):
    conditions = instance_statement_conditions(synthesized.template(stage), stage)
    assert set(conditions) == {"StringEquals"}
    equals = conditions["StringEquals"]
    assert equals["ec2:MetadataHttpTokens"] == "required"
    expected = list(
        shipped_cdk_json_context()["fleetkeeper:stages"]["dev" if stage == "pinned" else stage][
            "instance_types"
        ]
    )
    assert equals["ec2:InstanceType"] == expected
    assert equals["aws:RequestTag/fleetkeeper:managed-by"] == "fleetkeeper"


@pytest.mark.parametrize("function", ["api", "reconcile"])
def test_given_the_stages_instance_types_then_the_api_and_the_reconciler_know_them(dev, function):
    env = function_properties(dev, f"fleetkeeper-dev-{function}")["Environment"]["Variables"]
    assert env["INSTANCE_TYPES"] == "m5.large,m5.xlarge,m5.2xlarge,c5.xlarge"


@pytest.mark.parametrize(("value", "message"), [([], "at least 1 item"), (["m5 large"], "pattern")])
def test_given_bad_instance_types_then_the_synth_names_the_key(value, message):
    with pytest.raises(ConfigError, match=rf"'fleetkeeper:stages\.dev\.instance_types[.0-9]*': .*{message}"):
        load(with_setting("dev", ("instance_types",), value), "dev")


def test_given_dev_then_its_unpinned_launch_network_is_explained_and_prod_has_nothing_to_explain():
    (note,) = load(cdk_json_context(), "dev").unpinned_network_notes()
    assert "launches in eu-west-1 are not pinned (subnet_id and security_group_ids unset" in note
    assert "require_pinned_network" in note
    assert load(cdk_json_context(), "prod").unpinned_network_notes() == []
    half = with_setting("dev", ("regions", "eu-west-1", "subnet_id"), "subnet-0a1b2c3d")
    (note,) = load(half, "dev").unpinned_network_notes()
    assert "(security_group_ids unset in fleetkeeper:stages.dev.regions.eu-west-1)" in note


@pytest.mark.slow
def test_given_cdk_synth_of_dev_then_it_prints_why_launches_are_not_pinned(tmp_path: Path):
    # As the CDK CLI runs the app: the context in CDK_CONTEXT_JSON, the output directory in CDK_OUTDIR.
    context = {**shipped_cdk_json_context(), STAGE_KEY: "dev"}
    env = {**os.environ, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "infra.app"], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "fleetkeeper: NOTE stage dev: launches in eu-west-1 are not pinned" in result.stderr
