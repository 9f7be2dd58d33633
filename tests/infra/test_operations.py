"""Worker operations in the stack: the catalogue's command documents, the functions' settings, and
SendCommand granted only for those documents and only on instances tagged as fleetkeeper's."""

from __future__ import annotations

import json
from typing import Any

import pytest
from aws_cdk.assertions import Template

from fleetkeeper.domain.operations import Catalogue
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE
from tests.infra.conftest import shipped_cdk_json_context
from tests.infra.helpers import flat, function_properties, grants_of_function, properties

RUNNERS = ("reconcile", "drain-tasks")


def catalogue(stage: str) -> dict[str, Any]:
    entries: dict[str, Any] = shipped_cdk_json_context()["fleetkeeper:stages"][stage]["operations"][
        "catalogue"
    ]
    return entries


@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_given_a_stage_then_it_ships_the_three_operations_each_as_its_own_command_document(
    synthesized: Any, stage: str
) -> None:
    entries = catalogue(stage)
    assert sorted(entries) == ["collect-system-info", "deregister-license", "register-license"]
    assert [n for n, e in entries.items() if e.get("cleanup")] == ["deregister-license"]
    documents = properties(synthesized.template(stage), "AWS::SSM::Document")
    assert sorted(d["Name"] for d in documents) == sorted(e["document"] for e in entries.values())
    assert {d["DocumentType"] for d in documents} == {"Command"}
    assert {d["UpdateMethod"] for d in documents} == {"NewVersion"}


def test_given_register_license_then_the_token_is_read_on_the_machine_by_parameter_name(
    dev: Template,
) -> None:
    [document] = [d for d in properties(dev, "AWS::SSM::Document") if d["Name"].endswith("RegisterLicense")]
    content = json.dumps(document["Content"])
    assert "--with-decryption --name '{{ licenseParameter }}'" in content
    assert document["Content"]["parameters"]["licenseParameter"]["allowedPattern"].startswith("^/")
    # The token is piped to the hook: never an argument, never echoed.
    assert '| \\"/opt/fleetkeeper/hooks/register-license\\"' in content


@pytest.mark.parametrize("function", RUNNERS)
def test_given_the_runners_then_send_command_reaches_only_catalogue_documents_on_managed_instances(
    dev: Template, function: str
) -> None:
    send = [
        g for g in grants_of_function(dev, f"fleetkeeper-dev-{function}") if g.action == "ssm:SendCommand"
    ]
    documents = sorted(
        flat(json.loads(g.resource)) for g in send if ":document/" in flat(json.loads(g.resource))
    )
    instances = [g for g in send if ":document/" not in flat(json.loads(g.resource))]

    names = sorted(e["document"] for e in catalogue("dev").values())
    assert [d.rsplit("/", 1)[-1] for d in documents] == names
    assert all(":ssm:eu-west-1:" in d for d in documents)  # dev's one worker region
    assert len(instances) == 1
    assert flat(json.loads(instances[0].resource)).endswith(":ec2:eu-west-1:<AWS::AccountId>:instance/*")
    assert instances[0].conditions == {
        "StringEquals": {f"ssm:resourceTag/{MANAGED_BY_TAG}": MANAGED_BY_VALUE}
    }
    # A document grant carries no wildcard: no AWS-RunShellScript, no document/*.
    assert not [d for d in documents if "*" in d]


def test_given_the_functions_then_each_reads_the_catalogue_and_drain_tasks_outlasts_the_before_stop_timeout(
    dev: Template,
) -> None:
    expected = catalogue("dev")
    for name in ("api", "reconcile", "drain-tasks"):
        variables = function_properties(dev, f"fleetkeeper-dev-{name}")["Environment"]["Variables"]
        shipped = Catalogue(operations=json.loads(variables["OPERATIONS_CATALOGUE"]))
        assert sorted(shipped.operations) == sorted(expected)
        assert variables["BEFORE_STOP_TIMEOUT_SECONDS"] == "120"
    assert function_properties(dev, "fleetkeeper-dev-drain-tasks")["Timeout"] == 180


def test_given_a_worker_region_besides_the_home_region_then_its_stack_carries_the_same_documents(
    synthesized: Any,
) -> None:
    home = sorted(d["Name"] for d in properties(synthesized.template("pinned"), "AWS::SSM::Document"))
    forwarders = synthesized.stacks["pinned"].forwarders
    assert set(forwarders) == {"us-east-1"}
    template = Template.from_stack(forwarders["us-east-1"])
    assert sorted(d["Name"] for d in properties(template, "AWS::SSM::Document")) == home
    assert len(home) == 3


def test_given_discovery_then_it_reads_the_agents_ping_in_the_worker_regions_and_runs_no_command(
    pinned: Template,
) -> None:
    grants = grants_of_function(pinned, "fleetkeeper-pinned-discover")
    (ping,) = [g for g in grants if g.action == "ssm:DescribeInstanceInformation"]

    assert ping.conditions == {"StringEquals": {"aws:RequestedRegion": ["eu-west-1", "us-east-1"]}}
    assert not [g for g in grants if g.action in {"ssm:SendCommand", "ssm:GetCommandInvocation"}]
    # It decides which workers use operations from the same catalogue the runners read.
    variables = function_properties(pinned, "fleetkeeper-pinned-discover")["Environment"]["Variables"]
    assert "collect-system-info" in json.loads(variables["OPERATIONS_CATALOGUE"])
    assert variables["SYSTEM_INFO_INTERVAL_SECONDS"] == "3600"
