"""Machines that take time to boot (the local stack's ec2_time): the reconciler keeps a launched worker
PROVISIONING, and a started one STARTING, until EC2 runs the machine, and only then RUNNING."""

from __future__ import annotations

import time
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.services import workers
from fleetkeeper.services.context import Context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import ec2_time
from fleetkeeper_local.ec2_time import Delays
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import LiveWorkerFactory
from tests.integration.reconciler.support import ensure_template, stopped_wanting_to_run

pytestmark = pytest.mark.integration

S = WorkerStatus
BOOT = Delays(launch_seconds=1.5, start_seconds=1.5)


def statuses_until_running(ctx: Context, store: FleetStore, worker_id: str, *, within: float) -> list[S]:
    """The worker's status after each cycle, a cycle every 0.25 s, until it is RUNNING."""
    seen: list[S] = []
    deadline = time.monotonic() + within
    while not seen or seen[-1] != S.RUNNING:
        assert time.monotonic() < deadline, f"not RUNNING within {within} s: {seen}"
        reconcile_fleet(ctx)
        seen.append(store.get_worker(worker_id).status)
        time.sleep(0.25)
    return seen


@pytest.mark.usefixtures("lab_image")
def test_given_a_launch_delay_then_the_worker_stays_provisioning_until_it_passed(
    ctx: Context, store: FleetStore
) -> None:
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", pool=None, actor="test")

    with ec2_time.delayed(BOOT):
        began = time.monotonic()
        seen = statuses_until_running(ctx, store, worker.id, within=10)
        took = time.monotonic() - began

    assert seen[0] == S.PROVISIONING
    assert seen.count(S.PROVISIONING) >= 2  # a later cycle still saw the machine pending
    assert set(seen[:-1]) <= {S.PROVISIONING, S.STARTING}
    assert took >= BOOT.launch_seconds


def test_given_a_start_delay_then_a_started_worker_stays_starting_until_it_passed(
    ctx: Context, store: FleetStore, ec2: Any, live_worker: LiveWorkerFactory
) -> None:
    worker = live_worker()
    stopped = stopped_wanting_to_run(ctx, store, ec2, worker)

    with ec2_time.delayed(BOOT):
        began = time.monotonic()
        seen = statuses_until_running(ctx, store, worker.id, within=10)
        took = time.monotonic() - began

    assert stopped.status == S.STOPPED
    assert seen[0] == S.STARTING
    assert seen.count(S.STARTING) >= 2
    assert set(seen[:-1]) == {S.STARTING}
    assert took >= BOOT.start_seconds
    assert store.get_worker(worker.id).ec2_instance_id == worker.ec2_instance_id
