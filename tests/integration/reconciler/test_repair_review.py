"""Defects found reviewing the exact unhealthy counts, the staleness rule of repair signals and the agent
read: each test shows what an operator expects."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.repair import HealthSource, HealthStatus
from fleetkeeper.services import ec2_events
from fleetkeeper.services.reconcile.replacement import replacement_id
from fleetkeeper.store import keys
from fleetkeeper.store.counters import COUNTED_AS, counter_updates
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults, health
from tests.integration.conftest import ControlPlane
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory
from tests.integration.reconciler.test_repair import IMPAIRED, pool_of, signal
from tests.integration.reconciler.test_repair_signals import discover

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def counted_as_an_earlier_release_left_it(store: FleetStore, worker: Worker) -> None:
    """Count an unhealthy worker in its status's plain cell, as every write before health was counted
    did: the table was migrated and is `done`, so no walk of the migration passes over it again."""
    marked = keys.counted_cell(worker)
    plain = marked.replace(keys.UNHEALTHY_MARK, "")
    items: list[Any] = [
        {
            "Update": {
                "TableName": store.table_name,
                "Key": {"PK": {"S": keys.worker_key(worker.id)["PK"]}, "SK": {"S": "WORKER"}},
                "UpdateExpression": "SET #ca = :plain",
                "ConditionExpression": "#ca = :marked",
                "ExpressionAttributeNames": {"#ca": COUNTED_AS},
                "ExpressionAttributeValues": {":plain": {"S": plain}, ":marked": {"S": marked}},
            }
        },
        *counter_updates(store.table_name, worker.id, {marked: -1, plain: 1}),
    ]
    store._client.transact_write_items(TransactItems=items)


def test_given_a_quarter_of_a_pool_sick_before_health_was_counted_then_the_brake_still_holds(
    make_ctx: ContextFactory, store: FleetStore, ec2: Any, drains_started: list[dict[str, Any]]
) -> None:
    first, second, *_ = pool_of(store, ec2, 8)
    t0 = utcnow()
    # Sick before the release that counts health; the brake (2 of 8 is 25 %) held them then.
    for worker in (first, second):
        counted_as_an_earlier_release_left_it(store, signal(make_ctx, worker.id, IMPAIRED, at=t0))

    report = reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=11))

    assert report.counters["repair_replacements"] == 0, report.counters
    assert report.counters["repair_held_repair_brake"] == 2, report.counters
    assert store.find_worker(replacement_id(first.id, "repair")) is None


@pytest.mark.parametrize("source", ["discovery", "health-event"])
def test_given_a_machine_signal_read_before_a_stop_and_recorded_after_it_then_it_is_stale(
    make_ctx: ContextFactory,
    store: FleetStore,
    ec2: Any,
    drains_started: list[dict[str, Any]],
    source: str,
) -> None:
    (worker, _, _) = pool_of(store, ec2, 3)
    # Discovery's sweep began (and read the machine impaired), or AWS Health spoke of a retirement...
    t0 = utcnow()
    # ...then the machine stopped, before the sweep's write (or the event's first delivery) landed.
    stopped = store.transition_worker(worker, WorkerStatus.STOPPED, cause=Cause.EC2, actor="t")
    if source == "discovery":
        signal(make_ctx, worker.id, IMPAIRED, at=t0)  # discovery records with the sweep's `now`
    else:
        ec2_events.apply_scheduled_change(
            make_ctx(),
            instance_ids=[str(worker.ec2_instance_id)],
            region="us-east-1",
            code="instance-retirement",
            not_before=t0 + timedelta(days=3),
            closed=False,
            event_id="arn:aws:health:us-east-1::event/EC2/AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED/e-1",
            at=t0,
        )
    store.transition_worker(store.get_worker(stopped.id), WorkerStatus.RUNNING, cause=Cause.EC2, actor="t")

    report = reconcile_fleet(make_ctx(), now=t0 + timedelta(minutes=11))

    health = store.get_worker(worker.id).health
    standing = health.standing() if health is not None else {}
    assert not set(standing) & {HealthSource.STATUS_CHECK, HealthSource.SCHEDULED_EVENT}, standing
    assert report.counters["repair_replacements"] == 0, report.counters


def test_given_one_throttled_agent_read_then_discovery_still_records_the_lost_agent(
    control_plane: ControlPlane, live_worker: LiveWorkerFactory, ec2: Any, store: FleetStore
) -> None:
    lost = live_worker(pool="labs", registered=True)
    assert lost.ec2_instance_id is not None
    health.disconnect(ec2, lost.ec2_instance_id)
    # One throttle among the sweep's calls (200 of them at 10,000 workers); the SSM client makes one
    # attempt per call (cloud/clients.CALLER_RETRIED), so the adapter is the one to retry it.
    throttled = faults.Fault(
        "ssm", "ThrottlingException", operations=frozenset({"DescribeInstanceInformation"}), limit=1
    )

    with faults.FaultPlan(faults=[throttled]).installed():
        discover()

    assert throttled.injected == 1
    sick = store.get_worker(lost.id).health
    assert sick is not None
    assert (sick.status, sick.source) == (HealthStatus.UNHEALTHY, HealthSource.CONNECTION_LOST)
