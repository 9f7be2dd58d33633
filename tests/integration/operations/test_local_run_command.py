"""The local stack's machines answer Run Command as fleetkeeper's workers do (fleetkeeper_local/machines.py):
the catalogue's documents print what a machine would, and a machine launched without an instance profile
is not registered with Systems Manager, so SendCommand refuses it with InvalidInstanceId."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.operations import OperationStatus
from fleetkeeper.services import operations
from fleetkeeper.services.context import Context
from tests.integration.operations.conftest import LICENSE_PARAMETER

pytestmark = pytest.mark.integration


def run_to_the_end(ctx: Context, worker: Worker, name: str, parameters: dict[str, str] | None = None) -> Any:
    """Request the operation and step it as the reconciler does, once to send, once to read the result."""
    op = operations.request(ctx, worker.id, name, parameters or {}, actor="op")
    now = utcnow()
    for step in range(2):
        operations.reconcile_operations(ctx, [], now + timedelta(seconds=5 * step), Counter())
    return ctx.store.get_operation(worker.id, op.id)


def test_given_a_registered_machine_then_collect_system_info_succeeds_with_its_type_cpu_memory_and_disk(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker(instance_type="c5.xlarge")

    done = run_to_the_end(ctx, worker, "collect-system-info")

    assert done.status is OperationStatus.SUCCESS, done.error
    info = ctx.store.get_worker(worker.id).system_info
    assert info is not None
    assert info["instance_id"] == worker.ec2_instance_id
    assert (info["instance_type"], info["cpus"], info["memory_mib"]) == ("c5.xlarge", 4, 8192)
    assert info["disk_gib"] == 8  # the emulated root volume
    assert info["uptime_seconds"] >= 0


def test_given_a_machine_launched_without_an_instance_profile_then_the_send_is_invalid_instance_id(
    ctx: Context, ec2_worker: Callable[..., Worker]
) -> None:
    worker = ec2_worker()  # no IamInstanceProfile: its agent never registers

    done = run_to_the_end(ctx, worker, "collect-system-info")

    assert done.status is OperationStatus.FAILED  # one attempt in the test catalogue
    assert done.command_id is None
    assert done.error.startswith("SendCommand failed: InvalidInstanceId: the machine is not registered")
    assert ctx.store.get_worker(worker.id).system_info is None
    listed = boto3.client("ssm", region_name=worker.region).list_commands(InstanceId=worker.ec2_instance_id)
    assert listed["Commands"] == []


def test_given_a_terminated_machine_then_the_send_is_refused_with_invalid_instance_id(
    ctx: Context, machine_worker: Callable[..., Worker], ec2: Any
) -> None:
    worker = machine_worker()
    ec2.terminate_instances(InstanceIds=[worker.ec2_instance_id])

    done = run_to_the_end(ctx, worker, "collect-system-info")

    assert done.status is OperationStatus.FAILED
    assert "InvalidInstanceId" in (done.error or "")


def test_given_the_license_parameter_is_missing_then_register_license_fails_as_the_document_would(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    boto3.client("ssm", region_name="us-east-1").delete_parameter(Name=LICENSE_PARAMETER)
    worker = machine_worker()
    parameters = {"licenseServer": "licenses.example.com"}

    op = operations.request(ctx, worker.id, "register-license", parameters, actor="op")
    now = utcnow()
    for step in range(2):
        operations.reconcile_operations(ctx, [], now + timedelta(seconds=5 * step), Counter())
    attempt = ctx.store.get_operation(worker.id, op.id)

    assert attempt.status is OperationStatus.PENDING  # the first of its two attempts failed; retried later
    assert attempt.attempts == 1
    assert "ParameterNotFound" in (attempt.output or "")
    assert LICENSE_PARAMETER in (attempt.output or "")


def test_given_the_license_parameter_then_register_license_succeeds(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()

    done = run_to_the_end(ctx, worker, "register-license", {"licenseServer": "licenses.example.com"})

    assert done.status is OperationStatus.SUCCESS, done.error
    assert LICENSE_PARAMETER in (done.output or "")


def test_given_a_sent_command_then_cancel_command_answers_as_ssm_does(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    ssm = boto3.client("ssm", region_name=worker.region)
    sent = ssm.send_command(
        InstanceIds=[worker.ec2_instance_id], DocumentName="AWS-RunPowerShellScript", Parameters={}
    )["Command"]["CommandId"]

    cancelled = ssm.cancel_command(CommandId=sent, InstanceIds=[worker.ec2_instance_id])
    with pytest.raises(ssm.exceptions.ClientError) as unknown:
        ssm.cancel_command(CommandId="00000000-0000-0000-0000-000000000000")

    assert cancelled["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert unknown.value.response["Error"]["Code"] == "InvalidCommandId"
    # The command had already ended on the emulated machine: cancelling leaves its result as it was.
    result = ssm.get_command_invocation(CommandId=sent, InstanceId=worker.ec2_instance_id)
    assert result["Status"] != "Cancelled"
