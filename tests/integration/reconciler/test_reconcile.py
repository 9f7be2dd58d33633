"""The reconcile cycle on DynamoDB Local and moto: every status handler, drift, backoff, counters."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, Instance, Worker, utcnow
from fleetkeeper.services import reconcile, workers
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile import LEASE_NAME, STATS_SCOPE
from fleetkeeper.settings import get_settings
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from fleetkeeper_local.iam import session as iam_session
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import (
    claimed_and_launched,
    ec2_state,
    ensure_template,
    instances_tagged,
)

pytestmark = pytest.mark.integration

S = WorkerStatus


def pending_worker(store: FleetStore, *, template: str = "lab", pool: str | None = None) -> Worker:
    ensure_template(store, template, tags={"team": "labs"})
    return workers.create_worker(store, template=template, region="us-east-1", pool=pool, actor="test")


def test_given_a_pending_worker_when_reconciled_then_it_is_launched_tagged_and_provisioning(
    ctx, store, ec2, lab_image
):
    worker = pending_worker(store)

    report = reconcile_fleet(ctx)

    stored = store.get_worker(worker.id)
    assert stored.status == S.PROVISIONING
    assert stored.ec2_instance_id is not None
    described = ec2.describe_instances(InstanceIds=[stored.ec2_instance_id])["Reservations"][0]["Instances"][
        0
    ]
    tags = {t["Key"]: t["Value"] for t in described["Tags"]}
    assert tags["fleetkeeper:managed-by"] == "fleetkeeper"
    assert tags["fleetkeeper:worker-id"] == worker.id
    assert tags["team"] == "labs"
    assert described["ImageId"] == lab_image
    assert report.counters["provisioned_count"] == 1
    assert [e.action for e in store.audit_trail("worker", worker.id)][-1] == "WorkerProvisioned"


def test_given_a_region_config_when_launched_then_subnet_groups_key_and_default_tags_apply(
    make_ctx, store, ec2, lab_image
):
    vpc = ec2.create_vpc(CidrBlock="10.1.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.1.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="workers", Description="w", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName="ops")
    config = {
        "subnet_id": subnet,
        "security_group_ids": [group],
        "key_name": "ops",
        "default_tags": {"env": "prod", "team": "default"},
    }
    ctx = make_ctx(REGION_CONFIGS=json.dumps({"us-east-1": config}))
    worker = pending_worker(store)

    # A stage pinning its own network and key pair: the dev stage's policies, which the IAM evaluation
    # uses, grant no key pair, so the run's recorder looks away (tests/infra/test_permissions.py checks a
    # pinned stage's grants).
    with iam_session.paused():
        reconcile.reconcile_fleet(ctx)

    instance_id = store.get_worker(worker.id).ec2_instance_id
    described = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    tags = {t["Key"]: t["Value"] for t in described["Tags"]}
    assert described["SubnetId"] == subnet
    assert [g["GroupId"] for g in described["SecurityGroups"]] == [group]
    assert described["KeyName"] == "ops"
    assert tags["env"] == "prod"
    assert tags["team"] == "labs"  # the template's tag wins over the region default


def test_given_the_workers_instance_profile_when_launched_then_the_machine_carries_it_and_requires_imdsv2(
    make_ctx, store, ec2, lab_image, monkeypatch
):
    # Set as the deployed function sees it, so the IAM evaluation knows it is the stage's own profile.
    monkeypatch.setenv("WORKER_INSTANCE_PROFILE", "fleet-worker")
    get_settings.cache_clear()
    iam = boto3.client("iam")
    iam.create_role(RoleName="fleet-worker", AssumeRolePolicyDocument=json.dumps({"Statement": []}))
    iam.create_instance_profile(InstanceProfileName="fleet-worker")
    iam.add_role_to_instance_profile(InstanceProfileName="fleet-worker", RoleName="fleet-worker")
    ctx = make_ctx()
    worker = pending_worker(store)

    reconcile_fleet(ctx)

    instance_id = store.get_worker(worker.id).ec2_instance_id
    described = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    # Without it the SSM agent never registers, and no Run Command reaches the machine.
    assert described["IamInstanceProfile"]["Arn"].endswith(":instance-profile/fleet-worker")
    # The RunInstances grant requires IMDSv2 (ec2:MetadataHttpTokens): a launch without it is denied.
    assert described["MetadataOptions"]["HttpTokens"] == "required"
    assert described["MetadataOptions"]["HttpEndpoint"] == "enabled"


def test_given_a_template_of_a_type_the_stage_may_not_launch_then_its_worker_fails_saying_why(
    make_ctx, store, ec2, lab_image
):
    ctx = make_ctx(INSTANCE_TYPES="c5.xlarge,m5.xlarge")
    worker = pending_worker(store)  # the lab template is an m5.large

    reconcile_fleet(ctx)

    failed = store.get_worker(worker.id)
    assert failed.status == S.FAILED
    assert "'m5.large' is not an instance type this stage may launch" in (failed.status_reason or "")
    assert "c5.xlarge, m5.xlarge" in (failed.status_reason or "")
    assert (
        ec2.describe_instances(Filters=[{"Name": "tag:fleetkeeper:worker-id", "Values": [worker.id]}])[
            "Reservations"
        ]
        == []
    )


def test_given_a_pending_worker_of_a_missing_template_then_it_fails(ctx, store, lab_image):
    ghost = store.create_worker(
        Worker(id="w-ghost", template="ghost", region="us-east-1", capacity=1), actor="test"
    )

    reconcile_fleet(ctx)

    failed = store.get_worker(ghost.id)
    assert failed.status == S.FAILED
    assert "template 'ghost' not found" in (failed.status_reason or "")


def test_given_no_ami_matching_the_filter_then_the_pending_worker_fails(ctx, store, ec2):
    worker = pending_worker(store)

    reconcile_fleet(ctx)

    assert store.get_worker(worker.id).status == S.FAILED


def test_given_a_region_without_config_when_others_are_configured_then_the_worker_fails(
    make_ctx, store, lab_image
):
    ctx = make_ctx(REGION_CONFIGS='{"eu-west-1": {}}')
    worker = pending_worker(store)

    reconcile_fleet(ctx)

    assert "no region config" in (store.get_worker(worker.id).status_reason or "")


def test_given_a_launched_worker_when_reconciled_again_then_it_runs_with_its_ip(ctx, store, lab_image):
    worker = pending_worker(store)
    reconcile_fleet(ctx)

    report = reconcile_fleet(ctx)

    running = store.get_worker(worker.id)
    assert running.status == S.RUNNING
    assert running.private_ip
    assert report.counters["started_count"] == 1


def test_given_provisioning_without_an_instance_id_then_failed_then_cleaned_up(ctx, store, lab_image):
    worker = pending_worker(store)
    store.transition_worker(worker, S.PROVISIONING, cause=Cause.CONTROL, actor="test")

    reconcile_fleet(ctx)
    assert store.get_worker(worker.id).status == S.FAILED

    reconcile_fleet(ctx)
    gone = store.get_worker(worker.id)
    assert (gone.status, gone.terminated_by) == (S.TERMINATED, "reconciler")


def test_given_an_instance_that_never_becomes_visible_then_the_ec2_timeout_fails_it(ctx, store, lab_image):
    worker = pending_worker(store)
    store.transition_worker(
        worker,
        S.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"ec2_instance_id": "i-0123456789abcdef0"},
    )

    reconcile_fleet(ctx)
    assert store.get_worker(worker.id).status == S.PROVISIONING

    reconcile_fleet(ctx, now=utcnow() + timedelta(hours=1))
    failed = store.get_worker(worker.id)
    assert failed.status == S.FAILED
    assert "EC2 timeout" in (failed.status_reason or "")


def test_given_a_steady_running_fleet_then_a_cycle_writes_no_worker(ctx, store, live_worker):
    fleet = [live_worker() for _ in range(3)]

    report = reconcile_fleet(ctx)

    assert [store.get_worker(w.id).version for w in fleet] == [w.version for w in fleet]
    assert report.counters["outcome_success"] == 3


@pytest.mark.parametrize(
    "case",
    [
        (S.STOPPED, S.STOPPING, S.STOPPED, "stopped"),
        (S.TERMINATED, S.TERMINATING, S.TERMINATED, "terminated"),
    ],
)
def test_given_a_desired_status_when_reconciled_twice_then_the_worker_gets_there(
    ctx, store, ec2, live_worker, case
):
    desired, between, final, ec2_final = case
    worker = live_worker()
    store.update_worker(worker, {"desired_status": desired}, actor="test", action="DesiredStatusSet")

    reconcile_fleet(ctx)
    assert store.get_worker(worker.id).status == between
    assert ec2_state(ec2, worker.ec2_instance_id) == ec2_final

    reconcile_fleet(ctx)
    assert store.get_worker(worker.id).status == final


@pytest.mark.parametrize("case", [("stop_instances", S.STOPPED), ("terminate_instances", S.TERMINATED)])
def test_given_ec2_changed_behind_fleetkeeper_then_the_drift_is_corrected(ctx, store, ec2, live_worker, case):
    ec2_action, expected = case
    worker = live_worker()
    getattr(ec2, ec2_action)(InstanceIds=[worker.ec2_instance_id])

    report = reconcile_fleet(ctx)

    corrected = store.get_worker(worker.id)
    assert corrected.status == expected
    assert corrected.ec2_state in ("stopped", "terminated")
    assert report.counters["drift_corrections"] == 1


def test_given_a_running_worker_terminated_outside_then_its_instances_end_as_worker_lost(
    ctx, store, ec2, live_worker
):
    worker = live_worker()
    placed = store.place_instance(Instance(id="i-lab-1", worker_id=""), worker, actor="test")
    ec2.terminate_instances(InstanceIds=[worker.ec2_instance_id])

    reconcile_fleet(ctx)

    ended = store.get_instance(placed.id)
    assert (ended.state, ended.reason) == (InstanceState.TERMINATED, "worker_lost")
    assert store.get_worker(worker.id).active_instances == 0


def test_given_a_stopped_worker_desired_running_then_it_starts_and_runs(ctx, store, ec2, live_worker):
    worker = live_worker()
    ec2.stop_instances(InstanceIds=[worker.ec2_instance_id])
    reconcile_fleet(ctx)
    stopped = store.get_worker(worker.id)
    store.update_worker(stopped, {"desired_status": S.RUNNING}, actor="test", action="DesiredStatusSet")

    reconcile_fleet(ctx)
    assert store.get_worker(worker.id).status == S.STARTING

    reconcile_fleet(ctx)
    assert store.get_worker(worker.id).status == S.RUNNING


def test_given_a_failed_worker_with_a_live_instance_then_cleanup_terminates_it(ctx, store, ec2, live_worker):
    worker = live_worker()
    # The only way to FAILED from RUNNING is through a step that failed; fake it on a fresh worker.
    store.transition_worker(worker, S.TERMINATING, cause=Cause.CONTROL, actor="test")
    failed_one = pending_worker(store)
    failed_one = store.transition_worker(
        failed_one,
        S.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"ec2_instance_id": worker.ec2_instance_id},
    )
    failed_one = store.transition_worker(failed_one, S.FAILED, cause=Cause.CONTROL, actor="test")

    reconcile_fleet(ctx)
    assert store.get_worker(failed_one.id).status == S.TERMINATING
    assert ec2_state(ec2, worker.ec2_instance_id) == "terminated"

    reconcile_fleet(ctx)
    assert store.get_worker(failed_one.id).status == S.TERMINATED


def _drain(**changes: Any) -> DrainRecord:
    now = utcnow()
    record = DrainRecord(
        generation=1,
        started_at=now,
        deadline=now + timedelta(hours=1),
        timeout_seconds=3600,
        requested_by="op",
    )
    return record.model_copy(update=changes)


def test_given_a_worker_draining_under_its_workflow_then_the_reconciler_leaves_it(
    ctx, store, ec2, live_worker
):
    worker = live_worker()
    store.place_instance(Instance(id="i-busy", worker_id=""), worker, actor="test")
    worker = store.get_worker(worker.id)
    draining = store.transition_worker(
        worker,
        S.DRAINING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"drain": _drain(execution_arn="arn:aws:states:us-east-1:1:execution:drain:w")},
    )

    report = reconcile_fleet(ctx)

    assert store.get_worker(worker.id).version == draining.version
    assert ec2_state(ec2, worker.ec2_instance_id) == "running"
    assert report.counters["outcome_skip"] == 1


def test_given_a_worker_left_draining_by_a_finished_drain_then_it_moves_on(ctx, store, ec2, live_worker):
    worker = live_worker()
    store.transition_worker(
        worker,
        S.DRAINING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"drain": _drain(execution_arn="arn:x", outcome=DrainOutcome.SUCCESS)},
    )

    reconcile_fleet(ctx)

    assert store.get_worker(worker.id).status == S.STOPPING
    assert ec2_state(ec2, worker.ec2_instance_id) == "stopped"


def test_given_a_transient_launch_error_then_retry_backoff_is_persisted_and_honoured(
    make_ctx, store, lab_image
):
    worker = pending_worker(store)
    plan = faults.FaultPlan(
        seed=3, faults=[faults.ec2_server_error(1.0, operations=frozenset({"RunInstances"}))]
    )
    with plan.installed():
        ctx = make_ctx()
        first = reconcile_fleet(ctx)
        waiting = store.get_worker(worker.id)
        assert waiting.next_reconcile_at is not None
        second = reconcile_fleet(ctx, now=waiting.next_reconcile_at - timedelta(milliseconds=500))

    assert first.counters["outcome_retry"] == 1
    assert first.counters["worker_errors"] == 1
    assert first.counters["final_errors"] == 0
    assert waiting.status == S.PENDING
    assert waiting.reconcile_attempts == 1
    assert waiting.next_reconcile_at is not None
    assert waiting.launch_claimed_at is None
    assert "InternalError" in (waiting.last_reconcile_error or "")
    assert second.counters["backoff_waiting"] == 1
    assert store.get_worker(worker.id).version == waiting.version


def test_given_a_final_launch_error_then_it_waits_the_longest_backoff_and_fails_after_ten_refusals(
    make_ctx, store, ec2, lab_image
):
    ctx = make_ctx(REGION_CONFIGS='{"us-east-1": {"subnet_id": "subnet-00000000000000000"}}')
    worker = pending_worker(store)

    first = reconcile_fleet(ctx)
    waiting = store.get_worker(worker.id)
    store.update_worker(waiting, {"reconcile_attempts": 9}, actor="test", action="ManyRefusals")
    last = reconcile_fleet(ctx, now=(waiting.next_reconcile_at or utcnow()) + timedelta(seconds=1))

    assert first.counters["final_errors"] == 1
    assert waiting.status == S.PENDING
    assert waiting.next_reconcile_at is not None
    assert waiting.updated_at + timedelta(seconds=45) < waiting.next_reconcile_at  # the longest backoff
    assert last.counters["final_errors"] == 1
    failed = store.get_worker(worker.id)
    assert failed.status == S.FAILED
    assert "launch refused 10 times" in (failed.status_reason or "")
    assert instances_tagged(ec2, worker.id) == []


def test_given_a_cycle_then_counters_are_stored_for_the_stats_endpoint(ctx: Context, store, live_worker):
    live_worker()
    reconcile_fleet(ctx)
    reconcile_fleet(ctx)

    stats = ctx.stats.read(STATS_SCOPE)

    assert stats.counters["outcome_success"] == 2
    assert stats.gauges["running_worker_count"] == 1
    assert "last_run_at" in stats.timestamps


def test_given_the_lease_is_held_then_a_second_cycle_does_nothing(ctx: Context, store, lab_image):
    worker = pending_worker(store)
    now = utcnow()
    assert ctx.stats.acquire_lease(LEASE_NAME, "someone-else", now=now, until=now + timedelta(minutes=5))

    report = reconcile_fleet(ctx)

    assert not report.lease_acquired
    assert store.get_worker(worker.id).status == S.PENDING


def test_given_an_expired_lease_then_a_cycle_takes_it_over(ctx: Context, store, lab_image):
    worker = pending_worker(store)
    past = utcnow() - timedelta(hours=1)
    ctx.stats.acquire_lease(LEASE_NAME, "crashed", now=past, until=past + timedelta(minutes=5))

    assert reconcile_fleet(ctx).lease_acquired
    assert store.get_worker(worker.id).status == S.PROVISIONING


def test_given_a_launch_claim_left_by_a_dead_reconciler_then_its_instance_is_adopted(
    ctx, store, ec2, lab_image
):
    worker = pending_worker(store)
    _, instance_id = claimed_and_launched(
        store, ec2, worker, lab_image, claimed_at=utcnow() - timedelta(minutes=30)
    )

    reconcile_fleet(ctx)

    assert store.get_worker(worker.id).ec2_instance_id == instance_id
    assert instances_tagged(ec2, worker.id) == [instance_id]


def test_given_too_little_time_left_then_work_is_deferred_to_the_next_cycle(ctx, store, lab_image):
    worker = pending_worker(store)

    report = reconcile_fleet(ctx, time_left=lambda: 5.0)

    assert report.counters["deferred"] == 1
    assert report.counters["outcome_requeue"] == 1
    assert store.get_worker(worker.id).status == S.PENDING
