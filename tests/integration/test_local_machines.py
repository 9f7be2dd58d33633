"""The local stack's own machines: the demo fleet `make run` seeds answers Run Command (its machines are
launched with the local stack's instance profile, so the emulated agent is registered and
collect-system-info ends SUCCESS), and a restart into a kept fleet finishes a drain that was finishing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, Worker, utcnow
from fleetkeeper.domain.operations import SYSTEM_INFO_OPERATION, OperationOrigin, OperationStatus
from fleetkeeper.services import operations
from fleetkeeper.services.drains.contract import execution_name
from fleetkeeper_local.images import publish_newer_image, register_template_images
from fleetkeeper_local.restart import reconcile_after_restart
from fleetkeeper_local.seed import TEMPLATES, seed_demo_fleet
from fleetkeeper_local.stack import LocalStack
from tests.integration.conftest import ControlPlane, eventually
from tests.integration.functions import reconcile_fleet

pytestmark = pytest.mark.integration


def test_given_the_seeded_demo_fleet_then_collect_system_info_succeeds_on_each_running_worker(
    control_plane: ControlPlane, ec2: Any
) -> None:
    ctx = control_plane.ctx
    register_template_images(ec2, TEMPLATES)
    fleet = seed_demo_fleet(ctx, ec2, "us-east-1")
    running = [w for w in fleet.workers if w.status is WorkerStatus.RUNNING]
    requested = [
        operations.request(ctx, w.id, SYSTEM_INFO_OPERATION, {}, actor="op", origin=OperationOrigin.SCHEDULE)
        for w in running
    ]

    now = utcnow()
    for step in range(2):
        operations.reconcile_operations(ctx, [], now + timedelta(seconds=5 * step), Counter())

    done = [ctx.store.get_operation(op.worker_id, op.id) for op in requested]
    assert [(op.status, op.error) for op in done] == [(OperationStatus.SUCCESS, None)] * len(running)
    templates = {t.name: t for t in TEMPLATES}
    for worker in running:
        info = ctx.store.get_worker(worker.id).system_info
        assert info is not None
        assert info["instance_type"] == templates[worker.template].instance_type


def test_given_the_seeded_demo_fleet_then_it_runs_its_templates_images_and_drifts_only_once_one_is_published(
    control_plane: ControlPlane, ec2: Any
) -> None:
    ctx = control_plane.ctx
    images = register_template_images(ec2, TEMPLATES)
    fleet = seed_demo_fleet(ctx, ec2, "us-east-1")
    templates = {t.name: t for t in TEMPLATES}
    running = [w for w in fleet.workers if w.status is WorkerStatus.RUNNING]
    for worker in running:
        template = templates[worker.template]
        launched_with = (images[template.ami_name_filter], template.instance_type)
        assert (worker.image_id, worker.instance_type) == launched_with
        assert worker.launched_at is not None
    reconcile_fleet(ctx)
    assert [w.id for w in running if ctx.store.get_worker(w.id).drift is not None] == []

    name_filter = templates["lab-small"].ami_name_filter
    publish_newer_image(ec2, name_filter)
    reconcile_fleet(ctx)

    drifted = {w.id for w in running if ctx.store.get_worker(w.id).drift is not None}
    assert drifted == {w.id for w in running if templates[w.template].ami_name_filter == name_filter}
    assert drifted


def test_given_a_finishing_drain_when_moto_restarts_empty_then_it_is_finished_again_not_cancelled(
    control_plane_factory: Callable[..., ControlPlane],
    local_stack: LocalStack,
    machine_worker: Callable[..., Worker],
) -> None:
    plane = control_plane_factory()
    worker = machine_worker()
    started = utcnow()
    generation = worker.next_drain_generation
    record = DrainRecord(
        generation=generation,
        started_at=started,
        deadline=started + timedelta(hours=1),
        timeout_seconds=3600,
        requested_by="alice",
        execution_arn=plane.ctx.workflows.execution_arn(execution_name("drain", worker.id, generation)),
        finishing_at=started,  # Finish had marked it when the stack went down
    )
    store = plane.ctx.store
    store.transition_worker(
        worker, WorkerStatus.DRAINING, cause=Cause.CONTROL, actor="alice", changes={"drain": record}
    )

    local_stack.reset_moto()  # what a restart does to the emulated EC2 and Step Functions
    plane = control_plane_factory()
    lines: list[str] = []
    reconcile_after_restart(plane.ctx, boto3.client("ec2"), lines.append)

    assert lines[-1] == "restart: 1 machine(s) re-created, 1 drain(s) resumed", lines
    after = eventually(lambda: (w := store.get_worker(worker.id)).status is WorkerStatus.STOPPING and w, 60)
    assert after.drain is not None
    assert (after.drain.generation, after.drain.outcome) == (generation, DrainOutcome.SUCCESS)
    assert "WorkerDrainCancelled" not in [e.action for e in store.audit_trail("worker", worker.id)]
