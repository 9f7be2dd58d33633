"""What AWS authorizes for one API request: actions, resources and the condition context it supplies.

Modelled on AWS's service authorization reference, for the operations fleetkeeper's functions call.
One request may need several authorizations: RunInstances is authorized on the instance, the image, the
subnet, each security group, the network interface and the volume it creates, plus ec2:CreateTags for
its tags and iam:PassRole for an instance profile; a transaction on each of its items' actions. An
operation with no model here raises `Unmodelled`, so a new AWS call cannot go unchecked; a request on a
resource the emulator does not know raises `MissingResource` (AWS answers it NotFound before any policy
could apply, and its tags, which conditions read, do not exist).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from fleetkeeper.settings import Settings
from fleetkeeper_local.iam.emulator import Lookups
from fleetkeeper_local.iam.policies import CANONICAL, PARTITION, CanonicalNames, PolicyModel

ContextValue = str | tuple[str, ...]

# botocore's service ids (as in event names) -> IAM's service prefixes.
IAM_PREFIXES: Final = {
    "dynamodb": "dynamodb",
    "ec2": "ec2",
    "sfn": "states",
    "ssm": "ssm",
    "sns": "sns",
    "eventbridge": "events",
    "cloudwatch": "cloudwatch",
    "iam": "iam",
    "lambda": "lambda",
    "sqs": "sqs",
}


class Unmodelled(LookupError):
    """No authorization model for this operation: add one to this module."""


class MissingResource(LookupError):
    """The request names a resource the emulator does not know; AWS answers NotFound."""


@dataclass(frozen=True)
class Authorization:
    """One action on one resource, with the condition context AWS supplies for it."""

    action: str
    resource: str
    context: Mapping[str, ContextValue] = field(default_factory=dict)


@dataclass(frozen=True)
class Request:
    """An API request as a function made it: the operation, its parameters, where it went."""

    service: str  # botocore's service id: "ec2", "sfn", "eventbridge", ...
    operation: str
    params: Mapping[str, Any]
    region: str
    account: str = CANONICAL.account

    def arn(self, service: str, resource: str, *, account: bool = True) -> str:
        return f"arn:{PARTITION}:{service}:{self.region}:{self.account if account else ''}:{resource}"


class Localizer:
    """Renames the local stack's stage resources to the canonical names the policies were resolved
    with; any other resource keeps its name and is judged as what it is.

    The stage's resources are those the settings name, and every one this process provisioned for the
    stage (`provisioned`, by kind): a drain still running from an earlier control plane of the same
    test process uses that one's table and bus, as its own stage's."""

    def __init__(
        self,
        settings: Settings | None,
        provisioned: Mapping[str, Iterable[str]] | None = None,
        names: CanonicalNames = CANONICAL,
    ) -> None:
        self._names = names
        known = {kind: set(found) for kind, found in (provisioned or {}).items()}
        if settings is not None:
            known.setdefault("table", set()).add(settings.table_name)
            known.setdefault("bus", set()).add(settings.audit_bus_name)
            if settings.drain_state_machine_arn:
                known.setdefault("state-machine", set()).add(settings.drain_state_machine_arn)
            if settings.notification_topic_arn:
                known.setdefault("topic", set()).add(settings.notification_topic_arn)
        self._tables = frozenset(known.get("table", ()))
        self._buses = frozenset(known.get("bus", ()))
        self._machines = frozenset(arn.rsplit(":", 1)[-1] for arn in known.get("state-machine", ()))
        self._topics = frozenset(known.get("topic", ()))
        # The workers' instance profile the stage launches with, by name or ARN: the template's own.
        profiles = set(known.get("instance-profile", ()))
        if settings is not None and settings.worker_instance_profile:
            profiles.add(settings.worker_instance_profile)
        self._profiles = frozenset(ref.rsplit("/", 1)[-1] for ref in profiles)
        self._home = f"{names.region}:{names.account}:"

    def is_stage_profile(self, reference: str) -> bool:
        """Whether a launch's instance profile (name or ARN) is the one the stage launches workers with."""
        return reference.rsplit("/", 1)[-1] in self._profiles

    def canonical(self, arn: str) -> str:
        names = self._names
        if arn in self._topics:
            return names.topic_arn
        parts = arn.split(":", 5)
        if len(parts) < 6 or f"{parts[3]}:{parts[4]}:" != self._home:
            return arn
        service, resource = parts[2], parts[5]
        if service == "dynamodb" and resource.startswith("table/"):
            table, _, rest = resource.removeprefix("table/").partition("/")
            if table in self._tables:
                return names.table_arn + (f"/{rest}" if rest else "")
        elif service == "events" and resource.removeprefix("event-bus/") in self._buses:
            return names.bus_arn
        elif service == "states":
            kind, _, rest = resource.partition(":")
            machine, _, execution = rest.partition(":")
            if kind in {"stateMachine", "execution"} and machine in self._machines:
                return names.arn(
                    "states", f"{kind}:{names.state_machine}" + (f":{execution}" if execution else "")
                )
        return arn


@dataclass(frozen=True)
class Environment:
    """What translating a request needs besides the request."""

    lookups: Lookups
    localizer: Localizer
    model: PolicyModel


def authorizations(request: Request, env: Environment) -> list[Authorization]:
    """Every authorization AWS checks for this request, with the context it supplies."""
    translate = _TRANSLATORS.get(request.service)
    if translate is None:
        raise Unmodelled(f"{request.service}:{request.operation}")
    found = translate(request, env)
    common: dict[str, ContextValue] = {"aws:RequestedRegion": request.region, "aws:SecureTransport": "true"}
    return [
        Authorization(
            found_one.action,
            env.localizer.canonical(found_one.resource),
            {**common, **found_one.context},
        )
        for found_one in _unique(found)
    ]


def _unique(found: Iterable[Authorization]) -> list[Authorization]:
    seen: dict[tuple[Any, ...], Authorization] = {}
    for one in found:
        key = (one.action, one.resource, tuple(sorted((k, str(v)) for k, v in one.context.items())))
        seen.setdefault(key, one)
    return list(seen.values())


def _tags(tags: Iterable[Mapping[str, str]]) -> dict[str, str]:
    return {str(tag["Key"]): str(tag.get("Value", "")) for tag in tags}


def request_tag_context(tags: Mapping[str, str]) -> dict[str, ContextValue]:
    """`aws:RequestTag/<key>` per tag and `aws:TagKeys`: the tags a request sets."""
    context: dict[str, ContextValue] = {f"aws:RequestTag/{key}": value for key, value in tags.items()}
    context["aws:TagKeys"] = tuple(sorted(tags))
    return context


def resource_tag_context(tags: Mapping[str, str], *prefixes: str) -> dict[str, ContextValue]:
    """`<prefix>:ResourceTag/<key>` per tag the resource carries, for each prefix (aws, ec2, ...)."""
    return {f"{prefix}/{key}": value for prefix in prefixes for key, value in tags.items()}


# ---- EC2 ----------------------------------------------------------------------------------------

_EC2_ID_TYPES: Final = {
    "i-": "instance",
    "vol-": "volume",
    "eni-": "network-interface",
    "sg-": "security-group",
    "subnet-": "subnet",
    "snap-": "snapshot",
    "ami-": "image",
}
_INSTANCE_LIFECYCLE: Final = frozenset(
    {"StartInstances", "StopInstances", "TerminateInstances", "RebootInstances"}
)


def _ec2_resource(request: Request, resource_id: str) -> str:
    for prefix, kind in _EC2_ID_TYPES.items():
        if resource_id.startswith(prefix):
            return request.arn("ec2", f"{kind}/{resource_id}", account=kind != "image")
    raise Unmodelled(f"ec2 resource id {resource_id}")


def _instance_context(request: Request, env: Environment, instance_id: str) -> dict[str, ContextValue]:
    instance = env.lookups.instance(request.region, instance_id)
    if instance is None:
        raise MissingResource(f"instance {instance_id} in {request.region}")
    context = resource_tag_context(instance.tags, "aws:ResourceTag", "ec2:ResourceTag")
    if instance.instance_type:
        context["ec2:InstanceType"] = instance.instance_type
    return context


def _ec2(request: Request, env: Environment) -> list[Authorization]:
    operation, params = request.operation, request.params
    action = f"ec2:{operation}"
    if operation.startswith("Describe"):
        return [Authorization(action, "*")]
    if operation in _INSTANCE_LIFECYCLE:
        return [
            Authorization(action, _ec2_resource(request, instance), _instance_context(request, env, instance))
            for instance in params.get("InstanceIds", [])
        ]
    if operation == "CreateTags":
        found = []
        tags = request_tag_context(_tags(params.get("Tags", [])))
        for resource_id in params.get("Resources", []):
            context = dict(tags)
            if resource_id.startswith("i-"):
                context.update(_instance_context(request, env, resource_id))
            found.append(Authorization(action, _ec2_resource(request, resource_id), context))
        return found
    if operation == "RunInstances":
        return _run_instances(request, env)
    raise Unmodelled(f"ec2:{operation}")


def _run_instances(request: Request, env: Environment) -> list[Authorization]:
    """The instance, image, subnet, security groups, network interface, volume and key pair of a launch,
    its tagging, and the role it passes (ec2 service authorization reference, RunInstances)."""
    params = request.params
    action = "ec2:RunInstances"
    tagged = {
        str(spec.get("ResourceType")): _tags(spec.get("Tags", []))
        for spec in params.get("TagSpecifications", [])
    }
    image_id = str(params["ImageId"])
    owner = env.lookups.image_owner(request.region, image_id)
    if owner is None:
        raise MissingResource(f"image {image_id} in {request.region}")

    interfaces = params.get("NetworkInterfaces") or [{}]
    subnet = params.get("SubnetId") or interfaces[0].get("SubnetId")
    groups: Sequence[str] = params.get("SecurityGroupIds") or interfaces[0].get("Groups") or ()
    if not subnet or not groups:
        default_subnet, default_groups = env.lookups.default_network(request.region)
        subnet = subnet or default_subnet
        groups = groups or default_groups
    if params.get("SecurityGroups"):
        raise Unmodelled("ec2:RunInstances with security groups by name")

    instance: dict[str, ContextValue] = {"ec2:InstanceType": str(params.get("InstanceType", "m1.small"))}
    if "instance" in tagged:
        instance.update(request_tag_context(tagged["instance"]))
    metadata = params.get("MetadataOptions") or {}
    for key, condition in (
        ("HttpTokens", "ec2:MetadataHttpTokens"),
        ("HttpEndpoint", "ec2:MetadataHttpEndpoint"),
        ("HttpPutResponseHopLimit", "ec2:MetadataHttpPutResponseHopLimit"),
    ):
        if key in metadata:
            instance[condition] = str(metadata[key])
    profile = params.get("IamInstanceProfile") or {}
    profile_ref = profile.get("Arn") or profile.get("Name")
    roles: tuple[str, ...] = ()
    if profile_ref and env.localizer.is_stage_profile(str(profile_ref)) and env.model.instance_profiles:
        # The stage's own profile passes the role the template gives it, whatever the local one is called.
        ((canonical_profile, roles),) = list(env.model.instance_profiles.items())[:1]
        profile_ref = canonical_profile
    elif profile_ref:
        looked_up = env.lookups.instance_profile_roles(str(profile_ref))
        if looked_up is None:
            raise MissingResource(f"instance profile {profile_ref}")
        roles = looked_up
        instance["ec2:InstanceProfile"] = (
            str(profile_ref)
            if str(profile_ref).startswith("arn:")
            else f"arn:{PARTITION}:iam::{request.account}:instance-profile/{profile_ref}"
        )

    created_instance = request.arn("ec2", "instance/*")
    found = [
        Authorization(action, created_instance, instance),
        Authorization(
            action,
            request.arn("ec2", f"image/{image_id}", account=False),
            {"ec2:Owner": owner, "ec2:ImageType": "machine"},
        ),
        Authorization(
            action,
            request.arn("ec2", "network-interface/*"),
            {**request_tag_context(tagged["network-interface"])} if "network-interface" in tagged else {},
        ),
        Authorization(
            action,
            request.arn("ec2", "volume/*"),
            {**request_tag_context(tagged["volume"])} if "volume" in tagged else {},
        ),
    ]
    if subnet:
        found.append(Authorization(action, request.arn("ec2", f"subnet/{subnet}")))
    found += [Authorization(action, request.arn("ec2", f"security-group/{group}")) for group in groups]
    if params.get("KeyName"):
        found.append(Authorization(action, request.arn("ec2", f"key-pair/{params['KeyName']}")))
    # Tags given at launch are authorized as ec2:CreateTags on each resource they tag, "as part of" it.
    for kind, tags in tagged.items():
        found.append(
            Authorization(
                "ec2:CreateTags",
                request.arn("ec2", f"{kind}/*"),
                {"ec2:CreateAction": "RunInstances", **request_tag_context(tags)},
            )
        )
    found += [
        Authorization(
            "iam:PassRole",
            role,
            {"iam:PassedToService": "ec2.amazonaws.com", "iam:AssociatedResourceArn": created_instance},
        )
        for role in roles
    ]
    return found


# ---- SSM Run Command ------------------------------------------------------------------------------

_SSM_WITHOUT_RESOURCE: Final = frozenset(
    {
        "GetCommandInvocation",
        "ListCommands",
        "ListCommandInvocations",
        "CancelCommand",
        "DescribeInstanceInformation",
    }
)


def _document_arn(request: Request, name: str) -> str:
    if name.startswith("arn:"):
        return name
    # Documents AWS owns have no account in their ARN.
    return request.arn("ssm", f"document/{name}", account=not name.startswith(("AWS", "Amazon")))


def _ssm(request: Request, env: Environment) -> list[Authorization]:
    operation, params = request.operation, request.params
    action = f"ssm:{operation}"
    if operation in _SSM_WITHOUT_RESOURCE:
        return [Authorization(action, "*")]
    if operation == "SendCommand":
        if params.get("Targets"):
            raise Unmodelled("ssm:SendCommand to tag targets")
        found = [Authorization(action, _document_arn(request, str(params["DocumentName"])))]
        for instance_id in params.get("InstanceIds", []):
            instance = env.lookups.instance(request.region, instance_id)
            if instance is None:
                raise MissingResource(f"instance {instance_id} in {request.region}")
            found.append(
                Authorization(
                    action,
                    request.arn("ec2", f"instance/{instance_id}"),
                    resource_tag_context(instance.tags, "ssm:resourceTag", "aws:ResourceTag"),
                )
            )
        return found
    if operation in {"GetParameter", "GetParameters"}:
        names = params.get("Names") or [params["Name"]]
        return [
            Authorization(f"ssm:{operation}", request.arn("ssm", f"parameter/{str(name).lstrip('/')}"))
            for name in names
        ]
    raise Unmodelled(f"ssm:{operation}")


# ---- Step Functions -------------------------------------------------------------------------------

_SFN_BY_PARAMETER: Final = {
    "StartExecution": "stateMachineArn",
    "StartSyncExecution": "stateMachineArn",
    "ListExecutions": "stateMachineArn",
    "DescribeStateMachine": "stateMachineArn",
    "DescribeExecution": "executionArn",
    "StopExecution": "executionArn",
    "GetExecutionHistory": "executionArn",
}
# Authorized by the task token, which IAM has no resource for.
_SFN_TOKEN_ANSWERS: Final = frozenset({"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"})


def _sfn(request: Request, env: Environment) -> list[Authorization]:
    operation = request.operation
    action = f"states:{operation}"
    if operation in _SFN_TOKEN_ANSWERS:
        return [Authorization(action, "*")]
    parameter = _SFN_BY_PARAMETER.get(operation)
    if parameter is None:
        raise Unmodelled(f"states:{operation}")
    return [Authorization(action, str(request.params[parameter]))]


# ---- EventBridge, SNS, CloudWatch -----------------------------------------------------------------


def _events(request: Request, env: Environment) -> list[Authorization]:
    if request.operation != "PutEvents":
        raise Unmodelled(f"events:{request.operation}")
    found = []
    for entry in request.params.get("Entries", []):
        bus = str(entry.get("EventBusName") or "default")
        arn = bus if bus.startswith("arn:") else request.arn("events", f"event-bus/{bus}")
        context: dict[str, ContextValue] = {}
        if "Source" in entry:
            context["events:source"] = str(entry["Source"])
        if "DetailType" in entry:
            context["events:detail-type"] = str(entry["DetailType"])
        found.append(Authorization("events:PutEvents", arn, context))
    return found


def _sns(request: Request, env: Environment) -> list[Authorization]:
    if request.operation != "Publish":
        raise Unmodelled(f"sns:{request.operation}")
    topic = str(request.params.get("TopicArn") or request.params.get("TargetArn") or "")
    if not topic:
        raise Unmodelled("sns:Publish to a phone number")
    found = [Authorization("sns:Publish", topic)]
    # An encrypted topic: SNS asks KMS for a data key on the publisher's behalf, with its permissions.
    key = env.model.topic_keys.get(env.localizer.canonical(topic))
    if key is not None:
        via = {"kms:ViaService": f"sns.{request.region}.amazonaws.com", "kms:CallerAccount": request.account}
        found += [Authorization("kms:GenerateDataKey", key, via), Authorization("kms:Decrypt", key, via)]
    return found


def _cloudwatch(request: Request, env: Environment) -> list[Authorization]:
    if request.operation in {"GetMetricData", "GetMetricStatistics", "ListMetrics"}:
        return [Authorization(f"cloudwatch:{request.operation}", "*")]
    if request.operation == "DescribeAlarms" and request.params.get("AlarmNames"):
        # Authorized on each named alarm's ARN.
        return [
            Authorization("cloudwatch:DescribeAlarms", request.arn("cloudwatch", f"alarm:{name}"))
            for name in request.params["AlarmNames"]
        ]
    if request.operation == "DescribeAlarms":
        return [Authorization("cloudwatch:DescribeAlarms", request.arn("cloudwatch", "alarm:*"))]
    if request.operation == "PutMetricData":
        namespace = str(request.params.get("Namespace", ""))
        return [Authorization("cloudwatch:PutMetricData", "*", {"cloudwatch:namespace": namespace})]
    raise Unmodelled(f"cloudwatch:{request.operation}")


# ---- DynamoDB -------------------------------------------------------------------------------------

_DYNAMODB_ITEM: Final = frozenset(
    {"GetItem", "PutItem", "UpdateItem", "DeleteItem", "Query", "Scan", "DescribeTable"}
)
# A transaction is authorized per item, on that item's own action.
_TRANSACTION_ACTIONS: Final = {
    "Put": "PutItem",
    "Update": "UpdateItem",
    "Delete": "DeleteItem",
    "ConditionCheck": "ConditionCheckItem",
    "Get": "GetItem",
}


def _table_arn(request: Request, table: str, index: str | None = None) -> str:
    arn = table if table.startswith("arn:") else request.arn("dynamodb", f"table/{table}")
    return f"{arn}/index/{index}" if index else arn


def _dynamodb(request: Request, env: Environment) -> list[Authorization]:
    operation, params = request.operation, request.params
    if operation in _DYNAMODB_ITEM:
        index = params.get("IndexName") if operation in {"Query", "Scan"} else None
        return [Authorization(f"dynamodb:{operation}", _table_arn(request, str(params["TableName"]), index))]
    if operation in {"BatchGetItem", "BatchWriteItem"}:
        return [
            Authorization(f"dynamodb:{operation}", _table_arn(request, str(table)))
            for table in params.get("RequestItems", {})
        ]
    if operation in {"TransactWriteItems", "TransactGetItems"}:
        found = []
        for item in params.get("TransactItems", []):
            for kind, body in item.items():
                found.append(
                    Authorization(
                        f"dynamodb:{_TRANSACTION_ACTIONS[kind]}", _table_arn(request, str(body["TableName"]))
                    )
                )
        return found
    raise Unmodelled(f"dynamodb:{operation}")


_TRANSLATORS: Final[dict[str, Callable[[Request, Environment], list[Authorization]]]] = {
    "ec2": _ec2,
    "ssm": _ssm,
    "sfn": _sfn,
    "eventbridge": _events,
    "sns": _sns,
    "cloudwatch": _cloudwatch,
    "dynamodb": _dynamodb,
}
