"""Least privilege: each function holds exactly the actions it calls, EC2 only on fleetkeeper's machines."""

from __future__ import annotations

import json

import pytest

from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE
from tests.infra.helpers import (
    actions_of_function,
    flat,
    function_properties,
    grants_of_function,
    properties,
    resources,
)

LOGS_AND_TRACES = {
    "logs:CreateLogStream",
    "logs:PutLogEvents",
    "xray:PutTraceSegments",
    "xray:PutTelemetryRecords",
}
TABLE = {
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:Query",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:ConditionCheckItem",
}
TASK_RESPONSE = {"states:SendTaskSuccess", "states:SendTaskFailure"}
ASYNC_DLQ = {"sqs:SendMessage", "sqs:GetQueueAttributes", "sqs:GetQueueUrl"}
NOTIFY = {"sns:Publish", "kms:GenerateDataKey", "kms:Decrypt"}
RUN_COMMAND = {"ssm:SendCommand", "ssm:GetCommandInvocation", "ssm:CancelCommand", "ssm:ListCommands"}

EXPECTED_ACTIONS = {
    "api": LOGS_AND_TRACES
    | TABLE
    | TASK_RESPONSE
    | {"dynamodb:DeleteItem", "states:StartExecution", "events:PutEvents"},
    "drain-tasks": LOGS_AND_TRACES
    | TABLE
    | TASK_RESPONSE
    | NOTIFY
    | RUN_COMMAND
    | {"ec2:StopInstances", "ec2:TerminateInstances", "events:PutEvents", "states:StartExecution"},
    "reconcile": LOGS_AND_TRACES
    | TABLE
    | ASYNC_DLQ
    | NOTIFY
    | RUN_COMMAND
    | {
        "ec2:DescribeInstances",
        "ec2:DescribeImages",
        "ec2:RunInstances",
        "ec2:CreateTags",
        "ec2:StartInstances",
        "ec2:StopInstances",
        "ec2:TerminateInstances",
        "cloudwatch:GetMetricData",
        "states:SendTaskSuccess",
        "states:SendTaskFailure",
        "states:SendTaskHeartbeat",
        "states:StartExecution",
        "states:DescribeExecution",
        "events:PutEvents",
    },
    "discover": LOGS_AND_TRACES
    | TABLE
    | ASYNC_DLQ
    | {
        "ec2:DescribeInstances",
        "ec2:DescribeImages",
        "ec2:CreateTags",
        "events:PutEvents",
        "states:SendTaskSuccess",
        "states:SendTaskFailure",
    },
    "ec2-events": LOGS_AND_TRACES
    | TABLE
    | ASYNC_DLQ
    | TASK_RESPONSE
    | {"ec2:DescribeInstances", "states:StartExecution", "events:PutEvents"},
}
MANAGED = {"StringEquals": {f"aws:ResourceTag/{MANAGED_BY_TAG}": MANAGED_BY_VALUE}}


def fn(stage: str, function: str) -> str:
    return f"fleetkeeper-{stage}-{function}"


@pytest.mark.parametrize("function", sorted(EXPECTED_ACTIONS))
def test_given_a_function_then_its_role_allows_exactly_what_it_calls(dev, function):
    assert actions_of_function(dev, fn("dev", function)) == EXPECTED_ACTIONS[function]


@pytest.mark.parametrize("stage", ["dev", "prod", "pinned"])
def test_given_any_policy_then_no_action_is_a_wildcard(synthesized, stage):
    template = synthesized.template(stage)
    documents = [p["PolicyDocument"] for p in properties(template, "AWS::IAM::Policy")]
    documents += [p["PolicyDocument"] for p in properties(template, "AWS::IAM::ManagedPolicy")]
    for document in documents:
        for statement in document["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert not [action for action in actions if "*" in action], statement


def test_given_the_roles_then_none_carries_a_managed_policy_except_api_gateways_logging_role(dev):
    with_managed = [
        logical
        for logical, role in resources(dev, "AWS::IAM::Role").items()
        if role["Properties"].get("ManagedPolicyArns")
    ]
    assert len(with_managed) == 1
    assert with_managed[0].startswith("ApiRestApiCloudWatchRole")


@pytest.mark.parametrize("stage", ["dev", "prod", "pinned"])
@pytest.mark.parametrize("function", sorted(EXPECTED_ACTIONS))
def test_given_ec2_lifecycle_calls_then_they_only_reach_instances_tagged_managed_by(
    synthesized, stage, function
):
    lifecycle = {"ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances"}
    for grant in grants_of_function(synthesized.template(stage), fn(stage, function)):
        if grant.action in lifecycle:
            assert grant.conditions == MANAGED, grant
            assert flat(json.loads(grant.resource)).endswith(":instance/*")


def test_given_run_instances_then_the_instance_must_be_tagged_managed_by_in_the_request(dev):
    run = [g for g in grants_of_function(dev, fn("dev", "reconcile")) if g.action == "ec2:RunInstances"]
    on_instances = [g for g in run if flat(json.loads(g.resource)).endswith(":instance/*")]
    assert len(on_instances) == 1
    assert on_instances[0].conditions == {
        "StringEquals": {f"aws:RequestTag/{MANAGED_BY_TAG}": MANAGED_BY_VALUE}
    }
    others = {flat(json.loads(g.resource)).split(":")[-1].split("/")[0] for g in run if g not in on_instances}
    assert others == {"image", "volume", "network-interface", "subnet", "security-group"}


def test_given_run_instances_then_images_are_only_those_of_the_stages_ami_owners(dev):
    run = [g for g in grants_of_function(dev, fn("dev", "reconcile")) if g.action == "ec2:RunInstances"]
    images = [g for g in run if ":image/" in flat(json.loads(g.resource))]
    assert images
    assert all(g.conditions["StringEquals"]["ec2:Owner"] in ("self", ["self"]) for g in images)
    env = function_properties(dev, fn("dev", "reconcile"))["Environment"]["Variables"]
    assert env["AMI_OWNERS"] == "self"


def test_given_the_alarm_topic_key_then_only_this_accounts_cloudwatch_may_use_it(dev):
    (key,) = properties(dev, "AWS::KMS::Key")
    (statement,) = [
        s for s in key["KeyPolicy"]["Statement"] if s.get("Sid") == "AllowCloudWatchAlarmsToUseTheKey"
    ]
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}


def test_given_create_tags_then_it_is_only_allowed_while_launching(dev):
    (tagging,) = [g for g in grants_of_function(dev, fn("dev", "reconcile")) if g.action == "ec2:CreateTags"]
    assert tagging.conditions == {"StringEquals": {"ec2:CreateAction": "RunInstances"}}


def test_given_pinned_network_settings_then_launches_are_limited_to_them(pinned):
    run = {
        flat(json.loads(g.resource))
        for g in grants_of_function(pinned, fn("pinned", "reconcile"))
        if g.action == "ec2:RunInstances"
    }
    account = "123456789012"
    assert f"arn:aws:ec2:eu-west-1:{account}:subnet/subnet-0a1b2c3d" in run
    assert f"arn:aws:ec2:eu-west-1:{account}:security-group/sg-4e5f6a7b" in run
    assert f"arn:aws:ec2:eu-west-1:{account}:key-pair/fleet-key" in run
    assert f"arn:aws:ec2:us-east-1:{account}:subnet/subnet-9f8e7d6c" in run
    assert f"arn:aws:ec2:us-east-1:{account}:instance/*" in run
    assert not [arn for arn in run if arn.endswith((":subnet/*", ":security-group/*"))]
    assert not [arn for arn in run if "us-east-1" in arn and "key-pair" in arn]


def test_given_describe_and_metric_reads_then_they_are_limited_to_the_worker_regions(pinned):
    reads = [
        g
        for g in grants_of_function(pinned, fn("pinned", "reconcile"))
        if g.action in {"ec2:DescribeInstances", "ec2:DescribeImages", "cloudwatch:GetMetricData"}
    ]
    assert len(reads) == 3
    for grant in reads:
        assert grant.conditions == {"StringEquals": {"aws:RequestedRegion": ["eu-west-1", "us-east-1"]}}


def test_given_table_grants_then_they_name_the_indexes_instead_of_a_wildcard(dev):
    (table,) = resources(dev, "AWS::DynamoDB::Table")
    resources_granted = {
        flat(json.loads(g.resource))
        for g in grants_of_function(dev, fn("dev", "api"))
        if g.action.startswith("dynamodb:")
    }
    assert f"<{table}.Arn>" in resources_granted
    assert f"<{table}.Arn>/index/by_status" in resources_granted
    assert not [arn for arn in resources_granted if "*" in arn]


def test_given_only_the_api_then_items_can_be_deleted(dev):
    deleters = {
        f for f in EXPECTED_ACTIONS if "dynamodb:DeleteItem" in actions_of_function(dev, fn("dev", f))
    }
    assert deleters == {"api"}


def test_given_no_function_stops_executions_then_none_may(dev):
    # Drains end through their own states (a failed token, a finish); nothing calls StopExecution.
    for function in EXPECTED_ACTIONS:
        assert "states:StopExecution" not in actions_of_function(dev, fn("dev", function)), function


def test_given_start_execution_then_it_targets_the_drain_state_machine_by_name(dev):
    for function in ("api", "drain-tasks", "reconcile", "ec2-events"):
        (start,) = [
            g for g in grants_of_function(dev, fn("dev", function)) if g.action == "states:StartExecution"
        ]
        assert flat(json.loads(start.resource)) == (
            "arn:aws:states:eu-west-1:<AWS::AccountId>:stateMachine:fleetkeeper-dev-drain"
        )


def test_given_audit_events_then_functions_put_only_on_the_audit_bus(dev):
    (bus,) = resources(dev, "AWS::Events::EventBus")
    for function in EXPECTED_ACTIONS:
        (put,) = [g for g in grants_of_function(dev, fn("dev", function)) if g.action == "events:PutEvents"]
        assert json.loads(put.resource) == {"Fn::GetAtt": [bus, "Arn"]}


def test_given_the_scheduler_role_then_only_this_accounts_scheduler_may_assume_it(dev):
    (role,) = [
        r
        for logical, r in resources(dev, "AWS::IAM::Role").items()
        if logical.startswith("TriggersSchedulerRole")
    ]
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}


def test_given_discovery_then_it_may_only_tag_with_fleetkeepers_own_keys(dev):
    (tagging,) = [g for g in grants_of_function(dev, fn("dev", "discover")) if g.action == "ec2:CreateTags"]
    assert tagging.conditions == {
        "StringEquals": {f"aws:RequestTag/{MANAGED_BY_TAG}": MANAGED_BY_VALUE},
        "ForAllValues:StringLike": {"aws:TagKeys": ["fleetkeeper:*"]},
    }
