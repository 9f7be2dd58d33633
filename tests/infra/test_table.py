"""The DynamoDB table is the shared schema, on-demand, recoverable, encrypted, and kept in prod."""

from __future__ import annotations

from aws_cdk import App, Stack
from aws_cdk.assertions import Template

from fleetkeeper.domain.models import WorkerSummary
from fleetkeeper.store import schema
from infra.table import FleetTable
from tests.infra.helpers import properties, resources


def only_table(template):
    tables = resources(template, "AWS::DynamoDB::Table")
    assert len(tables) == 1
    return next(iter(tables.values()))


def test_given_the_schema_module_then_the_table_has_exactly_its_keys_and_indexes(dev):
    table = only_table(dev)["Properties"]
    assert table["KeySchema"] == [
        {"AttributeName": schema.PARTITION_KEY, "KeyType": "HASH"},
        {"AttributeName": schema.SORT_KEY, "KeyType": "RANGE"},
    ]
    assert sorted(table["AttributeDefinitions"], key=str) == sorted(schema.attribute_definitions(), key=str)
    assert table["GlobalSecondaryIndexes"] == schema.global_secondary_indexes()


def test_given_any_stage_then_the_table_is_on_demand_with_pitr_encryption_and_ttl(dev, prod):
    for template in (dev, prod):
        table = only_table(template)["Properties"]
        assert table["BillingMode"] == "PAY_PER_REQUEST"
        assert table["PointInTimeRecoverySpecification"] == {"PointInTimeRecoveryEnabled": True}
        assert table["SSESpecification"]["SSEEnabled"] is True
        assert table["TimeToLiveSpecification"] == {"AttributeName": schema.TTL_ATTRIBUTE, "Enabled": True}


def test_given_prod_then_the_table_is_protected_and_retained(prod):
    table = only_table(prod)
    assert table["Properties"]["DeletionProtectionEnabled"] is True
    assert table["DeletionPolicy"] == "Retain"
    assert table["UpdateReplacePolicy"] == "Retain"


def test_given_dev_then_the_table_can_be_torn_down(dev):
    table = only_table(dev)
    assert table["Properties"]["DeletionProtectionEnabled"] is False
    assert table["DeletionPolicy"] == "Delete"


def test_given_prod_then_log_groups_are_retained_too(prod, dev):
    assert {group.get("DeletionPolicy") for group in resources(prod, "AWS::Logs::LogGroup").values()} == {
        "Retain"
    }
    assert {group.get("DeletionPolicy") for group in resources(dev, "AWS::Logs::LogGroup").values()} == {
        "Delete"
    }


def test_given_stage_retention_then_every_log_group_keeps_logs_that_long(dev, prod):
    assert {group["RetentionInDays"] for group in properties(dev, "AWS::Logs::LogGroup")} == {14}
    assert {group["RetentionInDays"] for group in properties(prod, "AWS::Logs::LogGroup")} == {90}


def test_given_a_deferred_index_then_the_table_and_its_grants_leave_it_out():
    """CloudFormation adds one index per stack update: an upgrade that brings two defers one."""
    stack = Stack(App(), "Deferred")
    table = FleetTable(stack, "Store", retain=False, deferred_indexes=frozenset({schema.BY_POOL}))

    properties = Template.from_stack(stack).to_json()["Resources"]
    definition = next(r for r in properties.values() if r["Type"] == "AWS::DynamoDB::Table")["Properties"]

    assert definition["GlobalSecondaryIndexes"] == schema.global_secondary_indexes(
        frozenset({schema.BY_POOL})
    )
    assert {d["AttributeName"] for d in definition["AttributeDefinitions"]}.isdisjoint({"GSI5PK", "GSI5SK"})
    assert schema.BY_POOL not in table.index_names
    assert schema.BY_SHARD in table.index_names


def test_given_the_worker_indexes_then_they_project_exactly_the_worker_summary():
    projections = {i["IndexName"]: i["Projection"] for i in schema.global_secondary_indexes()}

    for name in (schema.BY_SHARD, schema.BY_POOL):
        assert projections[name]["ProjectionType"] == "INCLUDE"
        assert projections[name]["NonKeyAttributes"] == list(WorkerSummary.model_fields)
