"""The fault layer itself: injected errors reach the real clients as AWS would raise them."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.services import catalog, workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults

pytestmark = pytest.mark.integration


def test_given_a_conflict_fault_when_a_transaction_runs_then_dynamodb_cancels_it_as_aws_would(
    table_name: str,
) -> None:
    plan = faults.FaultPlan(seed=1, faults=[faults.dynamodb_conflicts(1.0, limit=1)])
    with plan.installed():
        ddb = client("dynamodb")
        with pytest.raises(ClientError) as raised:
            ddb.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": table_name, "Item": {"PK": {"S": "x"}, "SK": {"S": "y"}}}}
                ]
            )
        error = raised.value.response
        assert error["Error"]["Code"] == "TransactionCanceledException"
        assert error["CancellationReasons"][0]["Code"] == "TransactionConflict"
        # The limit is spent: the next call goes through to DynamoDB Local.
        ddb.transact_write_items(
            TransactItems=[{"Put": {"TableName": table_name, "Item": {"PK": {"S": "x"}, "SK": {"S": "y"}}}}]
        )
    assert plan.summary() == {"dynamodb:TransactionCanceledException/TransactionConflict": 1}
    assert ddb.get_item(TableName=table_name, Key={"PK": {"S": "x"}, "SK": {"S": "y"}})["Item"]


def test_given_an_after_call_fault_when_a_write_runs_then_it_lands_but_the_caller_sees_an_error(
    table_name: str,
) -> None:
    plan = faults.FaultPlan(
        faults=[
            faults.Fault("dynamodb", "InternalServerError", frozenset({"PutItem"}), status=500, after=True)
        ]
    )
    with plan.installed():
        ddb = client("dynamodb")
        with pytest.raises(ClientError):
            ddb.put_item(TableName=table_name, Item={"PK": {"S": "a"}, "SK": {"S": "b"}})
    assert client("dynamodb").get_item(TableName=table_name, Key={"PK": {"S": "a"}, "SK": {"S": "b"}})["Item"]


def test_given_an_index_lag_when_a_worker_was_just_written_then_index_queries_miss_it_for_a_while(
    store: FleetStore, table_name: str
) -> None:
    plan = faults.FaultPlan(index_lag_seconds=0.5)
    with plan.installed():
        lagging = FleetStore(client("dynamodb"), table_name)
        catalog.put_template(
            lagging,
            WorkerTemplate(name="lab", instance_type="m5.large", ami_name_filter="lab-*", capacity=2),
            actor="t",
        )
        created = workers.create_worker(lagging, template="lab", region="us-east-1", pool=None, actor="t")
        assert [w.id for w in lagging.iter_workers_by_status([WorkerStatus.PENDING])] == []
        assert lagging.get_worker(created.id).id == created.id  # the base table is current
        time.sleep(0.6)
        assert [w.id for w in lagging.iter_workers_by_status([WorkerStatus.PENDING])] == [created.id]
    assert plan.hidden_by_lag >= 1
