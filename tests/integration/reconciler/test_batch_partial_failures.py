"""What one worker's trouble does to the others of its batched EC2 call (docs/capacity.md, "One launch
call per batch"): a machine EC2 refuses to start holds back only its own worker, discovery never
terminates a batch's machine that its worker pairs while discovery reads, and a claim from before batches
is adopted by its worker-id tag instead of repeated."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.tags import BATCH_TAG, MANAGED_BY_TAG, MANAGED_BY_VALUE, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper.services import catalog, workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.iam.policies import load_model
from fleetkeeper_local.iam.record import Summary
from fleetkeeper_local.iam.recorder import Recorder
from tests.integration.aws_calls import aws_calls
from tests.integration.functions import discover_and_collect, reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory
from tests.integration.reconciler.support import ec2_state, ensure_template, stopped_warm
from tests.integration.reconciler.test_launch_batches import policy_pool

pytestmark = pytest.mark.integration

S = WorkerStatus


def test_given_one_warm_worker_whose_machine_iam_will_not_start_then_the_others_of_its_type_still_start(
    store: FleetStore,
    make_ctx: ContextFactory,
    live_worker: LiveWorkerFactory,
    ec2: Any,
) -> None:
    warm = stopped_warm(store, ec2, [live_worker(pool="labs") for _ in range(4)])
    # One machine lost its managed tag (an import whose tagging failed, a hand edit): IAM denies
    # starting it, and EC2 refuses a StartInstances naming it as a whole (UnauthorizedOperation).
    bad, good = warm[0], warm[1:]
    ec2.delete_tags(Resources=[bad.ec2_instance_id], Tags=[{"Key": MANAGED_BY_TAG}])
    policy_pool(store, 4)
    now = utcnow()

    reconcile_fleet(make_ctx(), now=now)  # asks the four to start
    # A recorder of the test's own enforces IAM on the starts, so the denials provoked here are not the
    # run's.
    with iam_session.paused(), Recorder(load_model(), summary=Summary()).installed():
        for minute in range(4):
            reconcile_fleet(make_ctx(), now=now + timedelta(minutes=minute, seconds=1))

    assert [w.status for w in store.get_workers([w.id for w in good])] == [S.RUNNING] * 3
    assert store.get_worker(bad.id).status != S.RUNNING


def pair_first(table_name: str, worker: Worker, machine: str) -> Callable[..., None]:
    """A botocore hook that, the first time discovery reads the region's PENDING workers, pairs the
    worker with its batch's machine first, as the reconciler adopting it at that moment would."""
    other = FleetStore(faults.unhooked_client("dynamodb"), table_name)
    done: list[bool] = []

    def race(params: dict[str, Any], **_: Any) -> None:
        if done or "PENDING" not in str(params.get("body", "")):
            return
        done.append(True)
        other.transition_worker(
            other.get_worker(worker.id),
            S.PROVISIONING,
            cause=Cause.CONTROL,
            actor="reconciler",
            changes={
                "ec2_instance_id": machine,
                "launch_claimed_at": None,
                "launch_token": None,
                "launch_image_id": None,
                "launch_index": None,
                "launch_count": None,
            },
        )

    return race


def test_given_a_lost_batch_answer_adopted_while_discovery_reads_then_discovery_keeps_its_machine(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str, table_name: str
) -> None:
    ensure_template(store, "lab", capacity=4)
    catalog.ensure_pool(store, "labs", actor="test")
    worker = workers.create_worker(store, template="lab", region="us-east-1", pool="labs", actor="test")
    token = f"fkb-test-{worker.id}"
    # The batch's answer was lost minutes ago (older than the import grace): the worker holds its claim
    # and the machine carries the batch's tag, not the worker's id yet.
    store.update_worker(
        worker,
        {
            "launch_claimed_at": utcnow() - timedelta(minutes=10),
            "launch_token": token,
            "launch_image_id": lab_image,
            "launch_index": 0,
            "launch_count": 2,
        },
        actor="test",
        action="LaunchClaimed",
    )
    tags = {MANAGED_BY_TAG: MANAGED_BY_VALUE, TEMPLATE_TAG: "lab", BATCH_TAG: token}
    machine = ec2.run_instances(
        ImageId=lab_image,
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )["Instances"][0]["InstanceId"]

    with faults.installed_hooks([("before-call.dynamodb.Query", pair_first(table_name, worker, machine))]):
        found = discover_and_collect(make_ctx())

    assert store.get_worker(worker.id).ec2_instance_id == machine
    assert found.counters["leaked_machines_terminated"] == 0
    assert ec2_state(ec2, machine) not in ("shutting-down", "terminated")


def test_given_a_claim_from_before_batches_whose_answer_was_lost_then_its_machine_is_adopted_not_launched(
    store: FleetStore, make_ctx: ContextFactory, ec2: Any, lab_image: str
) -> None:
    ensure_template(store, "lab", capacity=4)
    worker = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    # As a release before batches claimed and launched: a token of the worker's own, no place in a
    # batch, the worker's id and name on its machine and no batch tag.
    token = f"fk-{worker.id}-{lab_image}"[:64]
    store.update_worker(
        worker,
        {
            "launch_claimed_at": utcnow() - timedelta(minutes=10),
            "launch_token": token,
            "launch_image_id": lab_image,
        },
        actor="test",
        action="LaunchClaimed",
    )
    tags = {
        "Name": f"fleetkeeper-{worker.id}",
        MANAGED_BY_TAG: MANAGED_BY_VALUE,
        WORKER_ID_TAG: worker.id,
        TEMPLATE_TAG: "lab",
    }
    machine = ec2.run_instances(
        ImageId=lab_image,
        InstanceType="m5.large",
        MinCount=1,
        MaxCount=1,
        ClientToken=token,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
        ],
    )["Instances"][0]["InstanceId"]

    with aws_calls() as counted:
        reconcile_fleet(make_ctx())

    # EC2 would refuse a repeat of that token with the batch's tag (another request): no call at all.
    assert counted.of("ec2", "RunInstances") == 0
    assert store.get_worker(worker.id).ec2_instance_id == machine
