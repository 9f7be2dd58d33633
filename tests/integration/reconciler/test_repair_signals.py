"""The signals that make a worker unhealthy, each through the function that receives it on AWS: an AWS
Health scheduled change through the EC2 events handler (delivered by the local event pump from a
simulated retirement), discovery's sweep of DescribeInstanceStatus (the emulator answers with the
simulated events and checks), and its read of the SSM agents of the workers that use operations
(DescribeInstanceInformation, which the local stack answers from the simulated agents)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.cloud import ssm
from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.repair import HealthSource, HealthStatus
from fleetkeeper.services.reconcile.replacement import replacement_id
from fleetkeeper_local import health
from fleetkeeper_local.controlplane import ensure_worker_profile
from fleetkeeper_local.event_shapes import health_event
from fleetkeeper_local.invocation import invoke
from fleetkeeper_local.scheduler import Ec2EventPump
from fleetkeeper_local.stack import project_root
from tests.integration.aws_calls import aws_calls
from tests.integration.conftest import ControlPlane
from tests.integration.functions import discover_and_collect, reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("handler_context")]


def test_given_a_health_scheduled_change_then_the_worker_is_unhealthy_until_it_closes(
    live_worker: LiveWorkerFactory, store: Any
) -> None:
    worker = live_worker(pool="labs")
    assert worker.ec2_instance_id is not None
    not_before = (utcnow() + timedelta(days=3)).replace(microsecond=0)
    event = health_event(
        worker.ec2_instance_id,
        code="instance-retirement",
        not_before=not_before,
        event_id="e-1",
        region="us-east-1",
    )

    answer = invoke("ec2_events", event)
    again = invoke("ec2_events", event)

    assert answer["outcome"] == "applied", answer
    recorded = store.get_worker(worker.id)
    assert recorded.health is not None
    assert (recorded.health.status, recorded.health.source) == (
        HealthStatus.UNHEALTHY,
        HealthSource.SCHEDULED_EVENT,
    )
    assert recorded.health.event is not None
    assert recorded.health.event.not_before == not_before
    # A redelivery changes nothing: no second write.
    assert again["outcome"] == "applied"
    assert store.get_worker(worker.id).version == recorded.version

    closed = health_event(
        worker.ec2_instance_id,
        code="instance-retirement",
        not_before=not_before,
        event_id="e-1",
        closed=True,
        region="us-east-1",
    )
    invoke("ec2_events", closed)

    healed = store.get_worker(worker.id).health
    assert healed is not None
    assert healed.status == HealthStatus.HEALTHY


def test_given_a_simulated_retirement_then_the_pump_delivers_the_health_event_once(
    live_worker: LiveWorkerFactory, ec2: Any, store: Any
) -> None:
    worker = live_worker(pool="labs")
    assert worker.ec2_instance_id is not None
    delivered: list[dict[str, Any]] = []
    pump = Ec2EventPump(ec2, deliver=delivered.append)
    pump.poll_once()  # baseline

    health.retire(ec2, worker.ec2_instance_id, within=timedelta(hours=2))
    first = pump.poll_once()
    second = pump.poll_once()

    assert [e["detail-type"] for e in first] == ["AWS Health Event"]
    assert second == []
    assert first[0]["detail"]["affectedEntities"] == [{"entityValue": worker.ec2_instance_id}]


def test_given_simulated_signals_then_discovery_records_them_and_their_end(
    live_worker: LiveWorkerFactory, make_ctx: ContextFactory, ec2: Any, store: Any
) -> None:
    impaired, retiring, well = (live_worker(pool="labs") for _ in range(3))
    assert impaired.ec2_instance_id is not None
    assert retiring.ec2_instance_id is not None
    health.impair(ec2, impaired.ec2_instance_id)
    health.retire(ec2, retiring.ec2_instance_id, within=timedelta(hours=2))

    report = discover_and_collect(make_ctx())

    assert report.counters["health_changed"] == 2, report.counters
    sick = store.get_worker(impaired.id).health
    assert sick is not None
    assert (sick.status, sick.source) == (HealthStatus.UNHEALTHY, HealthSource.STATUS_CHECK)
    assert sick.reason == "system status ok, instance status impaired"
    event = store.get_worker(retiring.id).health
    assert event is not None
    assert event.source == HealthSource.SCHEDULED_EVENT
    assert event.event is not None
    assert event.event.code == "instance-retirement"
    assert store.get_worker(well.id).health is None
    # Nothing changed: nothing written.
    assert discover_and_collect(make_ctx()).counters["health_changed"] == 0

    health.recover(ec2, impaired.ec2_instance_id)
    health.recover(ec2, retiring.ec2_instance_id)
    ended = discover_and_collect(make_ctx())

    assert ended.counters["health_changed"] == 2
    for worker in (impaired, retiring):
        found = store.get_worker(worker.id).health
        assert found is not None
        assert found.status == HealthStatus.HEALTHY


def discover() -> dict[str, Any]:
    """One run of the discover function, as its schedule invokes it."""
    event = json.loads((project_root() / "events" / "scheduler_discover.json").read_text())
    answer: dict[str, Any] = invoke("discover", event)
    return answer


def test_given_a_worker_whose_ssm_agent_lost_its_connection_then_it_is_repaired_after_its_toleration(
    control_plane: ControlPlane,
    live_worker: LiveWorkerFactory,
    make_ctx: ContextFactory,
    ec2: Any,
    store: Any,
) -> None:
    # The stage collects system information from every worker: each one's agent must answer.
    lost, well = (live_worker(pool="labs", registered=True) for _ in range(2))
    assert lost.ec2_instance_id is not None
    health.disconnect(ec2, lost.ec2_instance_id)

    discover()

    sick = store.get_worker(lost.id).health
    assert sick is not None
    assert (sick.status, sick.source) == (HealthStatus.UNHEALTHY, HealthSource.CONNECTION_LOST)
    assert sick.reason is not None
    assert sick.reason.startswith("SSM agent ConnectionLost, last ping ")
    assert store.get_worker(well.id).health is None

    early = reconcile_fleet(make_ctx(), now=sick.since + timedelta(minutes=14))
    due = reconcile_fleet(make_ctx(), now=sick.since + timedelta(minutes=15))

    assert early.counters["repair_replacements"] == 0, early.counters
    assert due.counters["repair_replacements"] == 1, due.counters
    assert store.get_worker(replacement_id(lost.id, "repair")).pool == "labs"
    status, body = control_plane.api("GET", f"/api/v1/workers/{lost.id}")
    assert status == 200
    assert [(s["status"], s["source"]) for s in body["health"]["signals"]] == [
        ("unhealthy", "connection_lost")
    ]
    assert body["health"]["repair"]["step"] == "replacing"

    health.recover(ec2, lost.ec2_instance_id)
    discover()

    healed = store.get_worker(lost.id)
    assert healed.health is not None
    assert (healed.health.status, healed.health.signals, healed.owner) == (HealthStatus.HEALTHY, {}, None)


def test_given_workers_that_use_no_operations_then_their_agents_are_not_read(
    live_worker: LiveWorkerFactory, ec2: Any, store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SYSTEM_INFO_INTERVAL_SECONDS", "0")
    worker = live_worker(pool="labs", registered=True)
    assert worker.ec2_instance_id is not None
    health.disconnect(ec2, worker.ec2_instance_id)

    with aws_calls() as calls:
        discover()

    assert calls.of("ssm", "DescribeInstanceInformation") == 0
    assert calls.of("ec2", "DescribeInstanceStatus") == 1
    assert store.get_worker(worker.id).health is None


def test_given_sixty_registered_machines_then_their_agents_are_read_in_two_calls(
    ec2: Any, lab_image: str
) -> None:
    launched = ec2.run_instances(ImageId=lab_image, InstanceType="m5.large", MinCount=60, MaxCount=60)
    ids = [i["InstanceId"] for i in launched["Instances"]]
    # One by one: moto gives a profile named at launch to the first machine of a launch only.
    for instance_id in ids:
        ec2.associate_iam_instance_profile(
            IamInstanceProfile={"Name": ensure_worker_profile()}, InstanceId=instance_id
        )
    health.disconnect(ec2, ids[0])
    unregistered = ec2.run_instances(ImageId=lab_image, InstanceType="m5.large", MinCount=1, MaxCount=1)
    stranger = unregistered["Instances"][0]["InstanceId"]

    with aws_calls() as calls:
        found = ssm.agent_readings(client("ssm", "us-east-1"), [*ids, stranger])

    # 61 ids, 50 a call: two calls, the unregistered machine's among them.
    assert calls.of("ssm", "DescribeInstanceInformation") == 2
    # Systems Manager knows only the machines whose agent registered through an instance profile.
    assert set(found) == set(ids)
    assert found[ids[0]].ping_status == "ConnectionLost"
    assert {found[i].ping_status for i in ids[1:]} == {"Online"}


def registered_machines(ec2: Any, lab_image: str, count: int) -> list[str]:
    """Machines launched and registered with the emulated Systems Manager through the stage's profile."""
    launched = ec2.run_instances(ImageId=lab_image, InstanceType="m5.large", MinCount=count, MaxCount=count)
    ids = [str(i["InstanceId"]) for i in launched["Instances"]]
    # One by one: moto gives a profile named at launch to the first machine of a launch only.
    for instance_id in ids:
        ec2.associate_iam_instance_profile(
            IamInstanceProfile={"Name": ensure_worker_profile()}, InstanceId=instance_id
        )
    return ids


def listed(ssm_client: Any, **request: Any) -> list[str]:
    """Every instance id DescribeInstanceInformation lists for the request, page by page."""
    found: list[str] = []
    while True:
        page = ssm_client.describe_instance_information(MaxResults=5, **request)
        found += [info["InstanceId"] for info in page["InstanceInformationList"]]
        if not page.get("NextToken"):
            return found
        request["NextToken"] = page["NextToken"]


def test_given_the_emulated_agents_then_describe_instance_information_honours_its_filters(
    ec2: Any, lab_image: str
) -> None:
    online, *lost, stopped, gone = registered_machines(ec2, lab_image, 10)
    for instance_id in lost:
        health.disconnect(ec2, instance_id)
    ec2.stop_instances(InstanceIds=[stopped])
    ec2.terminate_instances(InstanceIds=[gone])
    ssm_client = client("ssm", "us-east-1")
    by_ping = [{"Key": "PingStatus", "Values": ["ConnectionLost"]}]

    # Paged five a call; a stopped machine is not listed at all, as on AWS.
    assert sorted(listed(ssm_client, Filters=by_ping)) == sorted(lost)
    assert listed(
        ssm_client,
        Filters=[
            {"Key": "InstanceIds", "Values": [online, lost[0]]},
            {"Key": "PingStatus", "Values": ["Online"]},
        ],
    ) == [online]
    assert listed(ssm_client, Filters=[{"Key": "InstanceIds", "Values": [stopped]}]) == []
    # One id AWS will not take refuses the whole call.
    with pytest.raises(ClientError) as refused:
        listed(ssm_client, Filters=[{"Key": "InstanceIds", "Values": [online, gone]}])
    assert refused.value.response["Error"]["Code"] == "InvalidInstanceId"
    # A key the emulator does not honour is refused, never ignored.
    with pytest.raises(ClientError) as unknown:
        listed(ssm_client, Filters=[{"Key": "tag:Purpose", "Values": ["lab"]}])
    assert unknown.value.response["Error"]["Code"] == "ValidationException"


def test_given_one_machine_shut_down_among_those_asked_by_id_then_the_others_are_still_read(
    ec2: Any, lab_image: str
) -> None:
    *ids, gone = registered_machines(ec2, lab_image, 4)
    health.disconnect(ec2, ids[0])
    ec2.terminate_instances(InstanceIds=[gone])

    with aws_calls() as calls:
        found = ssm.agent_readings(client("ssm", "us-east-1"), [*ids, gone])

    assert {i: r.ping_status for i, r in found.items()} == {
        ids[0]: "ConnectionLost",
        ids[1]: "Online",
        ids[2]: "Online",
    }
    # The refused call, then one per id.
    assert calls.of("ssm", "DescribeInstanceInformation") == 1 + 4


def test_given_lost_agents_then_a_sweep_lists_them_once_and_reads_by_id_only_those_standing(
    control_plane: ControlPlane, live_worker: LiveWorkerFactory, ec2: Any, store: Any
) -> None:
    # The stage collects system information from every worker: each one's agent must answer.
    fleet = [live_worker(pool="labs", registered=True) for _ in range(6)]
    lost = fleet[0]
    assert lost.ec2_instance_id is not None
    health.disconnect(ec2, lost.ec2_instance_id)

    with aws_calls() as first:
        discover()
    with aws_calls() as steady:
        discover()
    health.recover(ec2, lost.ec2_instance_id)
    with aws_calls() as healed:
        discover()

    # One read of the region's lost agents, whatever the fleet's size.
    assert first.of("ssm", "DescribeInstanceInformation") == 1
    assert [call.get("Filters") for call in first.sent("ssm", "DescribeInstanceInformation")] == [
        [{"Key": "PingStatus", "Values": ["ConnectionLost"]}]
    ]
    # Then the lost one's agent by id too, to see it answer again.
    assert [call.get("Filters") for call in steady.sent("ssm", "DescribeInstanceInformation")] == [
        [{"Key": "PingStatus", "Values": ["ConnectionLost"]}],
        [{"Key": "InstanceIds", "Values": [lost.ec2_instance_id]}],
    ]
    assert healed.of("ssm", "DescribeInstanceInformation") == 2
    after = store.get_worker(lost.id).health
    assert after is not None
    assert (after.status, after.signals) == (HealthStatus.HEALTHY, {})
    assert all(store.get_worker(w.id).health is None for w in fleet[1:])
