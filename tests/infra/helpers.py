"""Small readers over synthesized templates, so the tests state what they check and not how to dig."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aws_cdk.assertions import Template


@dataclass(frozen=True)
class Grant:
    """One action on one resource, with the statement's condition (JSON, for comparison)."""

    action: str
    resource: str
    condition: str

    @property
    def conditions(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.condition)
        return parsed


def resources(template: Template, resource_type: str) -> dict[str, dict[str, Any]]:
    return {
        logical_id: dict(resource) for logical_id, resource in template.find_resources(resource_type).items()
    }


def properties(template: Template, resource_type: str) -> list[dict[str, Any]]:
    return [resource.get("Properties", {}) for resource in resources(template, resource_type).values()]


def function_logical_id(template: Template, function_name: str) -> str:
    for logical_id, resource in resources(template, "AWS::Lambda::Function").items():
        if resource["Properties"].get("FunctionName") == function_name:
            return logical_id
    raise AssertionError(f"no Lambda function named {function_name}")


def function_properties(template: Template, function_name: str) -> dict[str, Any]:
    logical_id = function_logical_id(template, function_name)
    props: dict[str, Any] = resources(template, "AWS::Lambda::Function")[logical_id]["Properties"]
    return props


def role_of_function(template: Template, function_name: str) -> str:
    role = function_properties(template, function_name)["Role"]
    logical_id: str = role["Fn::GetAtt"][0]
    return logical_id


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def grants_of_role(template: Template, role_logical_id: str) -> set[Grant]:
    """Every (action, resource, condition) the role's inline policies allow."""
    grants: set[Grant] = set()
    for policy in properties(template, "AWS::IAM::Policy"):
        if {"Ref": role_logical_id} not in policy.get("Roles", []):
            continue
        for statement in policy["PolicyDocument"]["Statement"]:
            assert statement["Effect"] == "Allow"
            condition = json.dumps(statement.get("Condition", {}), sort_keys=True)
            for action in _as_list(statement["Action"]):
                for resource in _as_list(statement["Resource"]):
                    grants.add(Grant(action, json.dumps(resource, sort_keys=True), condition))
    return grants


def grants_of_function(template: Template, function_name: str) -> set[Grant]:
    return grants_of_role(template, role_of_function(template, function_name))


def actions_of_function(template: Template, function_name: str) -> set[str]:
    return {grant.action for grant in grants_of_function(template, function_name)}


def flat(value: Any) -> str:
    """A CloudFormation value as one string: GetAtt/Ref as <Id.Attr>/<Id>, Join concatenated."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if "Fn::Join" in value:
            delimiter, parts = value["Fn::Join"]
            return str(delimiter).join(flat(part) for part in parts)
        if "Fn::GetAtt" in value:
            return "<{}.{}>".format(*value["Fn::GetAtt"])
        if "Ref" in value:
            return f"<{value['Ref']}>"
        if "Fn::Sub" in value:
            return str(value["Fn::Sub"])
    return json.dumps(value, sort_keys=True)
