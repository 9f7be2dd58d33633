"""cdk-nag's AwsSolutions pack finds nothing unacknowledged, and every acknowledgment says why."""

from __future__ import annotations

import json

import pytest
from aws_cdk import App, Validations
from aws_cdk import aws_iam as iam

from infra.app import add_stage
from infra.config import STAGE_KEY, load_stage_config
from tests.infra.conftest import context_with_pinned_stage

ACKNOWLEDGED_KEY = Validations.ACKNOWLEDGED_RULES_METADATA_KEY
# Adding a rule here is a review decision: each needs a reason specific to this system.
ACCEPTED_RULES = {"IAM4", "IAM5", "SQS3", "APIG3", "COG4", "L1"}
VAGUE_REASONS = {"n/a", "todo", "not needed", "suppressed", "false positive", "ok", "accepted", "by design"}


def violations(report):
    return sorted(
        (violation["ruleName"], construct["constructPath"])
        for plugin in report.get("pluginReports", [])
        for violation in plugin.get("violations", [])
        for construct in violation.get("violatingConstructs", [])
    )


def acknowledgments(synthesized):
    found = []
    for stack in synthesized.stacks.values():
        for construct in stack.node.find_all():
            for entry in construct.node.metadata:
                if entry.type == ACKNOWLEDGED_KEY:
                    found += [(construct.node.path, rule, reason) for rule, reason in entry.data.items()]
    return found


def test_given_the_synthesized_stages_then_no_finding_is_left_unacknowledged(synthesized):
    assert violations(synthesized.validation_report()) == []
    assert synthesized.validation_error is None


def test_given_the_synthesized_stages_then_no_construct_reports_an_error_or_warning(synthesized):
    messages = [
        (construct.node.path, entry.type, entry.data)
        for stack in synthesized.stacks.values()
        for construct in stack.node.find_all()
        for entry in construct.node.metadata
        if entry.type in {"aws:cdk:error", "aws:cdk:warning"}
    ]
    assert messages == []


def test_given_every_acknowledgment_then_it_names_an_accepted_rule_and_a_specific_reason(synthesized):
    found = acknowledgments(synthesized)
    assert found, "the stacks acknowledge findings, so the walk must find them"
    for path, rule, reason in found:
        rule_id = rule.split("AwsSolutions-", 1)[1]
        assert rule_id.split("[", 1)[0] in ACCEPTED_RULES, (path, rule)
        assert reason.strip().lower() not in VAGUE_REASONS, (path, rule)
        assert len(reason.split()) >= 10, (path, rule, reason)


def test_given_wildcard_acknowledgments_then_each_names_the_resource_it_accepts(synthesized):
    wildcards = [rule for _, rule, _ in acknowledgments(synthesized) if "IAM5" in rule]
    assert wildcards
    assert all("[Resource::" in rule for rule in wildcards), (
        "IAM5 is acknowledged per resource, never wholesale"
    )


@pytest.mark.slow
def test_given_an_unjustified_wildcard_when_synthesizing_then_cdk_nag_fails_the_synth(tmp_path):
    context = context_with_pinned_stage()
    app = App(context=context, outdir=str(tmp_path))
    stack = add_stage(app, load_stage_config({**context, STAGE_KEY: "dev"}.get))
    rogue = iam.Role(stack, "Rogue", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    rogue.add_to_policy(iam.PolicyStatement(actions=["ec2:DescribeVpcs"], resources=["*"]))

    with pytest.raises(RuntimeError, match="ValidationFailed"):
        app.synth()

    report = json.loads((tmp_path / "validation-report.json").read_text(encoding="utf-8"))
    assert violations(report) == [
        ("AwsSolutions-IAM5[Resource::*]", "Fleetkeeper-dev/Rogue/DefaultPolicy/Resource")
    ]
