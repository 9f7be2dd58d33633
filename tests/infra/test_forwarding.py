"""Every worker region other than the home region forwards its EC2 events to the home region's bus."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template
from cfnlint.api import ManualArgs, lint_file

from infra.forwarding import FORWARDED_DETAIL_TYPES, EventForwardingStack
from infra.triggers import EC2_REBALANCE_RECOMMENDATION, EC2_SPOT_INTERRUPTION, EC2_STATE_CHANGE, HEALTH_EVENT
from tests.infra.helpers import properties
from tests.infra.test_cfn_lint import IGNORED_CHECKS


def flat(value) -> str:
    """An ARN as text, whether the stage pins its account (a string) or not (Fn::Join)."""
    if isinstance(value, str):
        return value
    return "".join(flat(part) if not isinstance(part, dict) else "{token}" for part in value["Fn::Join"][1])


def forwarder_template(synthesized, stage: str, region: str) -> Template:
    return Template.from_stack(synthesized.stacks[stage].forwarders[region])


def test_given_one_worker_region_then_no_forwarder_is_deployed(synthesized):
    assert synthesized.stacks["dev"].forwarders == {}
    assert synthesized.stacks["prod"].forwarders == {}


def test_given_two_worker_regions_then_the_other_region_gets_a_forwarder_in_that_region(synthesized):
    stack = synthesized.stacks["pinned"]
    assert set(stack.forwarders) == {"us-east-1"}
    forwarder = stack.forwarders["us-east-1"]
    assert forwarder.region == "us-east-1"
    assert forwarder.account == stack.account
    assert stack.region == "eu-west-1"


def test_given_a_forwarder_then_state_changes_and_spot_warnings_go_to_the_home_default_bus(synthesized):
    template = forwarder_template(synthesized, "pinned", "us-east-1")
    rules = properties(template, "AWS::Events::Rule")
    patterns = sorted(rule["EventPattern"]["detail-type"][0] for rule in rules)
    # The pinned stage acts on rebalance recommendations, so its forwarders send them home too.
    assert patterns == sorted([*FORWARDED_DETAIL_TYPES, EC2_REBALANCE_RECOMMENDATION, HEALTH_EVENT])
    assert sorted(FORWARDED_DETAIL_TYPES) == sorted([EC2_STATE_CHANGE, EC2_SPOT_INTERRUPTION])
    for rule in rules:
        health = rule["EventPattern"]["detail-type"] == [HEALTH_EVENT]
        assert rule["EventPattern"]["source"] == (["aws.health"] if health else ["aws.ec2"])
        (target,) = rule["Targets"]
        arn = flat(target["Arn"])
        assert ":events:eu-west-1:" in arn
        assert arn.endswith(":event-bus/default")
        assert "DeadLetterConfig" in target


def test_given_a_forwarder_then_its_role_may_only_put_events_on_the_home_bus(synthesized):
    template = forwarder_template(synthesized, "pinned", "us-east-1")
    policies = properties(template, "AWS::IAM::Policy")
    statements = [s for policy in policies for s in policy["PolicyDocument"]["Statement"]]
    assert [s["Action"] for s in statements] == ["events:PutEvents"]
    resource = flat(statements[0]["Resource"])
    assert ":events:eu-west-1:" in resource
    assert resource.endswith(":event-bus/default")
    (role,) = properties(template, "AWS::IAM::Role")
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "events.amazonaws.com"}
    assert "aws:SourceAccount" in trust["Condition"]["StringEquals"]


def test_given_a_forwarder_then_undelivered_events_raise_an_alarm_in_its_region(synthesized):
    template = forwarder_template(synthesized, "pinned", "us-east-1")
    (alarm,) = properties(template, "AWS::CloudWatch::Alarm")
    assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
    assert alarm["Threshold"] == 0


def test_given_a_forwarder_then_cfn_lint_and_cdk_nag_report_nothing(synthesized):
    forwarder = synthesized.stacks["pinned"].forwarders["us-east-1"]
    path = synthesized.outdir / f"{forwarder.artifact_id}.template.json"
    matches = lint_file(path, config=ManualArgs(regions=["us-east-1"], ignore_checks=IGNORED_CHECKS))
    assert [f"{m.rule.id} {m.message}" for m in matches] == []
    assert synthesized.validation_error is None


def test_given_the_home_region_then_a_forwarder_there_is_refused():
    from aws_cdk import App

    from infra.config import load_stage_config
    from tests.infra.conftest import context_with_pinned_stage

    context = {**context_with_pinned_stage(), "stage": "pinned"}
    config = load_stage_config(context.get)
    with pytest.raises(ValueError, match="home region"):
        EventForwardingStack(App(), config=config, region=config.region)
