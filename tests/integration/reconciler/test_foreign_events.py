"""EC2 events about machines fleetkeeper does not know cost one read, and machines it knows are always found.

Calls are counted through a botocore hook; the outcome counts are the EMF metrics the handler prints.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.services import stats, workers
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.reconcile import LAUNCH_CLAIM_TTL, reconcile_fleet
from fleetkeeper.store import keys
from fleetkeeper.store.codec import record_attributes, serialize
from fleetkeeper.store.machine_keys import MIGRATION_SETTLE
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from fleetkeeper_local.images import publish_newer_image
from fleetkeeper_local.invocation import invoke
from tests.integration.aws_calls import aws_calls
from tests.integration.emf import metric_totals
from tests.integration.functions import discover_and_collect
from tests.integration.reconciler.support import ensure_template, instances_tagged, launch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("handler_context")]

S = WorkerStatus
REGION = "us-east-1"
EVENTS = Path(__file__).resolve().parents[3] / "events"


def running_event(instance_id: str, *, at: datetime | None = None) -> dict[str, Any]:
    event: dict[str, Any] = copy.deepcopy(json.loads((EVENTS / "ec2_state_change_running.json").read_text()))
    event["region"] = REGION
    event["detail"]["instance-id"] = instance_id
    event["resources"] = [f"arn:aws:ec2:{REGION}:123456789012:instance/{instance_id}"]
    event["time"] = (at or utcnow()).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return event


def deliver(event: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = invoke("ec2_events", event)
    return result


def backfilled(ctx: Context) -> None:
    """Two discovery passes far enough apart: the region's machines all have their key items."""
    t0 = utcnow()
    discover_and_collect(ctx, regions=[REGION], now=t0)
    discover_and_collect(ctx, regions=[REGION], now=t0 + MIGRATION_SETTLE + timedelta(minutes=1))


# A thousand events are a scale figure (`make stress`); `make test` delivers fifty.
@pytest.mark.parametrize("foreign_events", [pytest.param(1000, marks=pytest.mark.scale), 50])
def test_given_many_foreign_events_then_no_describe_no_write_and_one_read_each(
    ctx: Context, live_worker: Any, capsys: pytest.CaptureFixture[str], foreign_events: int
) -> None:
    ours = live_worker()
    backfilled(ctx)
    capsys.readouterr()

    with aws_calls() as calls:
        outcomes = {deliver(running_event(f"i-{n:017x}"))["outcome"] for n in range(foreign_events)}
    mine = deliver(running_event(ours.ec2_instance_id or ""))

    assert outcomes == {"foreign"}
    assert calls.of("ec2", "DescribeInstances") == 0
    assert calls.table_writes == 0
    # One GetItem per event, and one read of the region's migration marker per process.
    assert calls.of("dynamodb", "GetItem") == foreign_events + 1
    assert sum(calls.values()) == foreign_events + 1
    assert metric_totals(capsys.readouterr().out)["Ec2Events.events_foreign"] == foreign_events
    assert mine["worker_id"] == ours.id


def test_given_an_event_before_the_worker_recorded_its_machine_then_it_is_left_to_the_reconciler(
    store: FleetStore, ec2: Any, lab_image: str
) -> None:
    """RunInstances went through, the invocation died before the worker write: the machine has no key."""
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region=REGION, actor="test")
    died = faults.Fault("ec2", "Crashed", frozenset({"RunInstances"}), crash=True, after=True, limit=1)
    with faults.FaultPlan(faults=[died]).installed(), pytest.raises(faults.InvocationCrashed):
        reconcile_fleet(default_context())
    [machine] = instances_tagged(ec2, worker.id)
    claimed = store.get_worker(worker.id)

    with aws_calls() as calls:
        early = deliver(running_event(machine))

    # Early, not lost: nothing is written and EC2 is not asked; the worker waits for the reconciler.
    assert early["outcome"] == "foreign"
    assert (calls.table_writes, calls.of("ec2", "DescribeInstances")) == (0, 0)
    assert store.get_worker(worker.id) == claimed
    # Once the claim has expired, the reconciler adopts the machine by its worker-id tag and records it.
    reconcile_fleet(default_context(), now=utcnow() + LAUNCH_CLAIM_TTL + timedelta(minutes=1))
    adopted = store.get_worker(worker.id)
    assert (adopted.status, adopted.ec2_instance_id) == (S.PROVISIONING, machine)
    assert store.worker_id_of_machine(machine) == worker.id
    # From then on the machine's events reach its worker (this one is older than what the adoption saw).
    assert deliver(running_event(machine))["worker_id"] == worker.id


def test_given_a_launch_recorded_then_its_first_event_finds_the_worker(
    store: FleetStore, ec2: Any, lab_image: str
) -> None:
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region=REGION, actor="test")

    reconcile_fleet(default_context())
    launched = store.get_worker(worker.id)
    result = deliver(running_event(launched.ec2_instance_id or ""))

    assert launched.status == S.PROVISIONING
    assert store.worker_id_of_machine(launched.ec2_instance_id or "") == worker.id
    assert (result["outcome"], result["worker_id"]) == ("applied", worker.id)


def test_given_a_machine_imported_by_discovery_then_its_events_find_the_imported_worker(
    ctx: Context, store: FleetStore, ec2: Any, lab_image: str
) -> None:
    ensure_template(store)
    machine = launch(ec2, "w-import-me", lab_image)

    discover_and_collect(ctx, regions=[REGION])
    result = deliver(running_event(machine))

    assert store.worker_id_of_machine(machine) == "w-import-me"
    assert result["worker_id"] == "w-import-me"
    assert result["outcome"] != "foreign"


def write_as_the_previous_version(store: FleetStore, worker: Worker) -> None:
    """The worker item as the version before machine key items wrote it: no key item beside it."""
    item = {**keys.worker_key(worker.id), **keys.worker_index_attributes(worker), **record_attributes(worker)}
    store._client.put_item(TableName=store.table_name, Item=serialize(item))


def test_given_workers_written_before_machine_keys_then_events_find_them_until_and_after_the_backfill(
    ctx: Context, store: FleetStore, ec2: Any, lab_image: str
) -> None:
    ensure_template(store)
    machine = launch(ec2, "w-previous-version", lab_image)
    old = Worker(
        id="w-previous-version",
        template="lab",
        region=REGION,
        status=S.RUNNING,
        ec2_instance_id=machine,
        private_ip="10.0.0.7",
        capacity=4,
        version=3,
    )
    write_as_the_previous_version(store, old)
    assert store.worker_id_of_machine(machine) is None

    # Before discovery ran: the index still finds the worker.
    assert deliver(running_event(machine))["worker_id"] == old.id
    t0 = utcnow()
    discover_and_collect(ctx, regions=[REGION], now=t0)
    assert store.worker_id_of_machine(machine) == old.id
    assert not store.machine_keys_migrated(REGION)  # an invocation of the previous version may still run

    discover_and_collect(ctx, regions=[REGION], now=t0 + MIGRATION_SETTLE)
    assert store.machine_keys_migrated(REGION)
    with aws_calls() as calls:
        found = deliver(running_event(machine))
        foreign = deliver(running_event("i-0123456789abcdef0"))
    assert found["worker_id"] == old.id
    assert foreign["outcome"] == "foreign"
    assert calls.of("dynamodb", "Query") == 0


def test_given_a_worker_listed_twice_by_a_moving_index_then_the_backfill_writes_its_machine_key_once(
    store: FleetStore, ec2: Any, lab_image: str
) -> None:
    """Discovery reads the status index status by status: a worker that moved meanwhile comes twice."""
    machine = launch(ec2, "w-moved-while-read", lab_image)
    worker = Worker(
        id="w-moved-while-read",
        template="lab",
        region=REGION,
        status=S.RUNNING,
        ec2_instance_id=machine,
        capacity=4,
    )
    write_as_the_previous_version(store, worker)

    written = store.backfill_machine_keys(
        REGION, [worker, worker.model_copy(update={"status": S.DRAINING})], now=utcnow()
    )

    assert written == 1
    assert store.worker_id_of_machine(machine) == worker.id


def test_given_the_per_event_item_an_earlier_version_left_then_stats_no_longer_report_it(
    ctx: Context, live_worker: Any
) -> None:
    ctx.stats.record("ec2-events", counters={"events_foreign": 41})
    ctx.stats.record("reconcile", counters={"provisioned_count": 1})
    worker = live_worker()

    deliver(running_event("i-0fedcba987654321f"))
    deliver(running_event(worker.ec2_instance_id or ""))
    counters = stats.fleet_stats(ctx)["counters"]

    assert isinstance(counters, dict)
    assert set(counters) == {"reconcile"}
    assert ctx.stats.read("ec2-events").counters == {"events_foreign": 41}  # no event writes it any more


def test_given_a_launch_whose_answer_was_lost_then_it_is_repeated_with_its_token_and_image(
    store: FleetStore, ec2: Any, lab_image: str
) -> None:
    """The RunInstances answer never came (EC2 kept failing): the next attempt sends the very same
    request, although a newer image appeared meanwhile, so EC2 answers with the machine it may have
    started instead of starting a second one."""
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region=REGION, actor="test")
    unanswered = faults.Fault("ec2", "InternalError", frozenset({"RunInstances"}), status=500)
    with aws_calls() as calls:
        with faults.FaultPlan(faults=[unanswered]).installed():
            reconcile_fleet(default_context())
        claimed = store.get_worker(worker.id)
        newer = ec2.register_image(Name="lab-2099.01", RootDeviceName="/dev/sda1")["ImageId"]
        reconcile_fleet(default_context(), now=utcnow() + timedelta(minutes=2))

    first, *repeats = calls.sent("ec2", "RunInstances")
    assert claimed.launch_token == first["ClientToken"]
    assert claimed.launch_image_id == first["ImageId"] == lab_image
    assert repeats
    assert {(r["ClientToken"], r["ImageId"]) for r in repeats} == {(first["ClientToken"], lab_image)}
    assert newer != lab_image
    launched = store.get_worker(worker.id)
    assert launched.status == S.PROVISIONING
    assert (launched.launch_token, launched.launch_image_id) == (None, None)
    assert store.worker_id_of_machine(launched.ec2_instance_id or "") == worker.id


def test_given_a_launch_ec2_refused_then_the_next_one_takes_the_newest_image(
    store: FleetStore, ec2: Any, lab_image: str
) -> None:
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region=REGION, actor="test")
    refused = faults.Fault("ec2", "InvalidAMIID.NotFound", frozenset({"RunInstances"}), limit=1)
    with faults.FaultPlan(faults=[refused]).installed():
        reconcile_fleet(default_context())
    forgotten = store.get_worker(worker.id)
    # Dated a second after lab_image at least: moto dates images to the second, and a tie is no newer.
    newer, _ = publish_newer_image(ec2, "lab-*")

    with aws_calls() as calls:
        reconcile_fleet(default_context(), now=utcnow() + timedelta(minutes=2))

    assert (forgotten.status, forgotten.launch_token) == (S.PENDING, None)
    assert [r["ImageId"] for r in calls.sent("ec2", "RunInstances")] == [newer]
