"""The drain state machine is the ASL file, every placeholder substituted, no execution data logged."""

from __future__ import annotations

import json

from aws_cdk.assertions import Template

from infra.drain_workflow import ASL_FILE, TASK_FUNCTION_ARN, asl_placeholders
from tests.infra.conftest import Synthesized
from tests.infra.helpers import function_logical_id, grants_of_role, properties, resources


def only_state_machine(template):
    (state_machine,) = properties(template, "AWS::StepFunctions::StateMachine")
    return state_machine


def deployed_definition(synthesized: Synthesized, template: Template) -> str:
    location = only_state_machine(template)["DefinitionS3Location"]
    return (synthesized.outdir / f"asset.{location['Key']}").read_text(encoding="utf-8")


def test_given_a_stage_then_the_drain_state_machine_is_standard_and_named_for_the_stage(dev, prod):
    assert only_state_machine(dev)["StateMachineType"] == "STANDARD"
    assert only_state_machine(dev)["StateMachineName"] == "fleetkeeper-dev-drain"
    assert only_state_machine(prod)["StateMachineName"] == "fleetkeeper-prod-drain"


def test_given_the_asl_file_then_the_deployed_definition_is_that_file(synthesized, dev):
    assert deployed_definition(synthesized, dev) == ASL_FILE.read_text(encoding="utf-8")


def test_given_the_definition_then_every_placeholder_is_substituted_with_the_drain_tasks_arn(
    synthesized, dev
):
    definition = deployed_definition(synthesized, dev)
    substitutions = only_state_machine(dev)["DefinitionSubstitutions"]
    assert TASK_FUNCTION_ARN in asl_placeholders(definition)
    assert asl_placeholders(definition) <= set(substitutions)
    drain_tasks = function_logical_id(dev, "fleetkeeper-dev-drain-tasks")
    assert substitutions[TASK_FUNCTION_ARN] == {"Fn::GetAtt": [drain_tasks, "Arn"]}


def test_given_the_definition_then_it_is_asl_with_reachable_states(synthesized, dev):
    asl = json.loads(deployed_definition(synthesized, dev))
    assert asl["StartAt"] in asl["States"]
    tasks = [state for state in asl["States"].values() if state["Type"] == "Task"]
    assert tasks
    assert all("Retry" in task and "Catch" in task for task in tasks)


def test_given_the_state_machine_then_it_logs_events_without_execution_data_and_traces(dev):
    # Execution data carries the live callback token: a log must never hold it.
    state_machine = only_state_machine(dev)
    logging = state_machine["LoggingConfiguration"]
    assert logging["Level"] == "ALL"
    assert logging["IncludeExecutionData"] is False
    log_group = logging["Destinations"][0]["CloudWatchLogsLogGroup"]["LogGroupArn"]["Fn::GetAtt"][0]
    assert resources(dev, "AWS::Logs::LogGroup")[log_group]["Properties"]["LogGroupName"] == (
        "/aws/vendedlogs/states/fleetkeeper-dev-drain"
    )
    assert state_machine["TracingConfiguration"] == {"Enabled": True}


def test_given_the_state_machine_role_then_it_invokes_drain_tasks_and_no_other_function(dev):
    role = only_state_machine(dev)["RoleArn"]["Fn::GetAtt"][0]
    invokes = {grant.resource for grant in grants_of_role(dev, role) if grant.action.startswith("lambda:")}
    drain_tasks = function_logical_id(dev, "fleetkeeper-dev-drain-tasks")
    assert invokes == {json.dumps({"Fn::GetAtt": [drain_tasks, "Arn"]})}


def test_given_a_definition_text_then_placeholders_are_found_by_name():
    assert asl_placeholders('{"A": "${One}", "B": "${Two_2}:${One}", "C": "$.x"}') == {"One", "Two_2"}
