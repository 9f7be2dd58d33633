"""The IAM recorder on the local stack: a request the function's role does not allow fails as on AWS, and
a request no decision is reached for fails the run."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.cloud.clients import client
from fleetkeeper.cloud.ec2 import Ec2Gateway
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.services.context import default_context
from fleetkeeper.services.reconcile.images import NewestImages
from fleetkeeper_local.iam import acting_as
from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.iam.attribution import UNATTRIBUTED
from fleetkeeper_local.iam.evaluator import Evaluator
from fleetkeeper_local.iam.policies import CANONICAL, load_model
from fleetkeeper_local.iam.record import ERROR, MISSING, Summary
from fleetkeeper_local.iam.recorder import Recorder
from fleetkeeper_local.images import stock_image
from fleetkeeper_local.stack import LocalStack

pytestmark = pytest.mark.integration


@pytest.fixture
def record(local_stack: LocalStack) -> Iterator[Summary]:
    """A recorder of this test's own, enforcing; the session's recorder looks away meanwhile, so the
    denials provoked here are not the run's."""
    summary = Summary()
    with iam_session.paused(), Recorder(load_model(), summary=summary).installed():
        yield summary


def machine(ec2: Any, *, managed: bool) -> str:
    image = stock_image(ec2)
    tags = (
        [{"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE}]
        if managed
        else [{"Key": "team", "Value": "data"}]
    )
    launched = ec2.run_instances(
        ImageId=image,
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
    )
    return str(launched["Instances"][0]["InstanceId"])


def state(ec2: Any, instance_id: str) -> str:
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    return str(reservations[0]["Instances"][0]["State"]["Name"])


def test_given_a_machine_without_the_managed_tag_when_a_drain_stops_it_then_ec2_refuses_as_on_aws(
    record: Summary, ec2: Any
) -> None:
    foreign = machine(ec2, managed=False)

    with acting_as("drain-tasks"), pytest.raises(ClientError) as refused:
        Ec2Gateway(client("ec2")).stop(foreign)

    error = refused.value.response
    assert error["Error"]["Code"] == "UnauthorizedOperation"
    assert error["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert "is not authorized to perform: ec2:StopInstances" in error["Error"]["Message"]
    assert state(ec2, foreign) == "running"  # the request never reached EC2
    assert (record.requests, record.denied_requests) == (1, 1)
    (denial,) = record.denials.values()
    assert (denial["function"], denial["action"]) == ("drain-tasks", "ec2:StopInstances")
    assert denial["resource"] == f"arn:aws:ec2:{CANONICAL.region}:{CANONICAL.account}:instance/{foreign}"
    assert denial["path"] == "cloud/ec2.py:Ec2Gateway.stop"
    # The denial names the test it happened in, so a denial in a whole run is found from its report.
    assert denial["during"].startswith(
        "tests/integration/test_iam_recorder.py::test_given_a_machine_without_the_managed_tag"
    )
    assert "first during tests/integration/test_iam_recorder.py::" in "\n".join(record.report())


def test_given_fleetkeepers_machine_when_a_drain_stops_it_then_it_stops_and_the_grant_is_recorded(
    record: Summary, ec2: Any
) -> None:
    managed = machine(ec2, managed=True)

    with acting_as("drain-tasks"):
        Ec2Gateway(client("ec2")).stop(managed)

    assert state(ec2, managed) in {"stopping", "stopped"}
    assert (record.requests, record.denied_requests) == (1, 0)
    assert [key for key in record.usage if key.startswith("drain-tasks|ec2:StopInstances|")]


def test_given_another_table_when_the_api_reads_it_then_dynamodb_refuses(
    record: Summary, table_name: str
) -> None:
    dynamodb = client("dynamodb")
    key = {"PK": {"S": "WORKER#w-1"}, "SK": {"S": "WORKER"}}

    with acting_as("api"):
        dynamodb.get_item(TableName=table_name, Key=key)
        with pytest.raises(ClientError) as refused:
            dynamodb.get_item(TableName="someone-elses-table", Key=key)

    assert refused.value.response["Error"]["Code"] == "AccessDeniedException"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert (record.requests, record.denied_requests) == (2, 1)
    (denial,) = record.denials.values()
    assert denial["resource"].endswith(":table/someone-elses-table")


def test_given_a_test_calling_fleetkeepers_shared_code_then_its_requests_are_set_up_and_not_evaluated(
    record: Summary, ec2: Any
) -> None:
    machine(ec2, managed=False)
    Ec2Gateway(client("ec2")).stop(machine(ec2, managed=False))

    # The stop, through fleetkeeper's adapter (the test's own client was made before this recorder).
    assert (record.setup, record.requests, record.denied_requests, record.undecided) == (1, 0, 0, {})


def test_given_a_direct_call_of_a_functions_own_code_then_its_requests_are_that_functions(
    record: Summary, table_name: str
) -> None:
    # No acting_as: services/reconcile/ is the reconcile function's own code (its handler imports it).
    NewestImages(default_context()).newest("lab-*", CANONICAL.region)

    assert dict(record.by_function) == {"reconcile": 1}
    assert [key for key in record.usage if key.startswith("reconcile|ec2:DescribeImages|")]
    assert (record.denied_requests, record.undecided) == (0, {})


@pytest.mark.skipif(iam_session.mode() == "off", reason="the run's recorder is off")
def test_given_the_runs_recorder_when_a_test_calls_a_functions_own_code_then_the_run_evaluates_it(
    table_name: str,
) -> None:
    before = iam_session.RUN.by_function["reconcile"]

    NewestImages(default_context()).newest("lab-*", CANONICAL.region)

    assert iam_session.RUN.by_function["reconcile"] == before + 1


def test_given_a_function_using_a_thread_pool_then_its_threads_requests_are_its_own(
    record: Summary, ec2: Any
) -> None:
    ids = [machine(ec2, managed=True) for _ in range(3)]
    gateway = Ec2Gateway(client("ec2"))

    with acting_as("reconcile"):
        with ContextThreadPool(max_workers=3) as pool:
            list(pool.map(lambda one: gateway.describe([one]), ids))
        attributed = record.by_function["reconcile"]
        # A plain pool runs fleetkeeper's code without the invocation's context: whose requests they
        # are cannot be told, and the run fails on them.
        with ThreadPoolExecutor(max_workers=3) as plain:
            list(plain.map(gateway.describe, [[one] for one in ids]))

    assert attributed == 3
    assert record.by_function["reconcile"] == 3
    (lost,) = record.undecided.values()
    assert (lost["kind"], lost["function"], lost["operation"], lost["count"]) == (
        UNATTRIBUTED,
        UNATTRIBUTED,
        "ec2:DescribeInstances",
        3,
    )
    assert lost["path"] == "cloud/ec2.py:Ec2Gateway._describe"
    assert record.failed
    assert "  UNATTRIBUTED unattributed: ec2:DescribeInstances (from cloud/ec2.py" in "\n".join(
        record.report()
    )


# ---- requests no decision is reached for: the request goes on, the run fails naming it --------------


def test_given_a_machine_the_emulator_does_not_know_when_a_drain_stops_it_then_the_run_fails_naming_it(
    record: Summary,
) -> None:
    unknown = "i-0123456789abcdef0"

    with acting_as("drain-tasks"), pytest.raises(ClientError) as refused:
        Ec2Gateway(client("ec2")).stop(unknown)

    # The tags its grant is conditioned on cannot be read: the evaluator cannot decide it.
    assert refused.value.response["Error"]["Code"] == "InvalidInstanceID.NotFound"
    assert (record.requests, record.denied_requests) == (0, 0)
    (missing,) = record.undecided.values()
    assert (missing["kind"], missing["function"], missing["operation"]) == (
        MISSING,
        "drain-tasks",
        "ec2:StopInstances",
    )
    assert f"instance {unknown} in {CANONICAL.region}" in missing["error"]
    assert missing["path"] == "cloud/ec2.py:Ec2Gateway.stop"
    assert missing["during"].startswith("tests/integration/test_iam_recorder.py::test_given_a_machine_the")
    assert record.failed
    assert "  MISSING RESOURCE drain-tasks: ec2:StopInstances" in "\n".join(record.report())


# Answers every evaluation with the error the evaluator process gives when it cannot evaluate.
_FAILING_EVALUATOR = """
import { createInterface } from 'node:readline'
for await (const line of createInterface({ input: process.stdin })) {
  const message = JSON.parse(line)
  if (message.op === 'evaluate') {
    const answer = { seq: message.seq, result: 'Error', error: 'cannot evaluate' }
    process.stdout.write(JSON.stringify(answer) + '\\n')
  }
}
"""


def test_given_an_evaluator_that_fails_when_a_drain_stops_a_machine_then_it_stops_and_the_run_fails(
    local_stack: LocalStack, ec2: Any, tmp_path: Path
) -> None:
    script = tmp_path / "simulate.mjs"
    script.write_text(_FAILING_EVALUATOR, encoding="utf-8")
    managed = machine(ec2, managed=True)
    summary = Summary()
    recorder = Recorder(load_model(), summary=summary, evaluator=Evaluator(script))

    with iam_session.paused(), recorder.installed(), acting_as("drain-tasks"):
        # The code under test may swallow whatever its call raises: the recorder raises nothing into it.
        Ec2Gateway(client("ec2")).stop(managed)

    assert state(ec2, managed) in {"stopping", "stopped"}
    (failed,) = summary.undecided.values()
    assert (failed["kind"], failed["function"], failed["operation"]) == (
        ERROR,
        "drain-tasks",
        "ec2:StopInstances",
    )
    assert failed["error"].startswith("EvaluatorError: ec2:StopInstances on arn:aws:ec2:")
    assert failed["error"].endswith("cannot evaluate")
    assert (summary.requests, summary.denied_requests) == (0, 0)
    assert summary.failed
    assert "  EVALUATOR ERROR drain-tasks: ec2:StopInstances" in "\n".join(summary.report())
