"""Worker machines launch with an instance profile the SSM agent can register with, and read only their
stage's operation parameters; the reconciler may pass that one role, to EC2 only."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from aws_cdk.assertions import Template

from infra.config import ConfigError
from tests.infra.conftest import PINNED_ACCOUNT, PINNED_PROFILE, shipped_cdk_json_context
from tests.infra.helpers import flat, function_properties, grants_of_function, properties, resources
from tests.infra.test_config import load, with_setting

FUNCTIONS = ("api", "drain-tasks", "reconcile", "discover", "ec2-events")
PARAMETER_READS = {"ssm:GetParameter", "ssm:GetParameters"}


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def worker_role(template: Template) -> tuple[str, dict[str, Any]]:
    (logical_id,) = [
        logical for logical in resources(template, "AWS::IAM::Role") if "WorkerProfile" in logical
    ]
    return logical_id, resources(template, "AWS::IAM::Role")[logical_id]["Properties"]


def statements_of_role(template: Template, role: str) -> list[dict[str, Any]]:
    return [
        statement
        for policy in properties(template, "AWS::IAM::Policy")
        if {"Ref": role} in policy.get("Roles", [])
        for statement in policy["PolicyDocument"]["Statement"]
    ]


def pass_role_grants(template: Template, stage: str, function: str) -> list[Any]:
    return [
        g
        for g in grants_of_function(template, f"fleetkeeper-{stage}-{function}")
        if g.action == "iam:PassRole"
    ]


def test_given_a_stage_without_its_own_profile_then_it_creates_the_workers_role_and_profile(dev):
    role, props = worker_role(dev)
    (profile,) = properties(dev, "AWS::IAM::InstanceProfile")
    assert profile["Roles"] == [{"Ref": role}]
    assert profile["InstanceProfileName"] == "fleetkeeper-dev-worker"
    (trust,) = props["AssumeRolePolicyDocument"]["Statement"]
    assert (trust["Principal"], trust["Action"]) == ({"Service": "ec2.amazonaws.com"}, "sts:AssumeRole")
    # The SSM agent registers with Systems Manager through the policy AWS maintains for it.
    assert [flat(arn) for arn in props["ManagedPolicyArns"]] == [
        "arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore"
    ]


def test_given_the_workers_role_then_it_reads_and_decrypts_only_the_stages_operation_parameters(dev):
    role, _ = worker_role(dev)
    statements = statements_of_role(dev, role)
    prefix = "arn:aws:ssm:eu-west-1:<AWS::AccountId>:parameter/fleetkeeper/dev/*"

    (reads,) = [
        s for s in statements if s["Effect"] == "Allow" and set(as_list(s["Action"])) == PARAMETER_READS
    ]
    assert [flat(r) for r in as_list(reads["Resource"])] == [prefix]
    assert "Condition" not in reads

    # The managed policy allows GetParameter(s) on every parameter: the Deny is what confines the role.
    (deny,) = [s for s in statements if s["Effect"] == "Deny"]
    assert set(deny["Action"]) == PARAMETER_READS | {"ssm:GetParametersByPath", "ssm:GetParameterHistory"}
    assert [flat(r) for r in as_list(deny["NotResource"])] == [
        "arn:aws:ssm:*:<AWS::AccountId>:parameter/fleetkeeper/dev/*"
    ]

    (decrypt,) = [s for s in statements if s["Action"] == "kms:Decrypt"]
    assert [flat(r) for r in as_list(decrypt["Resource"])] == ["arn:aws:kms:eu-west-1:<AWS::AccountId>:key/*"]
    condition = decrypt["Condition"]
    assert set(condition) == {"StringEquals", "StringLike"}
    assert as_list(condition["StringEquals"]["kms:ViaService"]) == ["ssm.eu-west-1.amazonaws.com"]
    (parameters,) = as_list(condition["StringLike"]["kms:EncryptionContext:PARAMETER_ARN"])
    assert flat(parameters) == prefix


def test_given_the_workers_role_then_it_may_put_only_the_cloudwatch_agents_metrics(dev):
    role, _ = worker_role(dev)
    (put,) = [s for s in statements_of_role(dev, role) if s["Action"] == "cloudwatch:PutMetricData"]
    assert put["Condition"] == {"StringEquals": {"cloudwatch:namespace": "CWAgent"}}
    allowed = {
        a for s in statements_of_role(dev, role) if s["Effect"] == "Allow" for a in as_list(s["Action"])
    }
    assert allowed == PARAMETER_READS | {"kms:Decrypt", "cloudwatch:PutMetricData"}


def test_given_the_reconciler_then_it_launches_with_the_profile_and_passes_only_its_role_to_ec2(dev):
    role, _ = worker_role(dev)
    (profile,) = resources(dev, "AWS::IAM::InstanceProfile")
    env = function_properties(dev, "fleetkeeper-dev-reconcile")["Environment"]["Variables"]
    assert env["WORKER_INSTANCE_PROFILE"] == {"Ref": profile}
    (grant,) = pass_role_grants(dev, "dev", "reconcile")
    assert json.loads(grant.resource) == {"Fn::GetAtt": [role, "Arn"]}
    assert grant.conditions == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}


@pytest.mark.parametrize("function", [f for f in FUNCTIONS if f != "reconcile"])
def test_given_any_other_function_then_it_may_pass_no_role(dev, function):
    assert pass_role_grants(dev, "dev", function) == []


def test_given_a_stage_naming_its_own_profile_then_it_creates_none_and_passes_that_profiles_role(pinned):
    assert resources(pinned, "AWS::IAM::InstanceProfile") == {}
    assert not [logical for logical in resources(pinned, "AWS::IAM::Role") if "WorkerProfile" in logical]
    env = function_properties(pinned, "fleetkeeper-pinned-reconcile")["Environment"]["Variables"]
    assert env["WORKER_INSTANCE_PROFILE"] == PINNED_PROFILE["name"]
    (grant,) = pass_role_grants(pinned, "pinned", "reconcile")
    assert flat(json.loads(grant.resource)) == f"arn:aws:iam::{PINNED_ACCOUNT}:role/{PINNED_PROFILE['role']}"
    assert grant.conditions == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}
    outputs = pinned.find_outputs("WorkerInstanceProfile")
    assert outputs["WorkerInstanceProfile"]["Value"] == PINNED_PROFILE["name"]


@pytest.mark.parametrize(
    ("profile", "key"),
    [
        ({"name": "ok"}, "worker_instance_profile.role"),
        ({"name": "bad name", "role": "r"}, "worker_instance_profile.name"),
        ({"name": "ok", "role": "arn:aws:iam::123456789012:role/r"}, "worker_instance_profile.role"),
    ],
)
def test_given_a_bad_profile_setting_then_the_synth_names_the_key(profile, key):
    with pytest.raises(ConfigError, match=rf"'fleetkeeper:stages\.dev\.{key}'"):
        load(with_setting("dev", ("worker_instance_profile",), profile), "dev")


@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_given_the_shipped_catalogue_then_register_license_names_only_parameters_a_worker_may_read(stage):
    # A name outside the stage's prefix would be denied on the machine; the API refuses it up front.
    spec = shipped_cdk_json_context()["fleetkeeper:stages"][stage]["operations"]["catalogue"][
        "register-license"
    ]
    parameter = spec["parameters"]["licenseParameter"]
    assert re.match(parameter["pattern"], parameter["default"])
    assert parameter["default"].startswith(f"/fleetkeeper/{stage}/")
    for outside in ("/fleetkeeper/other/license-token", "/prod/db-password", f"/fleetkeeper/{stage}"):
        assert not re.match(parameter["pattern"], outside), outside
