"""The fault layer itself: injected errors reach the real clients as AWS would raise them."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.services import catalog, workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.conftest import WorkerFactory

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


# Long enough for a loaded machine's queries to run well inside it.
OLD_IMAGE_LAG = 5.0


@pytest.mark.parametrize("old_images", [True, False])
def test_given_an_index_lag_when_a_worker_just_left_running_then_the_indexes_show_it_as_it_was_for_a_while(
    table_name: str, running_worker: WorkerFactory, old_images: bool
) -> None:
    worker = running_worker(pool="labs")
    plan = faults.FaultPlan(index_lag_seconds=OLD_IMAGE_LAG, index_old_images=old_images)
    with plan.installed():
        lagging = FleetStore(client("dynamodb"), table_name)
        lagging.transition_worker(
            lagging.get_worker(worker.id), WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="t"
        )
        written = time.monotonic()

        by_pool = [(w.id, w.status) for w in lagging.workers_in_pool("labs")]
        candidates = [w.id for w in lagging.placement_candidates(template=None, pool="labs")]
        running = [w.id for w in lagging.worker_summaries([WorkerStatus.RUNNING])]
        draining = [w.id for w in lagging.worker_summaries([WorkerStatus.DRAINING])]
        assert time.monotonic() - written < OLD_IMAGE_LAG, "the reads took longer than the lag"
        assert lagging.get_worker(worker.id).status is WorkerStatus.DRAINING  # the base table is current
        if old_images:
            # by_pool still projects RUNNING, by_shard still has it in the RUNNING partition.
            assert (by_pool, candidates, running, draining) == (
                [(worker.id, WorkerStatus.RUNNING)],
                [worker.id],
                [worker.id],
                [],
            )
            assert plan.old_images_by_lag == 3
        else:
            assert (by_pool, candidates, running, draining) == ([], [], [], [])
            assert plan.old_images_by_lag == 0
        assert plan.hidden_by_lag >= 1

        time.sleep(max(OLD_IMAGE_LAG - (time.monotonic() - written), 0) + 0.1)
        assert [(w.id, w.status) for w in lagging.workers_in_pool("labs")] == [
            (worker.id, WorkerStatus.DRAINING)
        ]
        assert [w.id for w in lagging.worker_summaries([WorkerStatus.RUNNING])] == []
        assert [w.id for w in lagging.worker_summaries([WorkerStatus.DRAINING])] == [worker.id]


def test_given_a_lost_call_fault_then_the_caller_sees_success_but_nothing_reaches_aws(
    table_name: str,
) -> None:
    plan = faults.FaultPlan(
        faults=[faults.Fault("dynamodb", "Lost", frozenset({"PutItem"}), lost=True, limit=1)]
    )
    with plan.installed():
        ddb = client("dynamodb")
        ddb.put_item(TableName=table_name, Item={"PK": {"S": "lost"}, "SK": {"S": "x"}})
        ddb.put_item(TableName=table_name, Item={"PK": {"S": "kept"}, "SK": {"S": "x"}})
    ddb = client("dynamodb")
    assert "Item" not in ddb.get_item(TableName=table_name, Key={"PK": {"S": "lost"}, "SK": {"S": "x"}})
    assert "Item" in ddb.get_item(TableName=table_name, Key={"PK": {"S": "kept"}, "SK": {"S": "x"}})
    assert plan.summary() == {"dynamodb:Lost": 1}


def test_given_a_crash_after_two_worker_writes_then_the_second_lands_and_nothing_runs_after_it(
    table_name: str,
) -> None:
    plan = faults.FaultPlan(faults=[faults.crash_after_writes(2)])
    with plan.installed():
        ddb = client("dynamodb")
        ddb.put_item(TableName=table_name, Item={"PK": {"S": "POOL#p"}, "SK": {"S": "POOL"}})  # not a worker
        ddb.put_item(TableName=table_name, Item={"PK": {"S": "WORKER#1"}, "SK": {"S": "WORKER"}})
        with pytest.raises(faults.InvocationCrashed):
            ddb.put_item(TableName=table_name, Item={"PK": {"S": "WORKER#2"}, "SK": {"S": "WORKER"}})
        # A dead invocation makes no further call, not even a read or a clean-up.
        with pytest.raises(faults.InvocationCrashed):
            ddb.put_item(TableName=table_name, Item={"PK": {"S": "WORKER#3"}, "SK": {"S": "WORKER"}})
        plan.revive()
        ddb.put_item(TableName=table_name, Item={"PK": {"S": "WORKER#4"}, "SK": {"S": "WORKER"}})
    ddb = client("dynamodb")
    landed = {
        n
        for n in "1234"
        if "Item"
        in ddb.get_item(TableName=table_name, Key={"PK": {"S": f"WORKER#{n}"}, "SK": {"S": "WORKER"}})
    }
    assert landed == {"1", "2", "4"}
    assert plan.summary() == {"dynamodb:Crashed": 1}


def test_given_a_seed_then_the_event_stream_faults_are_reproducible_and_lose_nothing() -> None:
    batches = [
        [
            {"id": f"{b}-{n}", "detail": {"instance-id": f"i-{b}{n:016x}", "state": "running"}}
            for n in range(5)
        ]
        for b in range(6)
    ]

    def run(seed: int) -> tuple[list[str], dict[str, int]]:
        stream = faults.EventStreamFaults(
            seed=seed, duplicate=0.3, reorder=0.5, late=0.3, malformed=0.3, late_batches=2
        )
        out = [e for batch in batches for e in stream.mutate(batch)] + stream.flush()
        return [str(e.get("id")) for e in out], dict(stream.counts)

    first, counts = run(7)
    assert run(7) == (first, counts)
    assert run(8) != (first, counts)
    # Every original arrives at least once; duplicates and malformed copies come on top.
    assert {f"{b}-{n}" for b in range(6) for n in range(5)} <= set(first)
    assert len(first) == 30 + counts["duplicated"] + counts["malformed"]
    assert counts["late"] > 0
    assert counts["reordered"] > 0
