"""Least privilege, proven by the IAM evaluator: requests the code must never make are denied.

Each row of the table is evaluated by the same evaluator, against the same policies (the dev stage's
synthesized template), as every request the functions make in the integration and e2e tests
(fleetkeeper_local.iam). The rows marked allowed keep the table from passing vacuously: a policy set
that denied everything would fail them. The structural checks below hold for every stage.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from fleetkeeper.domain.tags import BATCH_TAG, MANAGED_BY_TAG, MANAGED_BY_VALUE, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper_local.iam.attribution import FUNCTIONS
from fleetkeeper_local.iam.emulator import Instance, KnownFacts
from fleetkeeper_local.iam.evaluator import Decision, Evaluator
from fleetkeeper_local.iam.policies import CANONICAL, PolicyModel, load_model
from fleetkeeper_local.iam.record import Summary
from fleetkeeper_local.iam.recorder import Recorder
from fleetkeeper_local.iam.requests import Authorization, Localizer, Request
from tests.infra.helpers import flat, grants_of_function, properties, resources

ACCOUNT = CANONICAL.account
REGION = CANONICAL.region
OTHER_ACCOUNT = "210987654321"
MANAGED = {MANAGED_BY_TAG: MANAGED_BY_VALUE}
MANAGED_MACHINE = {**MANAGED, WORKER_ID_TAG: "w-1", TEMPLATE_TAG: "lab"}
DOCUMENT = "fleetkeeper-dev-CollectSystemInfo"
OTHER_TABLE = "someone-elses-table"
OTHER_STATE_MACHINE = f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:someone-elses-workflow"
OTHER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/administrator"
# The dev stage's workers' instance profile and its role (infra/worker_profile.py).
WORKER_PROFILE = "fleetkeeper-dev-worker"
WORKER_ROLE = f"arn:aws:iam::{ACCOUNT}:role/fleetkeeper-dev-worker"

FACTS = KnownFacts(
    images={"ami-0own": ACCOUNT, "ami-0foreign": OTHER_ACCOUNT, "ami-0amazon": "amazon"},
    instances={
        "i-0managed": Instance("m5.large", MANAGED_MACHINE),
        "i-0foreign": Instance("m5.large", {"team": "data", WORKER_ID_TAG: "w-1"}),
        # A batch's machine as RunInstances tagged it: no worker's id until it is paired.
        "i-0batch": Instance("m5.large", {**MANAGED, TEMPLATE_TAG: "lab", BATCH_TAG: "fkb-1"}),
        # Fleetkeeper's machine that no batch launched and that names no worker (an import mid-tagging).
        "i-0unnamed": Instance("m5.large", {**MANAGED, TEMPLATE_TAG: "lab"}),
    },
    profiles={"administrator-profile": (OTHER_ROLE,), WORKER_PROFILE: (WORKER_ROLE,)},
)


def _tags(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def launch(
    image: str = "ami-0own", tags: Mapping[str, str] = MANAGED_MACHINE, **extra: Any
) -> dict[str, Any]:
    """RunInstances as cloud/ec2.py sends it."""
    return {
        "ImageId": image,
        "InstanceType": "m5.large",
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": "w-1-1",
        "TagSpecifications": [{"ResourceType": "instance", "Tags": _tags(tags)}],
        "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
        "IamInstanceProfile": {"Name": WORKER_PROFILE},
        **extra,
    }


def item(table: str = CANONICAL.table) -> dict[str, Any]:
    return {"TableName": table, "Key": {"PK": {"S": "WORKER#w-1"}, "SK": {"S": "WORKER"}}}


def slot_item(table: str = CANONICAL.table) -> dict[str, Any]:
    return {"TableName": table, "Key": {"PK": {"S": "WORKER#w-1"}, "SK": {"S": "SLOT#i-1"}}}


def batch_write(table: str = CANONICAL.table) -> dict[str, Any]:
    page = {"PK": {"S": "BREAKER#orphan-gc#us-east-1"}, "SK": {"S": "IDS#0123456789abcdef#00000"}}
    return {"RequestItems": {table: [{"PutRequest": {"Item": page}}, {"DeleteRequest": {"Key": page}}]}}


@dataclass(frozen=True)
class Row:
    """One request of one function, and whether its role may make it."""

    why: str
    function: str
    service: str
    operation: str
    params: Mapping[str, Any]
    allowed: bool
    # Judge only the authorizations of this action (a launch's PassRole); None: the whole request.
    action: str | None = None
    region: str = REGION
    facts: KnownFacts = field(default=FACTS)


def denied(
    why: str, function: str, service: str, operation: str, params: Mapping[str, Any], **kw: Any
) -> Row:
    return Row(why, function, service, operation, params, allowed=False, **kw)


def allowed(
    why: str, function: str, service: str, operation: str, params: Mapping[str, Any], **kw: Any
) -> Row:
    return Row(why, function, service, operation, params, allowed=True, **kw)


LIFECYCLE = {
    "drain-tasks": ("StopInstances", "TerminateInstances"),
    "reconcile": ("StartInstances", "StopInstances", "TerminateInstances"),
}

TABLE: list[Row] = [
    # EC2 and Run Command reach only machines carrying the managed-by tag.
    *[
        denied(
            f"{operation} of a machine without the managed tag",
            function,
            "ec2",
            operation,
            {"InstanceIds": ["i-0foreign"]},
        )
        for function, operations in LIFECYCLE.items()
        for operation in operations
    ],
    denied(
        "discovery terminating a machine without the managed tag",
        "discover",
        "ec2",
        "TerminateInstances",
        {"InstanceIds": ["i-0foreign"]},
    ),
    *[
        denied(
            "a catalogue command to a machine without the managed tag",
            function,
            "ssm",
            "SendCommand",
            {"DocumentName": DOCUMENT, "InstanceIds": ["i-0foreign"]},
        )
        for function in ("reconcile", "drain-tasks")
    ],
    *[
        denied(
            "AWS-RunShellScript, which runs anything",
            function,
            "ssm",
            "SendCommand",
            {
                "DocumentName": "AWS-RunShellScript",
                "InstanceIds": ["i-0managed"],
                "Parameters": {"commands": ["id"]},
            },
        )
        for function in ("reconcile", "drain-tasks")
    ],
    # Launches: only from the stage's AMI owners, only tagged as fleetkeeper's, passing only its role.
    denied(
        "a launch from another account's image", "reconcile", "ec2", "RunInstances", launch("ami-0foreign")
    ),
    denied(
        "a launch not tagged as fleetkeeper's", "reconcile", "ec2", "RunInstances", launch(tags={"Name": "x"})
    ),
    denied(
        "passing another role to a machine",
        "reconcile",
        "ec2",
        "RunInstances",
        launch(IamInstanceProfile={"Name": "administrator-profile"}),
        action="iam:PassRole",
    ),
    denied(
        "a launch that does not require IMDSv2",
        "reconcile",
        "ec2",
        "RunInstances",
        launch(MetadataOptions={"HttpTokens": "optional"}),
    ),
    denied(
        "a launch of an instance type no template of the stage may use",
        "reconcile",
        "ec2",
        "RunInstances",
        launch(InstanceType="p5.48xlarge"),
    ),
    denied(
        "tagging a machine outside a launch",
        "reconcile",
        "ec2",
        "CreateTags",
        {"Resources": ["i-0managed"], "Tags": _tags(MANAGED)},
    ),
    denied(
        "writing a worker's id on a machine that is not fleetkeeper's",
        "reconcile",
        "ec2",
        "CreateTags",
        {"Resources": ["i-0foreign"], "Tags": _tags({WORKER_ID_TAG: "w-1"})},
    ),
    denied(
        "the reconciler writing another worker's id on a machine that names its worker",
        "reconcile",
        "ec2",
        "CreateTags",
        {"Resources": ["i-0managed"], "Tags": _tags({"Name": "fleetkeeper-w-2", WORKER_ID_TAG: "w-2"})},
    ),
    denied(
        "the reconciler writing a worker's id on fleetkeeper's machine that no launch batch started",
        "reconcile",
        "ec2",
        "CreateTags",
        {"Resources": ["i-0unnamed"], "Tags": _tags({"Name": "fleetkeeper-w-2", WORKER_ID_TAG: "w-2"})},
    ),
    denied(
        "discovery writing a tag key that is not fleetkeeper's",
        "discover",
        "ec2",
        "CreateTags",
        {"Resources": ["i-0managed"], "Tags": _tags({**MANAGED, "Name": "renamed"})},
    ),
    denied(
        "reading machines in a region the stage does not serve",
        "reconcile",
        "ec2",
        "DescribeInstances",
        {},
        region="ap-south-1",
    ),
    # Data, workflows and messages: the stage's own, and only what each function does with them.
    *[denied("another table", function, "dynamodb", "GetItem", item(OTHER_TABLE)) for function in FUNCTIONS],
    *[
        denied(
            "batch writes (only discovery writes the orphan breaker's pages of ids)",
            function,
            "dynamodb",
            "BatchWriteItem",
            batch_write(),
        )
        for function in FUNCTIONS
        if function != "discover"
    ],
    *[
        denied(
            "another state machine",
            function,
            "sfn",
            "StartExecution",
            {"stateMachineArn": OTHER_STATE_MACHINE, "input": "{}"},
        )
        for function in ("api", "drain-tasks", "reconcile", "ec2-events")
    ],
    denied(
        "reading another state machine's executions",
        "reconcile",
        "sfn",
        "DescribeExecution",
        {"executionArn": f"arn:aws:states:{REGION}:{ACCOUNT}:execution:someone-elses-workflow:x"},
    ),
    *[
        denied(
            "stopping an execution (drains end through their own states)",
            function,
            "sfn",
            "StopExecution",
            {"executionArn": f"arn:aws:states:{REGION}:{ACCOUNT}:execution:{CANONICAL.state_machine}:x"},
        )
        for function in FUNCTIONS
    ],
    *[
        denied(
            "events on a bus other than the audit bus",
            function,
            "eventbridge",
            "PutEvents",
            {
                "Entries": [
                    {"Source": "fleetkeeper", "DetailType": "x", "Detail": "{}", "EventBusName": "default"}
                ]
            },
        )
        for function in FUNCTIONS
    ],
    denied(
        "another topic",
        "reconcile",
        "sns",
        "Publish",
        {"TopicArn": f"arn:aws:sns:{REGION}:{ACCOUNT}:someone-elses-topic", "Message": "x"},
    ),
    denied(
        "the API publishing to the operators' topic",
        "api",
        "sns",
        "Publish",
        {"TopicArn": CANONICAL.topic_arn, "Message": "x"},
    ),
    # What the code does: the table would pass vacuously without these.
    allowed("the reconciler's launch", "reconcile", "ec2", "RunInstances", launch()),
    allowed(
        "a drain stopping fleetkeeper's machine",
        "drain-tasks",
        "ec2",
        "StopInstances",
        {"InstanceIds": ["i-0managed"]},
    ),
    allowed(
        "discovery terminating a leaked machine",
        "discover",
        "ec2",
        "TerminateInstances",
        {"InstanceIds": ["i-0managed"]},
    ),
    allowed(
        "the reconciler writing a paired worker's own tags on its machine of a batch",
        "reconcile",
        "ec2",
        "CreateTags",
        {"Resources": ["i-0batch"], "Tags": _tags({"Name": "fleetkeeper-w-1", WORKER_ID_TAG: "w-1"})},
    ),
    allowed(
        "discovery importing a machine",
        "discover",
        "ec2",
        "CreateTags",
        {"Resources": ["i-0managed"], "Tags": _tags(MANAGED_MACHINE)},
    ),
    allowed(
        "collect-system-info on fleetkeeper's machine",
        "reconcile",
        "ssm",
        "SendCommand",
        {"DocumentName": DOCUMENT, "InstanceIds": ["i-0managed"]},
    ),
    allowed("the API writing the table", "api", "dynamodb", "PutItem", {**item(), "Item": {}}),
    allowed(
        "discovery writing the orphan breaker's pages",
        "discover",
        "dynamodb",
        "BatchWriteItem",
        batch_write(),
    ),
    allowed("the API deleting an idempotency record", "api", "dynamodb", "DeleteItem", item()),
    *[
        allowed(
            "ending an instance frees its slot item on the worker",
            function,
            "dynamodb",
            "TransactWriteItems",
            {"TransactItems": [{"Delete": slot_item()}]},
        )
        for function in FUNCTIONS
    ],
    allowed(
        "the API starting a drain",
        "api",
        "sfn",
        "StartExecution",
        {"stateMachineArn": CANONICAL.state_machine_arn, "input": "{}"},
    ),
    allowed(
        "a drain telling the operators (through the topic's key)",
        "drain-tasks",
        "sns",
        "Publish",
        {"TopicArn": CANONICAL.topic_arn, "Message": "x"},
    ),
]


@pytest.fixture(scope="module")
def model() -> PolicyModel:
    return load_model()


@pytest.fixture(scope="module")
def evaluator() -> Iterator[Evaluator]:
    shared = Evaluator()
    yield shared
    shared.close()


def judge(model: PolicyModel, evaluator: Evaluator, row: Row) -> list[tuple[Authorization, Decision]]:
    recorder = Recorder(model, summary=Summary(), enforce=False, evaluator=evaluator, lookups=row.facts)
    request = Request(row.service, row.operation, row.params, row.region)
    found = recorder.decisions(row.function, request, localizer=Localizer(None))
    judged = [(one, decision) for one, decision in found if row.action in (None, one.action)]
    assert judged, f"the request needs no {row.action}"
    return judged


@pytest.mark.parametrize(
    "row",
    TABLE,
    ids=lambda row: f"{'allowed' if row.allowed else 'denied'}: {row.function} {row.operation}: {row.why}",
)
def test_given_the_least_privilege_table_then_each_request_is_decided_as_its_row_says(model, evaluator, row):
    judged = judge(model, evaluator, row)

    if row.allowed:
        refused = [
            (one.action, one.resource, decision.denials) for one, decision in judged if not decision.allowed
        ]
        assert not refused, refused
    else:
        assert any(not decision.allowed for _, decision in judged), [
            (one.action, one.resource) for one, _ in judged
        ]


# ---- the admin API: the internal route is tooling's alone ------------------------------------------

API = f"arn:aws:execute-api:{REGION}:{ACCOUNT}:{CANONICAL.api_id}/dev"
OPERATOR = f"arn:aws:iam::{ACCOUNT}:user/alice"


@dataclass(frozen=True)
class Call:
    """A call of the admin API by a principal holding one of the stage's managed policies."""

    policy: str
    method: str
    path: str
    allowed: bool


API_CALLS = [
    Call("fleetkeeper-dev-api-operator", "POST", "/api/internal/workers/w-1/status", allowed=False),
    Call("fleetkeeper-dev-api-read-only", "POST", "/api/internal/workers/w-1/status", allowed=False),
    Call("fleetkeeper-dev-api-read-only", "POST", "/api/v1/workers/w-1/drain", allowed=False),
    Call("fleetkeeper-dev-api-operator", "POST", "/api/v1/workers/w-1/drain", allowed=True),
    Call("fleetkeeper-dev-api-read-only", "GET", "/api/v1/workers", allowed=True),
    Call("fleetkeeper-dev-api-internal-tooling", "POST", "/api/internal/workers/w-1/status", allowed=True),
    # The health route: a worker agent's or tooling's; the operators' /api/* grant does not reach it (the
    # API's resource policy denies it to every other principal, and the dev stage names none).
    Call("fleetkeeper-dev-api-worker-agent", "POST", "/api/v1/workers/w-1/drain", allowed=False),
    Call("fleetkeeper-dev-api-operator", "POST", "/api/v1/workers/w-1/health", allowed=False),
    Call("fleetkeeper-dev-api-read-only", "POST", "/api/v1/workers/w-1/health", allowed=False),
]


@pytest.mark.parametrize("call", API_CALLS, ids=lambda c: f"{c.policy} {c.method} {c.path}")
def test_given_the_api_policies_then_only_tooling_reaches_the_internal_route(model, evaluator, call):
    resource = f"{API}/{call.method}{call.path}"

    decision = evaluator.evaluate(
        model.set_id,
        principal=OPERATOR,
        action="execute-api:Invoke",
        resource=resource,
        account=ACCOUNT,
        context={
            "aws:PrincipalArn": OPERATOR,
            "aws:PrincipalAccount": ACCOUNT,
            "aws:SecureTransport": "true",
        },
        identity=[model.managed_policies[call.policy].name],
        resource_policy=model.resource_policy_for(resource),
    )

    assert decision.allowed is call.allowed, decision


def test_given_the_template_then_every_function_has_a_role_with_policies(model):
    assert sorted(model.functions) == sorted(FUNCTIONS)
    assert all(identity.policies for identity in model.functions.values())


# ---- structural checks, every stage ------------------------------------------------------------------


def fn(stage: str, function: str) -> str:
    return f"fleetkeeper-{stage}-{function}"


@pytest.mark.parametrize("stage", ["dev", "prod", "pinned"])
def test_given_any_policy_then_no_action_is_a_wildcard(synthesized, stage):
    template = synthesized.template(stage)
    documents = [p["PolicyDocument"] for p in properties(template, "AWS::IAM::Policy")]
    documents += [p["PolicyDocument"] for p in properties(template, "AWS::IAM::ManagedPolicy")]
    for document in documents:
        for statement in document["Statement"]:
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            assert not [action for action in actions if "*" in action], statement


def test_given_the_roles_then_only_api_gateways_logging_role_and_the_workers_carry_a_managed_policy(dev):
    with_managed = sorted(
        logical
        for logical, role in resources(dev, "AWS::IAM::Role").items()
        if role["Properties"].get("ManagedPolicyArns")
    )
    assert len(with_managed) == 2
    assert with_managed[0].startswith("ApiRestApiCloudWatchRole")
    assert with_managed[1].startswith("WorkerProfileRole")


@pytest.mark.parametrize("stage", ["dev", "prod", "pinned"])
@pytest.mark.parametrize("function", FUNCTIONS)
def test_given_ec2_lifecycle_calls_then_they_only_reach_instances_tagged_managed_by(
    synthesized, stage, function
):
    lifecycle = {"ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances"}
    for grant in grants_of_function(synthesized.template(stage), fn(stage, function)):
        if grant.action in lifecycle:
            assert grant.conditions == {
                "StringEquals": {f"aws:ResourceTag/{MANAGED_BY_TAG}": MANAGED_BY_VALUE}
            }, grant
            assert flat(json.loads(grant.resource)).endswith(":instance/*")


def test_given_the_alarm_topic_key_then_only_this_accounts_cloudwatch_may_use_it(dev):
    (key,) = properties(dev, "AWS::KMS::Key")
    (statement,) = [
        s for s in key["KeyPolicy"]["Statement"] if s.get("Sid") == "AllowCloudWatchAlarmsToUseTheKey"
    ]
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}


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


def test_given_the_scheduler_role_then_only_this_accounts_scheduler_may_assume_it(dev):
    (role,) = [
        r
        for logical, r in resources(dev, "AWS::IAM::Role").items()
        if logical.startswith("TriggersSchedulerRole")
    ]
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "scheduler.amazonaws.com"}
    assert statement["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
