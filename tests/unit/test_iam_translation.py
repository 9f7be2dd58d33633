"""What AWS authorizes for a request, and the template's intrinsics resolved to the local stack."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.settings import Settings
from fleetkeeper_local.iam.emulator import Instance, KnownFacts
from fleetkeeper_local.iam.policies import CANONICAL, PolicyModel, Resolver, TemplateError
from fleetkeeper_local.iam.requests import (
    Authorization,
    Environment,
    Localizer,
    MissingResource,
    Request,
    Unmodelled,
    authorizations,
)
from fleetkeeper_local.iam.security_doc import comparable

ACCOUNT = CANONICAL.account
REGION = "us-west-2"
PROFILE_ROLE = f"arn:aws:iam::{ACCOUNT}:role/worker-instance"
FACTS = KnownFacts(
    images={"ami-1": "amazon", "ami-2": "210987654321"},
    instances={"i-1": Instance("m5.large", {"fleetkeeper:managed-by": "fleetkeeper", "team": "labs"})},
    subnet="subnet-default",
    security_groups=("sg-default",),
    profiles={"workers": (PROFILE_ROLE,)},
)
TOPIC_KEY = f"arn:aws:kms:{CANONICAL.region}:{ACCOUNT}:key/k"
MODEL = PolicyModel(
    set_id="test",
    functions={},
    managed_policies={},
    resource_policies={},
    topic_keys={CANONICAL.topic_arn: TOPIC_KEY},
)
STATES = f"arn:aws:states:{CANONICAL.region}:{ACCOUNT}"
SETTINGS = Settings.from_environ(
    {
        "TABLE_NAME": "fk-test-1",
        "DRAIN_STATE_MACHINE_ARN": f"{STATES}:stateMachine:fleetkeeper-drain-1",
        "AUDIT_BUS_NAME": "fleetkeeper-audit-1",
        "NOTIFICATION_TOPIC_ARN": f"arn:aws:sns:{CANONICAL.region}:{ACCOUNT}:fleetkeeper-alerts-1",
    }
)


def needed(service: str, operation: str, params: dict[str, Any], region: str = REGION) -> list[Authorization]:
    env = Environment(FACTS, Localizer(SETTINGS), MODEL)
    return authorizations(Request(service, operation, params, region), env)


def by_resource(found: list[Authorization]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(one.action, one.resource): dict(one.context) for one in found}


def test_given_a_launch_then_every_resource_it_reads_or_creates_is_authorized_with_its_context() -> None:
    found = by_resource(
        needed(
            "ec2",
            "RunInstances",
            {
                "ImageId": "ami-1",
                "InstanceType": "c6g.large",
                "MinCount": 1,
                "MaxCount": 1,
                "KeyName": "ops",
                "IamInstanceProfile": {"Name": "workers"},
                "MetadataOptions": {"HttpTokens": "required"},
                "TagSpecifications": [
                    {
                        "ResourceType": "instance",
                        "Tags": [{"Key": "fleetkeeper:managed-by", "Value": "fleetkeeper"}],
                    }
                ],
            },
        )
    )

    ec2 = f"arn:aws:ec2:{REGION}:{ACCOUNT}"
    instance = found[("ec2:RunInstances", f"{ec2}:instance/*")]
    assert instance["aws:RequestTag/fleetkeeper:managed-by"] == "fleetkeeper"
    assert instance["aws:TagKeys"] == ("fleetkeeper:managed-by",)
    assert instance["ec2:InstanceType"] == "c6g.large"
    assert instance["ec2:MetadataHttpTokens"] == "required"
    assert instance["ec2:InstanceProfile"] == f"arn:aws:iam::{ACCOUNT}:instance-profile/workers"
    assert found[("ec2:RunInstances", f"arn:aws:ec2:{REGION}::image/ami-1")]["ec2:Owner"] == "amazon"
    for resource in ("subnet/subnet-default", "security-group/sg-default", "network-interface/*", "volume/*"):
        assert ("ec2:RunInstances", f"{ec2}:{resource}") in found, resource
    assert ("ec2:RunInstances", f"{ec2}:key-pair/ops") in found
    tagging = found[("ec2:CreateTags", f"{ec2}:instance/*")]
    assert tagging["ec2:CreateAction"] == "RunInstances"
    passing = found[("iam:PassRole", PROFILE_ROLE)]
    assert passing["iam:PassedToService"] == "ec2.amazonaws.com"
    assert all(context["aws:RequestedRegion"] == REGION for context in found.values())


def test_given_a_launch_naming_its_network_then_that_subnet_and_those_groups_are_authorized() -> None:
    found = by_resource(
        needed(
            "ec2",
            "RunInstances",
            {"ImageId": "ami-2", "SubnetId": "subnet-9", "SecurityGroupIds": ["sg-8", "sg-7"]},
        )
    )

    resources = {resource.rsplit(":", 1)[-1] for _, resource in found}
    assert {"subnet/subnet-9", "security-group/sg-8", "security-group/sg-7"} <= resources
    assert not {"subnet/subnet-default", "security-group/sg-default"} & resources
    assert found[("ec2:RunInstances", f"arn:aws:ec2:{REGION}::image/ami-2")]["ec2:Owner"] == "210987654321"
    assert not [action for action, _ in found if action in {"ec2:CreateTags", "iam:PassRole"}]


def test_given_a_stop_then_the_instance_is_authorized_with_its_tags() -> None:
    (stop,) = needed("ec2", "StopInstances", {"InstanceIds": ["i-1"]})

    assert stop.resource == f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-1"
    assert stop.context["aws:ResourceTag/fleetkeeper:managed-by"] == "fleetkeeper"
    assert stop.context["ec2:ResourceTag/team"] == "labs"


def test_given_a_command_then_the_document_and_the_instance_with_its_ssm_tags_are_authorized() -> None:
    found = by_resource(
        needed("ssm", "SendCommand", {"DocumentName": "AWS-RunShellScript", "InstanceIds": ["i-1"]})
    )

    assert ("ssm:SendCommand", f"arn:aws:ssm:{REGION}::document/AWS-RunShellScript") in found
    instance = found[("ssm:SendCommand", f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/i-1")]
    assert instance["ssm:resourceTag/fleetkeeper:managed-by"] == "fleetkeeper"


def test_given_a_transaction_then_each_item_is_authorized_by_its_own_action_on_the_canonical_table() -> None:
    found = needed(
        "dynamodb",
        "TransactWriteItems",
        {
            "TransactItems": [
                {"Put": {"TableName": "fk-test-1", "Item": {}}},
                {"ConditionCheck": {"TableName": "fk-test-1", "Key": {}}},
                {"Update": {"TableName": "another", "Key": {}}},
            ]
        },
        region=CANONICAL.region,
    )

    assert {(one.action, one.resource) for one in found} == {
        ("dynamodb:PutItem", CANONICAL.table_arn),
        ("dynamodb:ConditionCheckItem", CANONICAL.table_arn),
        ("dynamodb:UpdateItem", f"arn:aws:dynamodb:{CANONICAL.region}:{ACCOUNT}:table/another"),
    }


def test_given_the_local_resources_then_they_are_renamed_and_no_other_is() -> None:
    localizer = Localizer(SETTINGS)
    local = f"arn:aws:states:{CANONICAL.region}:{ACCOUNT}"

    assert localizer.canonical(f"{local}:stateMachine:fleetkeeper-drain-1") == CANONICAL.state_machine_arn
    assert (
        localizer.canonical(f"{local}:execution:fleetkeeper-drain-1:w-1")
        == f"{local}:execution:fleetkeeper-drain:w-1"
    )
    assert (
        localizer.canonical(f"{local}:stateMachine:fleetkeeper-drain-10")
        == f"{local}:stateMachine:fleetkeeper-drain-10"
    )
    table = f"arn:aws:dynamodb:{CANONICAL.region}:{ACCOUNT}:table/fk-test-1"
    assert localizer.canonical(f"{table}/index/by_status") == f"{CANONICAL.table_arn}/index/by_status"
    assert localizer.canonical(f"{table}0") == f"{table}0"


def test_given_an_encrypted_topic_then_publishing_also_needs_its_key() -> None:
    found = needed("sns", "Publish", {"TopicArn": SETTINGS.notification_topic_arn, "Message": "m"})

    assert [(one.action, one.resource) for one in found] == [
        ("sns:Publish", CANONICAL.topic_arn),
        ("kms:GenerateDataKey", TOPIC_KEY),
        ("kms:Decrypt", TOPIC_KEY),
    ]


@pytest.mark.parametrize(
    ("service", "operation", "params", "error"),
    [
        ("ec2", "StopInstances", {"InstanceIds": ["i-unknown"]}, MissingResource),
        ("ec2", "RunInstances", {"ImageId": "ami-unknown"}, MissingResource),
        ("ec2", "AllocateAddress", {}, Unmodelled),
        ("sqs", "SendMessage", {}, Unmodelled),
        (
            "ssm",
            "SendCommand",
            {"DocumentName": "d", "Targets": [{"Key": "tag:x", "Values": ["y"]}]},
            Unmodelled,
        ),
    ],
)
def test_given_a_request_that_cannot_be_judged_then_it_says_why(service, operation, params, error) -> None:
    with pytest.raises(error):
        needed(service, operation, params)


TEMPLATE: dict[str, Any] = {
    "Resources": {
        "Table": {"Type": "AWS::DynamoDB::Table", "Properties": {}},
        "Machine": {
            "Type": "AWS::StepFunctions::StateMachine",
            "Properties": {"StateMachineName": "fleetkeeper-dev-drain"},
        },
        "Role": {"Type": "AWS::IAM::Role", "Properties": {}},
    }
}


@pytest.mark.parametrize(
    ("value", "resolved"),
    [
        ({"Fn::GetAtt": ["Table", "Arn"]}, CANONICAL.table_arn),
        (
            {"Fn::Join": ["", [{"Fn::GetAtt": ["Table", "Arn"]}, "/index/by_status"]]},
            f"{CANONICAL.table_arn}/index/by_status",
        ),
        (
            {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/${Role}"},
            f"arn:aws:iam::{ACCOUNT}:role/Role",
        ),
        (
            {
                "Fn::Join": [
                    "",
                    [
                        "arn:aws:states:us-east-1:",
                        {"Ref": "AWS::AccountId"},
                        ":stateMachine:fleetkeeper-dev-drain",
                    ],
                ]
            },
            CANONICAL.state_machine_arn,
        ),
        ({"Fn::Select": [1, {"Fn::Split": [",", "a,b"]}]}, "b"),
        (["x", {"Ref": "AWS::NoValue"}], ["x"]),
    ],
)
def test_given_an_intrinsic_then_it_resolves_to_the_local_stack(value, resolved) -> None:
    assert Resolver(TEMPLATE).resolve(value) == resolved


def test_given_an_unknown_resource_then_resolution_fails_naming_it() -> None:
    with pytest.raises(TemplateError, match="Missing"):
        Resolver(TEMPLATE).resolve({"Ref": "Missing"})


def test_given_two_renderings_that_differ_only_in_what_the_run_went_through_then_they_compare_equal() -> None:
    row = "| `ec2:StopInstances` | `*` | {} | {} |"
    first = row.format("", "`ec2:StopInstances`: services/a.py:f -> cloud/ec2.py:stop")
    second = row.format("", "`ec2:StopInstances`: services/b.py:g")
    unexercised = row.format("", "not exercised by the code")
    wider = "| `ec2:StopInstances`, `ec2:TerminateInstances` | `*` |  | not exercised by the code |"
    conditioned = row.format('`{"StringEquals": {"aws:ResourceTag/fleetkeeper:managed": "true"}}`', "-")

    assert comparable(first) == comparable(second) == comparable(unexercised)
    assert comparable(first) != comparable(wider)
    assert comparable(first) != comparable(conditioned)
    # A pipe inside a cell is escaped, and is not a column boundary.
    assert comparable(r"| `a:B` | `arn:x\|y` |  | path |") == r"| `a:B` | `arn:x\|y` |  |"
