"""Least-privilege helpers: explicit IAM statements, and a written reason for every cdk-nag finding.

cdk-nag names an IAM wildcard finding after the flattened resource, e.g.
`AwsSolutions-IAM5[Resource::arn:aws:ec2:eu-west-1:<AWS::AccountId>:instance/*]`. The statements here
compute that name from the very ARN they grant, so an acknowledgment can never drift from its statement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from aws_cdk import Acknowledgment, Stack, Validations
from aws_cdk import aws_iam as iam
from constructs import IConstruct

NAG_PACK: Final = "AwsSolutions"


def flatten_reference(value: Any) -> str:
    """A resolved CloudFormation value as one string, the way cdk-nag spells it in finding ids."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.replace("${", "<").replace("}", ">")
    if isinstance(value, Mapping):
        if "Fn::Join" in value:
            delimiter, parts = value["Fn::Join"]
            return str(delimiter).join(flatten_reference(part) for part in parts)
        if "Fn::Sub" in value:
            return flatten_reference(value["Fn::Sub"])
        if "Fn::GetAtt" in value:
            resource, attribute = value["Fn::GetAtt"]
            return f"<{flatten_reference(resource)}.{flatten_reference(attribute)}>"
        if "Fn::ImportValue" in value:
            return flatten_reference(value["Fn::ImportValue"])
        if "Ref" in value:
            return f"<{flatten_reference(value['Ref'])}>"
    raise ValueError(f"cannot flatten CloudFormation value {value!r} into a cdk-nag finding id")


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Accept one cdk-nag finding on scope and its children, with the reason it is acceptable."""
    if len(reason.split()) < 6:
        raise ValueError(f"{rule}: a suppression needs a specific reason, not {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{NAG_PACK}-{rule}", reason=reason))


def acknowledge_aws_managed_policy(scope: IConstruct, policy_name: str, reason: str) -> None:
    """Accept an AWS managed policy (IAM4) on scope, named as cdk-nag flattens its ARN."""
    arn = iam.ManagedPolicy.from_aws_managed_policy_name(policy_name).managed_policy_arn
    acknowledge(scope, f"IAM4[Policy::{flatten_reference(Stack.of(scope).resolve(arn))}]", reason)


def wildcard_resources(scope: IConstruct, resources: Sequence[str]) -> list[str]:
    """The flattened resources that cdk-nag reports as wildcards (they contain '*')."""
    stack = Stack.of(scope)
    flattened = (flatten_reference(stack.resolve(resource)) for resource in resources)
    return [resource for resource in flattened if "*" in resource]


def allow(
    role: iam.IRole,
    *,
    actions: Sequence[str],
    resources: Sequence[str],
    conditions: Mapping[str, Mapping[str, Any]] | None = None,
    wildcard_reason: str | None = None,
) -> None:
    """Add one Allow statement to the role; a resource wildcard must come with the reason it is needed."""
    if any("*" in action for action in actions):
        raise ValueError(f"wildcard actions are not allowed: {list(actions)}")
    role.add_to_principal_policy(
        iam.PolicyStatement(actions=list(actions), resources=list(resources), conditions=conditions)
    )
    acknowledge_wildcards(role, resources, wildcard_reason, what=list(actions))


def acknowledge_wildcards(
    scope: IConstruct, resources: Sequence[str], reason: str | None, *, what: object = "statement"
) -> None:
    """Acknowledge the IAM5 finding of each wildcard resource on scope; wildcards without a reason fail."""
    wildcards = wildcard_resources(scope, resources)
    if wildcards and not reason:
        raise ValueError(f"{what} on {wildcards}: a resource wildcard needs a reason")
    for resource in wildcards:
        acknowledge(scope, f"IAM5[Resource::{resource}]", str(reason))
