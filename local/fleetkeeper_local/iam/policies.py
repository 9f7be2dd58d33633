"""The IAM policies each function deploys with, read from the synthesized template of the dev stage.

The template (synth.py) is synthesized once per change of what shapes it, and cached under
build/iam/, keyed by a hash of infra/, cdk.json and the fleetkeeper modules infra imports; a file lock
makes parallel test processes wait for one synthesis instead of running several.

CloudFormation intrinsics are resolved to the local stack: the account is moto's, the region is the
local one, and every resource a function calls gets a fixed *canonical* local name (the table is
`fleetkeeper-table`, the drain state machine `fleetkeeper-drain`, ...). The requests a function makes
name the local stack's real resources, whose names change with every test; `Localizer` renames exactly
those to the canonical names before evaluation, so one resolution serves every test and a request on any
other resource (another table, another state machine) keeps its own name and is judged as such.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Final

from fleetkeeper_local.iam.stage import LOCAL_HOME_REGION, LOCAL_WORKER_REGIONS, STAGE
from fleetkeeper_local.stack import LOCAL_ACCOUNT, project_root

PARTITION: Final = "aws"
STACK_NAME: Final = f"fleetkeeper-{STAGE}"
FUNCTION_PREFIX: Final = f"fleetkeeper-{STAGE}-"


@dataclass(frozen=True)
class CanonicalNames:
    """The names the template's resources resolve to, whatever the local stack called them."""

    account: str = LOCAL_ACCOUNT
    region: str = LOCAL_HOME_REGION
    table: str = "fleetkeeper-table"
    state_machine: str = "fleetkeeper-drain"
    bus: str = "fleetkeeper-audit"
    topic: str = "fleetkeeper-alerts"
    api_id: str = "fleetkeeperapi"

    def arn(
        self, service: str, resource: str, *, region: str | None = None, account: str | None = None
    ) -> str:
        where = self.region if region is None else region
        owner = self.account if account is None else account
        return f"arn:{PARTITION}:{service}:{where}:{owner}:{resource}"

    @property
    def table_arn(self) -> str:
        return self.arn("dynamodb", f"table/{self.table}")

    @property
    def state_machine_arn(self) -> str:
        return self.arn("states", f"stateMachine:{self.state_machine}")

    @property
    def bus_arn(self) -> str:
        return self.arn("events", f"event-bus/{self.bus}")

    @property
    def topic_arn(self) -> str:
        return self.arn("sns", self.topic)


CANONICAL: Final = CanonicalNames()

# ---- the synthesized template, cached ----------------------------------------------------------------

BUILD_DIR: Final = Path("build") / "iam"
_FLEETKEEPER: Final = Path("layers") / "fleetkeeper" / "python" / "fleetkeeper"
# What the template's policies depend on: the CDK code and settings, and the fleetkeeper modules infra
# reads names and rules from (tags, the table's indexes, the operations catalogue). Function code only
# changes asset hashes, which no policy mentions.
_HASHED: Final = (
    ("infra", "**/*.py"),
    ("infra", "**/*.json"),
    (".", "cdk.json"),
    (str(_FLEETKEEPER / "domain"), "**/*.py"),
    (str(_FLEETKEEPER / "store"), "schema.py"),
    ("local/fleetkeeper_local/iam", "synth.py"),
    ("local/fleetkeeper_local/iam", "stage.py"),
)
_REGIONS: Final = "regions"  # the inputs' entry for the local regions the template is homed on
# A synthesis's time when none ran here yet: about what one takes on a quiet 2-core machine.
FIRST_SYNTHESIS_ESTIMATE_SECONDS: Final = 40.0


def template_inputs(root: Path) -> dict[str, str]:
    """Each input of the template (path relative to `root`) and the hash of its content."""
    inputs = {_REGIONS: repr((LOCAL_HOME_REGION, LOCAL_WORKER_REGIONS))}
    for folder, pattern in _HASHED:
        for path in sorted((root / folder).glob(pattern)):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            inputs[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return inputs


def _key(inputs: Mapping[str, str]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:16]


def template_key(root: Path) -> str:
    return _key(template_inputs(root))


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _cached_template(root: Path, key: str) -> Path:
    return root / BUILD_DIR / f"{STAGE}-{key}.template.json"


def _manifest(template: Path) -> Path:
    """Beside each cached template: its inputs' hashes, and how long its synthesis took."""
    return template.with_name(template.name.removesuffix(".template.json") + ".inputs.json")


@dataclass(frozen=True)
class TemplateState:
    """The cached template for the current inputs, whether it is there, and if not, why not."""

    path: Path
    cached: bool
    why: str  # what changed since the last synthesis here ("" when cached)
    last_seconds: float | None  # how long the last synthesis here took, if one ran

    @property
    def estimate_seconds(self) -> float:
        return FIRST_SYNTHESIS_ESTIMATE_SECONDS if self.last_seconds is None else self.last_seconds


def _changes(before: Mapping[str, str], now: Mapping[str, str]) -> str:
    changed = sorted(name for name in before.keys() | now.keys() if before.get(name) != now.get(name))
    if _REGIONS in changed:
        return "the local regions changed"
    if len(changed) <= 2:
        return " and ".join(changed) + " changed"
    return f"{len(changed)} inputs changed ({', '.join(changed[:2])}, ...)"


def template_state(root: Path | None = None) -> TemplateState:
    """Whether the template of the current inputs is cached; what changed since the newest one if not."""
    root = root or project_root()
    inputs = template_inputs(root)
    path = _cached_template(root, _key(inputs))
    manifests = sorted((root / BUILD_DIR).glob(f"{STAGE}-*.inputs.json"), key=lambda m: m.stat().st_mtime)
    last = json.loads(manifests[-1].read_text(encoding="utf-8")) if manifests else None
    seconds = float(last["seconds"]) if last else None
    if path.exists():
        return TemplateState(path, cached=True, why="", last_seconds=seconds)
    why = _changes(last["inputs"], inputs) if last else "no synthesis recorded here yet"
    return TemplateState(path, cached=False, why=why, last_seconds=seconds)


def template_ready(root: Path | None = None) -> bool:
    """Whether the template is cached already (otherwise the first use synthesizes it, for seconds)."""
    return template_state(root).cached


def template_path(root: Path | None = None) -> Path:
    """The cached template of the local dev stage, synthesized first if its inputs changed."""
    root = root or project_root()
    build = root / BUILD_DIR
    inputs = template_inputs(root)
    target = _cached_template(root, _key(inputs))
    if target.exists():
        return target
    with _locked(build / "synth.lock"):
        if target.exists():  # another process synthesized it while this one waited
            return target
        staging = target.with_suffix(f".{os.getpid()}.tmp")
        started = time.monotonic()
        done = subprocess.run(  # noqa: S603 - our own module, fixed argv
            [sys.executable, "-m", "fleetkeeper_local.iam.synth", "--out", str(staging)],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "local")])},
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"synthesizing the {STAGE} stage for IAM evaluation failed:\n{done.stderr[-4000:]}"
            )
        for old in [*build.glob(f"{STAGE}-*.template.json"), *build.glob(f"{STAGE}-*.inputs.json")]:
            old.unlink(missing_ok=True)
        manifest = {"inputs": inputs, "seconds": round(time.monotonic() - started, 1)}
        _manifest(target).write_text(json.dumps(manifest, indent=1, sort_keys=True), encoding="utf-8")
        staging.rename(target)
    return target


# ---- CloudFormation intrinsics -> local values -----------------------------------------------------


class TemplateError(ValueError):
    """The template uses something this resolver cannot resolve."""


_SUB_VARIABLE: Final = re.compile(r"\$\{([^}!][^}]*)\}")


class Resolver:
    """Resolves Ref, Fn::GetAtt, Fn::Join, Fn::Sub, Fn::Select, Fn::Split and pseudo parameters."""

    def __init__(self, template: Mapping[str, Any], names: CanonicalNames = CANONICAL) -> None:
        self._resources: Mapping[str, Any] = template.get("Resources", {})
        self._parameters: Mapping[str, Any] = template.get("Parameters", {})
        self.names = names
        self._renames = self._literal_renames()

    def _literal_renames(self) -> list[tuple[str, str]]:
        """Names written literally into ARNs (a state machine named up front): dev's name -> canonical."""
        renames: list[tuple[str, str]] = []
        for resource in self._resources.values():
            properties = resource.get("Properties", {})
            if resource["Type"] == "AWS::StepFunctions::StateMachine" and "StateMachineName" in properties:
                name = properties["StateMachineName"]
                canonical = self.names.state_machine
                renames += [(f"stateMachine:{name}", f"stateMachine:{canonical}")]
                renames += [(f"execution:{name}:", f"execution:{canonical}:")]
            if resource["Type"] == "AWS::Events::EventBus" and "Name" in properties:
                renames += [(f"event-bus/{properties['Name']}", f"event-bus/{self.names.bus}")]
        return renames

    def pseudo(self, name: str) -> str:
        names = self.names
        values = {
            "AWS::AccountId": names.account,
            "AWS::Region": names.region,
            "AWS::Partition": PARTITION,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackName": STACK_NAME,
            "AWS::StackId": names.arn("cloudformation", f"stack/{STACK_NAME}/local"),
        }
        if name in values:
            return values[name]
        if name in self._parameters:
            default = self._parameters[name].get("Default")
            return str(default) if default is not None else f"<{name}>"
        raise TemplateError(f"unknown parameter {name}")

    def ref(self, logical: str) -> str:
        if logical.startswith("AWS::") or logical in self._parameters:
            return self.pseudo(logical)
        resource = self._resources.get(logical)
        if resource is None:
            raise TemplateError(f"Ref to unknown resource {logical}")
        return self._physical(logical, resource, "Ref")

    def get_att(self, logical: str, attribute: str) -> str:
        resource = self._resources.get(logical)
        if resource is None:
            raise TemplateError(f"Fn::GetAtt of unknown resource {logical}")
        return self._physical(logical, resource, attribute)

    def _physical(self, logical: str, resource: Mapping[str, Any], attribute: str) -> str:
        kind = resource["Type"]
        properties = resource.get("Properties", {})
        names = self.names
        if kind == "AWS::DynamoDB::Table":
            return names.table if attribute == "Ref" else names.table_arn
        if kind == "AWS::StepFunctions::StateMachine":
            return names.state_machine if attribute == "Name" else names.state_machine_arn
        if kind == "AWS::Events::EventBus":
            return names.bus if attribute in {"Ref", "Name"} else names.bus_arn
        if kind == "AWS::SNS::Topic":
            return names.topic if attribute == "TopicName" else names.topic_arn
        if kind == "AWS::KMS::Key":
            key_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"fleetkeeper-local/{logical}"))
            return key_id if attribute in {"Ref", "KeyId"} else names.arn("kms", f"key/{key_id}")
        if kind == "AWS::ApiGateway::RestApi":
            return names.api_id if attribute == "Ref" else f"{names.api_id}-root"
        name = self._name(logical, properties)
        if kind == "AWS::IAM::Role":
            return (
                name
                if attribute in {"Ref", "RoleName"}
                else f"arn:{PARTITION}:iam::{names.account}:role/{name}"
            )
        if kind == "AWS::IAM::InstanceProfile":
            if attribute == "Ref":
                return name
            return f"arn:{PARTITION}:iam::{names.account}:instance-profile/{name}"
        if kind == "AWS::IAM::ManagedPolicy":
            return f"arn:{PARTITION}:iam::{names.account}:policy/{name}"
        if kind == "AWS::SQS::Queue":
            if attribute == "Ref":
                return f"https://sqs.{names.region}.amazonaws.com/{names.account}/{name}"
            return name if attribute == "QueueName" else names.arn("sqs", name)
        if kind == "AWS::Lambda::Function":
            return name if attribute == "Ref" else names.arn("lambda", f"function:{name}")
        if kind == "AWS::Logs::LogGroup":
            return name if attribute == "Ref" else names.arn("logs", f"log-group:{name}:*")
        if kind == "AWS::Events::Rule":
            return names.arn("events", f"rule/{name}")
        if kind in {"AWS::SSM::Document", "AWS::SSM::Parameter"}:
            return name
        return logical if attribute == "Ref" else f"{logical}.{attribute}"

    @staticmethod
    def _name(logical: str, properties: Mapping[str, Any]) -> str:
        for key in (
            "RoleName",
            "InstanceProfileName",
            "ManagedPolicyName",
            "QueueName",
            "FunctionName",
            "LogGroupName",
            "Name",
        ):
            value = properties.get(key)
            if isinstance(value, str):
                return value
        return logical

    def resolve(self, value: Any) -> Any:
        """The value with every intrinsic replaced by its local value (AWS::NoValue entries dropped)."""
        if isinstance(value, str):
            return self._rename(value)
        if isinstance(value, list):
            items = [self.resolve(item) for item in value if not _is_no_value(item)]
            return items
        if not isinstance(value, Mapping):
            return value
        if len(value) == 1:
            ((key, argument),) = value.items()
            if key == "Ref":
                return self._rename(self.ref(argument))
            if key == "Fn::GetAtt":
                logical, attribute = argument if isinstance(argument, list) else argument.split(".", 1)
                return self._rename(self.get_att(logical, attribute))
            if key == "Fn::Join":
                delimiter, parts = argument
                return self._rename(
                    str(delimiter).join(str(self.resolve(part)) for part in self.resolve(parts))
                )
            if key == "Fn::Sub":
                return self._rename(self._sub(argument))
            if key == "Fn::Select":
                index, items = argument
                return self.resolve(items)[int(self.resolve(index))]
            if key == "Fn::Split":
                delimiter, text = argument
                return str(self.resolve(text)).split(delimiter)
            if key.startswith("Fn::") or key == "Condition":
                raise TemplateError(f"{key} is not supported in IAM policies here")
        return {key: self.resolve(item) for key, item in value.items() if not _is_no_value(item)}

    def _sub(self, argument: Any) -> str:
        text, variables = (argument, {}) if isinstance(argument, str) else argument
        resolved = {name: self.resolve(item) for name, item in variables.items()}

        def replace(match: re.Match[str]) -> str:
            name = match.group(1)
            if name in resolved:
                return str(resolved[name])
            if "." in name:
                logical, attribute = name.split(".", 1)
                return self.get_att(logical, attribute)
            return self.ref(name)

        return _SUB_VARIABLE.sub(replace, text).replace("${!", "${")

    def _rename(self, text: str) -> str:
        for old, new in self._renames:
            text = text.replace(old, new)
        return text


def _is_no_value(value: Any) -> bool:
    return isinstance(value, Mapping) and value == {"Ref": "AWS::NoValue"}


# ---- the policies of each function, and the resource policies --------------------------------------

# AWS managed policies a function role might carry, by name: only what they grant the code itself.
# A role with any other AWS managed policy fails loudly rather than being evaluated without it.
AWS_MANAGED_POLICIES: Final[dict[str, dict[str, Any]]] = {
    "service-role/AWSLambdaBasicExecutionRole": {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"],
                "Resource": "*",
            }
        ],
    },
    "AWSXRayDaemonWriteAccess": {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": [
                    "xray:PutTraceSegments",
                    "xray:PutTelemetryRecords",
                    "xray:GetSamplingRules",
                    "xray:GetSamplingTargets",
                    "xray:GetSamplingStatisticSummaries",
                ],
                "Resource": "*",
            }
        ],
    },
}
_AWS_MANAGED_PREFIX: Final = f"arn:{PARTITION}:iam::aws:policy/"


@dataclass(frozen=True)
class NamedPolicy:
    name: str  # the template's logical id (or the AWS managed policy's name)
    document: Mapping[str, Any]


@dataclass(frozen=True)
class FunctionIdentity:
    """A function's execution role and the identity policies attached to it."""

    function: str  # "reconcile", as in fleetkeeper-<stage>-reconcile
    role_name: str
    role_arn: str
    policies: tuple[NamedPolicy, ...]

    @property
    def principal(self) -> str:
        """The role session the function's SDK signs with."""
        session = f"{self.role_name}/{FUNCTION_PREFIX}{self.function}"
        return f"arn:{PARTITION}:sts::{CANONICAL.account}:assumed-role/{session}"


@dataclass(frozen=True)
class PolicyModel:
    """Every function's identity policies, the stage's managed policies and its resource policies."""

    set_id: str
    functions: Mapping[str, FunctionIdentity]
    managed_policies: Mapping[str, NamedPolicy]  # by ManagedPolicyName
    resource_policies: Mapping[str, NamedPolicy]  # by the resource's ARN (execute-api: the API's prefix)
    topic_keys: Mapping[str, str]  # topic ARN -> the KMS key ARN it is encrypted with
    instance_profiles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # profile ARN -> role ARNs

    def identity_documents(self) -> list[dict[str, Any]]:
        """Every identity policy once, named, as the evaluator's policy set holds them."""
        seen: dict[str, Mapping[str, Any]] = {}
        for identity in self.functions.values():
            for policy in identity.policies:
                seen[policy.name] = policy.document
        for policy in self.managed_policies.values():
            seen[policy.name] = policy.document
        return [{"name": name, "policy": document} for name, document in sorted(seen.items())]

    def resource_documents(self) -> dict[str, Any]:
        return {policy.name: policy.document for policy in self.resource_policies.values()}

    def resource_policy_for(self, arn: str) -> str | None:
        """The name of the resource policy that applies to this resource, if it has one."""
        found = self.resource_policies.get(arn)
        if found is not None:
            return found.name
        if arn.startswith("arn:aws:execute-api:"):
            api = arn.split(":", 5)[5].split("/", 1)[0]
            found = self.resource_policies.get(f"execute-api:{api}")
        return found.name if found is not None else None


def _refs(values: Any) -> list[str]:
    return [v["Ref"] for v in values or [] if isinstance(v, Mapping) and "Ref" in v]


class _ModelBuilder:
    """Collects, resource by resource, the policies a PolicyModel is made of."""

    def __init__(self, template: Mapping[str, Any], names: CanonicalNames) -> None:
        self.names = names
        self.resolver = Resolver(template, names)
        self.resources: Mapping[str, Any] = template.get("Resources", {})
        self.by_role: dict[str, list[NamedPolicy]] = {}
        self.managed: dict[str, NamedPolicy] = {}
        self.managed_by_arn: dict[str, NamedPolicy] = {}
        self.resource_policies: dict[str, NamedPolicy] = {}
        self.topic_keys: dict[str, str] = {}
        self.profiles: dict[str, tuple[str, ...]] = {}

    def policy(self, name: str, document: Any) -> NamedPolicy:
        return NamedPolicy(name, self.resolver.resolve(document))

    def attach(self, roles: Any, policy: NamedPolicy) -> None:
        for role in _refs(roles):
            self.by_role.setdefault(role, []).append(policy)

    def add(self, logical: str, kind: str, properties: Mapping[str, Any]) -> None:
        resolver = self.resolver
        if kind == "AWS::IAM::Policy":
            self.attach(properties.get("Roles"), self.policy(logical, properties["PolicyDocument"]))
        elif kind == "AWS::IAM::ManagedPolicy":
            policy = self.policy(logical, properties["PolicyDocument"])
            self.managed_by_arn[resolver.ref(logical)] = policy
            self.managed[str(properties.get("ManagedPolicyName", logical))] = policy
            self.attach(properties.get("Roles"), policy)
        elif kind == "AWS::IAM::Role":
            for inline in properties.get("Policies", []):
                policy = self.policy(f"{logical}.{inline['PolicyName']}", inline["PolicyDocument"])
                self.by_role.setdefault(logical, []).append(policy)
        elif kind == "AWS::IAM::InstanceProfile":
            roles = tuple(resolver.get_att(role, "Arn") for role in _refs(properties.get("Roles")))
            self.profiles[resolver.get_att(logical, "Arn")] = roles
        elif kind == "AWS::SNS::TopicPolicy":
            for topic in _refs(properties.get("Topics")):
                self.resource_policies[resolver.ref(topic)] = self.policy(
                    logical, properties["PolicyDocument"]
                )
        elif kind == "AWS::SQS::QueuePolicy":
            for queue in _refs(properties.get("Queues")):
                arn = resolver.get_att(queue, "Arn")
                self.resource_policies[arn] = self.policy(logical, properties["PolicyDocument"])
        elif kind == "AWS::KMS::Key":
            self.resource_policies[resolver.get_att(logical, "Arn")] = self.policy(
                logical, properties["KeyPolicy"]
            )
        elif kind == "AWS::ApiGateway::RestApi" and "Policy" in properties:
            api = resolver.ref(logical)
            self.resource_policies[f"execute-api:{api}"] = self.policy(logical, properties["Policy"])
        elif kind == "AWS::SNS::Topic" and "KmsMasterKeyId" in properties:
            self.topic_keys[resolver.ref(logical)] = str(resolver.resolve(properties["KmsMasterKeyId"]))

    def function(self, properties: Mapping[str, Any]) -> FunctionIdentity | None:
        name = properties.get("FunctionName")
        role = properties.get("Role", {}).get("Fn::GetAtt", [None])[0]
        if not isinstance(name, str) or not name.startswith(FUNCTION_PREFIX) or role is None:
            return None
        policies = list(self.by_role.get(role, []))
        for arn in self.resolver.resolve(self.resources[role]["Properties"].get("ManagedPolicyArns", [])):
            policies.append(_managed_policy(str(arn), self.managed_by_arn))
        return FunctionIdentity(
            function=name.removeprefix(FUNCTION_PREFIX),
            role_name=self.resolver.ref(role),
            role_arn=self.resolver.get_att(role, "Arn"),
            policies=tuple(policies),
        )


def build_model(template: Mapping[str, Any], names: CanonicalNames = CANONICAL) -> PolicyModel:
    """Read the functions' roles and policies, and the resource policies, out of the template."""
    builder = _ModelBuilder(template, names)
    for logical, resource in builder.resources.items():
        builder.add(logical, resource["Type"], resource.get("Properties", {}))
    functions: dict[str, FunctionIdentity] = {}
    for resource in builder.resources.values():
        if resource["Type"] == "AWS::Lambda::Function":
            identity = builder.function(resource.get("Properties", {}))
            if identity is not None:
                functions[identity.function] = identity
    return PolicyModel(
        set_id=hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16],
        functions=functions,
        managed_policies=builder.managed,
        resource_policies=builder.resource_policies,
        topic_keys=builder.topic_keys,
        instance_profiles=builder.profiles,
    )


def _managed_policy(arn: str, in_template: Mapping[str, NamedPolicy]) -> NamedPolicy:
    if arn.startswith(_AWS_MANAGED_PREFIX):
        name = arn.removeprefix(_AWS_MANAGED_PREFIX)
        document = AWS_MANAGED_POLICIES.get(name)
        if document is None:
            raise TemplateError(
                f"a function role carries the AWS managed policy {name}: add what it grants to "
                "AWS_MANAGED_POLICIES in fleetkeeper_local/iam/policies.py"
            )
        return NamedPolicy(name, document)
    if arn in in_template:
        return in_template[arn]
    raise TemplateError(f"managed policy {arn} is neither in the template nor an AWS managed policy")


@cache
def load_model(path: Path | None = None) -> PolicyModel:
    """The policy model of the cached local dev template (synthesized first when needed)."""
    template = json.loads((path or template_path()).read_text(encoding="utf-8"))
    return build_model(template)
