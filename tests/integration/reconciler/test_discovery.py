"""Discovery and orphan GC (seed 001) on DynamoDB Local and moto."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.cloud.ec2 import Ec2Gateway
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import Instance, Worker, utcnow
from fleetkeeper.services import workers
from fleetkeeper.services.discovery import (
    REASON_MISSING,
    REASON_TERMINATED,
    STATS_SCOPE,
    TIME_MARGIN_SECONDS,
    taking_turns,
)
from fleetkeeper.store.repository import FleetStore
from tests.integration.functions import discover_and_collect
from tests.integration.reconciler.support import ensure_template, launch

pytestmark = pytest.mark.integration

S = WorkerStatus


def snapshot(store: FleetStore, ids: list[str]) -> dict[str, int]:
    return {worker_id: store.get_worker(worker_id).version for worker_id in ids}


@pytest.fixture
def seed_001(ec2: Any, live_worker: Any, running_worker: Any) -> tuple[list[Worker], list[Worker]]:
    """13 workers in the database, 3 machines in EC2: 7 terminated there, 3 never existed."""
    alive = [live_worker() for _ in range(3)]
    terminated = [live_worker() for _ in range(7)]
    ec2.terminate_instances(InstanceIds=[w.ec2_instance_id for w in terminated])
    vanished = [running_worker(template="lab") for _ in range(3)]
    return alive, terminated + vanished


def test_given_13_workers_and_3_machines_then_10_are_terminated_and_3_untouched(ctx, store, seed_001):
    alive, orphans = seed_001
    before = snapshot(store, [w.id for w in alive])

    report = discover_and_collect(ctx)

    assert snapshot(store, [w.id for w in alive]) == before
    gone = [store.get_worker(w.id) for w in orphans]
    assert {w.status for w in gone} == {S.TERMINATED}
    assert {w.terminated_by for w in gone} == {"discovery-gc"}
    assert {w.terminated_reason for w in gone} == {REASON_MISSING, REASON_TERMINATED}
    assert report.counters["orphans_terminated"] == 10
    assert ctx.stats.read(STATS_SCOPE).counters["orphans_terminated"] == 10


def test_given_an_orphan_with_instances_then_they_end_as_worker_lost(ctx, store, running_worker):
    worker = running_worker(template="lab")
    placed = store.place_instance(Instance(id="i-lost", worker_id=""), worker, actor="test")

    discover_and_collect(ctx)

    ended = store.get_instance(placed.id)
    assert (ended.state, ended.reason) == (InstanceState.TERMINATED, "worker_lost")


def test_given_report_only_mode_then_orphans_are_reported_and_nothing_is_written(
    make_ctx, store, ec2, seed_001, lab_image
):
    ctx = make_ctx(GC_MODE="report-only")
    alive, orphans = seed_001
    stranger = launch(ec2, "w-stranger", lab_image)
    everyone = [w.id for w in alive + orphans]
    before = snapshot(store, everyone)

    report = discover_and_collect(ctx)

    assert snapshot(store, everyone) == before
    assert store.find_worker("w-stranger") is None
    assert store.find_worker_by_ec2_instance(stranger) is None
    assert report.counters["orphans_reported"] == 10
    assert report.counters["would_import"] == 1
    assert report.counters["orphans_terminated"] == 0


def test_given_a_managed_machine_nobody_knows_then_it_is_imported(ctx, store, ec2, lab_image):
    ensure_template(store)
    instance_id = launch(ec2, "w-0123456789abcdef", lab_image)

    report = discover_and_collect(ctx)

    imported = store.get_worker("w-0123456789abcdef")
    assert (imported.status, imported.ec2_instance_id, imported.template) == (S.RUNNING, instance_id, "lab")
    # What the machine was launched with, so its drift is known from the first cycle.
    assert (imported.image_id, imported.instance_type) == (lab_image, "m5.large")
    assert imported.launched_at is not None
    assert report.counters["imported"] == 1
    assert discover_and_collect(ctx).counters["imported"] == 0


def test_given_an_untagged_machine_of_a_template_ami_then_the_ami_pattern_imports_and_tags_it(
    make_ctx, store, ec2, lab_image
):
    ctx = make_ctx(DISCOVERY_AMI_PATTERN="lab-*")
    ensure_template(store)
    instance_id = launch(ec2, "ignored", lab_image, tagged=False)

    discover_and_collect(ctx)

    imported = store.find_worker_by_ec2_instance(instance_id)
    assert imported is not None
    assert imported.template == "lab"
    tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]}])["Tags"]
    assert {t["Key"]: t["Value"] for t in tags}["fleetkeeper:worker-id"] == imported.id


def test_given_a_pending_worker_mid_launch_then_its_machine_is_not_imported_twice(ctx, store, ec2, lab_image):
    ensure_template(store)
    pending = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    launch(ec2, pending.id, lab_image)

    report = discover_and_collect(ctx)

    assert report.counters["imported"] == 0
    assert store.get_worker(pending.id).status == S.PENDING


def test_given_a_terminated_worker_whose_machine_is_back_then_it_is_resurrected(ctx, store, live_worker):
    worker = live_worker()
    store.transition_worker(
        worker,
        S.TERMINATED,
        cause=Cause.EC2,
        actor="discovery-gc",
        changes={"terminated_by": "discovery-gc", "terminated_reason": REASON_MISSING},
    )

    report = discover_and_collect(ctx)

    back = store.get_worker(worker.id)
    assert (back.status, back.terminated_by) == (S.RUNNING, None)
    assert report.counters["resurrected"] == 1
    assert [e.action for e in store.audit_trail("worker", worker.id)][-1] == "WorkerResurrected"


def test_given_a_worker_launched_seconds_ago_then_it_is_not_suspected_yet(ctx, store, lab_image):
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    store.transition_worker(
        worker,
        S.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"ec2_instance_id": "i-00000000000000fff", "ec2_observed_at": utcnow()},
    )

    report = discover_and_collect(ctx)

    assert store.get_worker(worker.id).status == S.PROVISIONING
    assert report.counters["orphans_terminated"] == 0


def test_given_tagging_is_denied_then_the_machine_is_still_imported_and_counted(
    make_ctx, store, ec2, lab_image, monkeypatch
):
    def denied(*_args: Any, **_kwargs: Any) -> None:
        raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "denied"}}, "CreateTags")

    ctx = make_ctx(DISCOVERY_AMI_PATTERN="lab-*")
    ensure_template(store)
    instance_id = launch(ec2, "ignored", lab_image, tagged=False)
    monkeypatch.setattr(Ec2Gateway, "tag", denied)

    report = discover_and_collect(ctx)

    imported = store.find_worker_by_ec2_instance(instance_id)
    assert imported is not None
    assert report.counters["imported_untagged"] == 1

    # Tagging works again: the next run tags the machine, so IAM lets fleetkeeper stop it.
    monkeypatch.undo()
    discover_and_collect(ctx)
    tags = ec2.describe_tags(Filters=[{"Name": "resource-id", "Values": [instance_id]}])["Tags"]
    assert {t["Key"]: t["Value"] for t in tags}["fleetkeeper:managed-by"] == "fleetkeeper"
    assert {t["Key"]: t["Value"] for t in tags}["fleetkeeper:worker-id"] == imported.id


def countdown(seconds_per_call: float, start: float) -> Any:
    """A `time_left` that loses `seconds_per_call` each time it is asked: the run's own clock, sped up."""
    left = [start]

    def time_left() -> float:
        left[0] -= seconds_per_call
        return left[0]

    return time_left


def test_given_too_little_time_for_every_orphan_then_the_rest_is_deferred_counted_and_retired_next_run(
    ctx, store, seed_001
):
    alive, orphans = seed_001
    # Enough for the region and four orphans, then under the margin (each check costs 1 s here).
    short = countdown(1.0, TIME_MARGIN_SECONDS + 8)

    first = discover_and_collect(ctx, time_left=short)
    retired_first = [w.id for w in orphans if store.get_worker(w.id).status is S.TERMINATED]
    second = discover_and_collect(ctx)

    assert 0 < first.counters["orphans_terminated"] < len(orphans)
    assert first.counters["deferred_for_time"] == len(orphans) - first.counters["orphans_terminated"]
    assert len(retired_first) == first.counters["orphans_terminated"]
    assert second.counters["orphans_terminated"] == len(orphans) - len(retired_first)
    assert {store.get_worker(w.id).status for w in orphans} == {S.TERMINATED}
    assert {store.get_worker(w.id).status for w in alive} == {S.RUNNING}


def test_given_no_time_left_then_every_region_is_deferred_and_nothing_is_written(ctx, store, seed_001):
    alive, orphans = seed_001
    before = snapshot(store, [w.id for w in alive + orphans])

    report = discover_and_collect(ctx, time_left=lambda: TIME_MARGIN_SECONDS - 1)

    assert report.regions == []
    assert report.counters["regions_deferred"] == len(ctx.settings.regions)
    assert snapshot(store, [w.id for w in alive + orphans]) == before


def test_given_regions_then_the_one_whose_last_complete_pass_is_oldest_goes_first() -> None:
    regions = ["eu-west-1", "us-east-1", "us-west-2"]
    passes = {
        "completed_at:eu-west-1": "2026-11-27T12:05:00+00:00",
        "completed_at:us-east-1": "2026-11-27T12:00:00+00:00",
    }

    assert taking_turns(regions, passes) == ["us-west-2", "us-east-1", "eu-west-1"]
    assert taking_turns(regions, {}) == regions


def test_given_a_run_that_ran_out_of_time_then_its_region_is_not_recorded_as_completed(ctx, seed_001):
    discover_and_collect(ctx, time_left=countdown(1.0, TIME_MARGIN_SECONDS + 3))
    cut_short = ctx.stats.read(STATS_SCOPE).timestamps
    discover_and_collect(ctx)
    completed = ctx.stats.read(STATS_SCOPE).timestamps

    [region] = ctx.settings.regions
    assert f"completed_at:{region}" not in cut_short
    assert f"completed_at:{region}" in completed


def test_given_a_region_that_never_fits_its_run_then_the_next_region_still_gets_its_turn(ctx, seed_001):
    # us-east-1 holds ten orphans; each run has time for about two of them, then stops.
    regions = ["us-east-1", "us-west-2"]

    visited = [
        [
            f.region
            for f in discover_and_collect(
                ctx, regions=regions, time_left=countdown(1.0, TIME_MARGIN_SECONDS + 3)
            ).regions
        ]
        for _ in range(3)
    ]

    assert any("us-west-2" in run for run in visited), visited
