"""The stack's outputs keep fixed logical ids, so scripts and operators can rely on them."""

from __future__ import annotations

import pytest

from infra import stack as fleet_stack
from tests.infra.helpers import resources

OUTPUTS = {
    fleet_stack.OUTPUT_API_URL: "AWS::ApiGateway::RestApi",
    fleet_stack.OUTPUT_TABLE_NAME: "AWS::DynamoDB::Table",
    fleet_stack.OUTPUT_STATE_MACHINE_ARN: "AWS::StepFunctions::StateMachine",
    fleet_stack.OUTPUT_AUDIT_BUS_NAME: "AWS::Events::EventBus",
    fleet_stack.OUTPUT_TOPIC_ARN: "AWS::SNS::Topic",
    fleet_stack.OUTPUT_OPERATOR_POLICY_ARN: "AWS::IAM::ManagedPolicy",
    fleet_stack.OUTPUT_READ_ONLY_POLICY_ARN: "AWS::IAM::ManagedPolicy",
    fleet_stack.OUTPUT_DASHBOARD_NAME: "AWS::CloudWatch::Dashboard",
    fleet_stack.OUTPUT_WORKER_PROFILE: "AWS::IAM::InstanceProfile",
}


@pytest.mark.parametrize("stage", ["dev", "prod", "pinned"])
def test_given_any_stage_then_it_has_exactly_the_stable_outputs(synthesized, stage):
    outputs = synthesized.template(stage).find_outputs("*")
    assert set(outputs) == set(OUTPUTS)


def test_given_each_output_then_it_refers_to_a_resource_of_the_right_kind(dev):
    outputs = dev.find_outputs("*")
    for name, resource_type in OUTPUTS.items():
        referenced = str(outputs[name]["Value"])
        assert any(logical in referenced for logical in resources(dev, resource_type)), name


def test_given_the_api_url_then_it_points_at_the_stage(dev):
    value = str(dev.find_outputs(fleet_stack.OUTPUT_API_URL)[fleet_stack.OUTPUT_API_URL]["Value"])
    assert "https://" in value
    assert "execute-api" in value


def test_given_the_policy_outputs_then_they_name_the_operator_and_read_only_policies(dev):
    outputs = dev.find_outputs("*")
    policies = resources(dev, "AWS::IAM::ManagedPolicy")
    by_name = {p["Properties"]["ManagedPolicyName"]: logical for logical, p in policies.items()}
    assert outputs[fleet_stack.OUTPUT_OPERATOR_POLICY_ARN]["Value"] == {
        "Ref": by_name["fleetkeeper-dev-api-operator"]
    }
    assert outputs[fleet_stack.OUTPUT_READ_ONLY_POLICY_ARN]["Value"] == {
        "Ref": by_name["fleetkeeper-dev-api-read-only"]
    }
