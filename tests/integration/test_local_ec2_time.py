"""The local stack's EC2 in time: a machine is pending for the launch or start delay before it runs, a
stopped machine keeps its instance id and volumes, and an instance type marked out of capacity is
refused by RunInstances and StartInstances with EC2's InsufficientInstanceCapacity. A batch launch
answers as EC2 does: MaxCount machines as capacity allows, numbered, once per ClientToken."""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from fleetkeeper_local import ec2_time
from fleetkeeper_local.controlplane import ensure_worker_profile
from fleetkeeper_local.ec2_time import Delays
from fleetkeeper_local.faults import unhooked_client
from fleetkeeper_local.stack import LOCAL_REGION, LocalStack

pytestmark = pytest.mark.integration

BOOT = Delays(launch_seconds=0.6, start_seconds=0.4)


@pytest.fixture
def raw_ec2(local_stack: LocalStack, ec2: Any) -> Any:
    """One attempt per call, outside the local layers: what the emulator itself answers, status and all.
    (Asking for `ec2` resets moto after the test, capacity marks with it.)"""
    return unhooked_client(
        "ec2",
        LOCAL_REGION,
        endpoint_url=local_stack.moto_endpoint,
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
    )


def state(ec2: Any, instance_id: str) -> str:
    found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return str(found["State"]["Name"])


def launch(ec2: Any, instance_type: str = "m5.large") -> str:
    answer = ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType=instance_type,
        MinCount=1,
        MaxCount=1,
        BlockDeviceMappings=[
            {"DeviceName": "/dev/sda1", "Ebs": {"VolumeSize": 8}},
            {"DeviceName": "/dev/sdb", "Ebs": {"VolumeSize": 20}},
        ],
    )
    return str(answer["Instances"][0]["InstanceId"])


def volumes(ec2: Any, instance_id: str) -> list[str]:
    found = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return sorted(m["Ebs"]["VolumeId"] for m in found["BlockDeviceMappings"])


def wait_for(ec2: Any, instance_id: str, wanted: str, timeout: float = 5.0) -> float:
    """Seconds until the machine is in `wanted`."""
    began = time.monotonic()
    while state(ec2, instance_id) != wanted:
        assert time.monotonic() - began < timeout, f"{instance_id} never {wanted}"
        time.sleep(0.05)
    return time.monotonic() - began


def test_given_a_launch_delay_then_the_machine_is_pending_until_it_passed_and_then_runs(raw_ec2: Any) -> None:
    with ec2_time.delayed(BOOT):
        began = time.monotonic()
        instance_id = launch(raw_ec2)
        first = state(raw_ec2, instance_id)
        wait_for(raw_ec2, instance_id, "running")

    assert first == "pending"
    assert time.monotonic() - began >= BOOT.launch_seconds


def test_given_no_delay_then_a_launched_machine_runs_at_once(raw_ec2: Any) -> None:
    with ec2_time.instant():
        instance_id = launch(raw_ec2)

    assert state(raw_ec2, instance_id) == "running"


def test_given_a_stopped_machine_when_started_then_it_keeps_its_id_and_volumes_and_is_pending_first(
    raw_ec2: Any,
) -> None:
    with ec2_time.delayed(BOOT):
        instance_id = launch(raw_ec2)
        wait_for(raw_ec2, instance_id, "running")
        attached = volumes(raw_ec2, instance_id)
        raw_ec2.stop_instances(InstanceIds=[instance_id])
        stopped = (state(raw_ec2, instance_id), volumes(raw_ec2, instance_id))
        answer = raw_ec2.start_instances(InstanceIds=[instance_id])["StartingInstances"][0]
        began = time.monotonic()
        wait_for(raw_ec2, instance_id, "running")
        waited = time.monotonic() - began

    assert len(attached) == 2
    assert stopped == ("stopped", attached)
    assert (answer["PreviousState"]["Name"], answer["CurrentState"]["Name"]) == ("stopped", "pending")
    assert waited >= BOOT.start_seconds * 0.9
    assert volumes(raw_ec2, instance_id) == attached


def test_given_an_instance_type_out_of_capacity_then_launches_and_starts_of_it_are_refused_as_ec2_does(
    raw_ec2: Any,
) -> None:
    with ec2_time.instant():
        stopped = launch(raw_ec2)
    raw_ec2.stop_instances(InstanceIds=[stopped])
    ec2_time.set_capacity(raw_ec2, "m5.large", available=False)

    with pytest.raises(ClientError) as launch_refused:
        launch(raw_ec2)
    with pytest.raises(ClientError) as start_refused:
        raw_ec2.start_instances(InstanceIds=[stopped])
    other = launch(raw_ec2, "c5.xlarge")
    ec2_time.set_capacity(raw_ec2, "m5.large", available=True)
    again = launch(raw_ec2)

    launch_error = launch_refused.value.response
    assert launch_error["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert launch_error["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert launch_error["Error"]["Message"].startswith(
        "We currently do not have sufficient m5.large capacity in the Availability Zone you requested"
    )
    start_error = start_refused.value.response
    assert start_error["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert start_error["Error"]["Message"] == "Insufficient capacity."
    assert state(raw_ec2, stopped) == "stopped"
    assert state(raw_ec2, other) == "running"
    assert state(raw_ec2, again) == "running"


def batch(ec2: Any, count: int, token: str, **extra: Any) -> list[dict[str, Any]]:
    answer = ec2.run_instances(
        ImageId="ami-12c6146b",
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=count,
        ClientToken=token,
        **extra,
    )
    return list(answer["Instances"])


def test_given_a_batch_launch_then_it_makes_max_count_machines_numbered_from_0_and_a_repeat_makes_none(
    raw_ec2: Any,
) -> None:
    with ec2_time.instant():
        first = batch(raw_ec2, 4, "batch-a")
        again = batch(raw_ec2, 4, "batch-a")
    described = raw_ec2.describe_instances(InstanceIds=[m["InstanceId"] for m in first])

    assert [m["AmiLaunchIndex"] for m in first] == [0, 1, 2, 3]
    assert [m["InstanceId"] for m in again] == [m["InstanceId"] for m in first]
    assert sorted(i["AmiLaunchIndex"] for r in described["Reservations"] for i in r["Instances"]) == [
        0,
        1,
        2,
        3,
    ]
    assert len(raw_ec2.describe_instances()["Reservations"]) == 1


def test_given_capacity_for_fewer_machines_than_a_batch_asks_then_ec2_launches_what_it_can_then_refuses(
    raw_ec2: Any,
) -> None:
    ec2_time.set_capacity(raw_ec2, "m5.large", available=2)

    with ec2_time.instant():
        short = batch(raw_ec2, 5, "batch-short")
        with pytest.raises(ClientError) as refused:
            batch(raw_ec2, 5, "batch-none")

    assert [m["AmiLaunchIndex"] for m in short] == [0, 1]
    assert refused.value.response["Error"]["Code"] == "InsufficientInstanceCapacity"


def test_given_a_batch_launched_with_an_instance_profile_then_every_machine_has_it(
    raw_ec2: Any, local_stack: LocalStack
) -> None:
    profile = ensure_worker_profile()

    with ec2_time.instant():
        launched = batch(raw_ec2, 3, "batch-profile", IamInstanceProfile={"Name": profile})
    associations = raw_ec2.describe_iam_instance_profile_associations()["IamInstanceProfileAssociations"]

    assert sorted(a["InstanceId"] for a in associations) == sorted(m["InstanceId"] for m in launched)


def test_given_a_client_token_repeated_with_other_parameters_then_ec2_refuses_it_launching_nothing(
    raw_ec2: Any,
) -> None:
    with ec2_time.instant():
        first = batch(raw_ec2, 2, "batch-b")
        with pytest.raises(ClientError) as other_count:
            batch(raw_ec2, 3, "batch-b")
        with pytest.raises(ClientError) as other_tags:
            batch(
                raw_ec2,
                2,
                "batch-b",
                TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": "k", "Value": "v"}]}],
            )

    assert len(first) == 2
    assert other_count.value.response["Error"]["Code"] == "IdempotentParameterMismatch"
    assert other_tags.value.response["Error"]["Code"] == "IdempotentParameterMismatch"
    assert len(raw_ec2.describe_instances()["Reservations"]) == 1
