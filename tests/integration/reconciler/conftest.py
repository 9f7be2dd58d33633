"""Fixtures for the reconciler, discovery and EC2 event tests: a service context and live EC2 workers."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainRecord, Worker
from fleetkeeper.services import catalog, workers
from fleetkeeper.services.context import Context, build_context, default_context
from fleetkeeper.services.drains import commands as drain_commands
from fleetkeeper.settings import Settings, get_settings
from fleetkeeper.store.repository import FleetStore
from tests.integration.reconciler.support import LAB_IMAGE_NAME, ensure_template, launch

pytestmark = pytest.mark.integration

ContextFactory = Callable[..., Context]
# The drain workflow `drains_started` stands in for: its executions are recorded, never started.
RECORDED_STATE_MACHINE = "arn:aws:states:us-east-1:123456789012:stateMachine:fk-recorded-drain"
LiveWorkerFactory = Callable[..., Worker]


@pytest.fixture
def make_ctx(store: FleetStore, ec2: Any) -> ContextFactory:
    """A service context on the test's table; keyword arguments override settings by variable name.

    The moto machines of these tests were launched a moment ago and the fleets are a handful of workers,
    so discovery's import grace and orphan GC's circuit breaker are off unless a test turns them on
    (tests/integration/reconciler/test_safety_breakers.py does, at their defaults).
    """

    def make(**overrides: str) -> Context:
        baseline = {
            "METRICS_INTERVAL_SECONDS": "0",
            "IMPORT_GRACE_SECONDS": "0",
            "ORPHAN_GC_MAX_SHARE_PERCENT": "100",
        }
        return build_context(Settings.from_environ({**os.environ, **baseline, **overrides}))

    return make


@pytest.fixture
def ctx(make_ctx: ContextFactory) -> Context:
    return make_ctx()


@pytest.fixture
def lab_image(ec2: Any) -> str:
    """An AMI owned by the account whose name matches the lab template's ami_name_filter."""
    return str(ec2.register_image(Name=LAB_IMAGE_NAME, RootDeviceName="/dev/sda1")["ImageId"])


@pytest.fixture
def live_worker(store: FleetStore, ec2: Any, lab_image: str) -> LiveWorkerFactory:
    """A worker moved through PENDING -> PROVISIONING -> RUNNING onto a real (emulated) EC2 instance."""

    def make(
        *, template: str = "lab", pool: str | None = None, capacity: int = 4, registered: bool = False
    ) -> Worker:
        ensure_template(store, template, capacity=capacity)
        if pool is not None:
            catalog.ensure_pool(store, pool, actor="test")
        worker = workers.create_worker(store, template=template, region="us-east-1", pool=pool, actor="test")
        instance_id = launch(ec2, worker.id, lab_image, template=template, registered=registered)
        worker = store.transition_worker(
            worker,
            WorkerStatus.PROVISIONING,
            cause=Cause.CONTROL,
            actor="test",
            changes={"ec2_instance_id": instance_id},
        )
        return store.transition_worker(
            worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="test", changes={"private_ip": "10.0.0.9"}
        )

    return make


@pytest.fixture
def drains_started(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Drains started for real up to the seam to the drain workflow (the door's write: the worker
    DRAINING with its drain record and its owner); each execution is recorded instead of started."""
    started: list[dict[str, Any]] = []
    monkeypatch.setenv("DRAIN_STATE_MACHINE_ARN", RECORDED_STATE_MACHINE)

    def record(ctx: Context, worker_id: str, drain: DrainRecord) -> str:
        started.append(
            {
                "worker_id": worker_id,
                "then": drain.then,
                "timeout_seconds": drain.timeout_seconds,
                "reason": drain.reason,
                "requested_by": drain.requested_by,
            }
        )
        return drain.execution_arn or ""

    monkeypatch.setattr(drain_commands, "launch_worker_drain", record)
    return started


@pytest.fixture
def handler_context(ctx: Context) -> Iterator[None]:
    """Handlers build their context once per process: start and end each test with none cached."""
    get_settings.cache_clear()
    default_context.cache_clear()
    yield
    get_settings.cache_clear()
    default_context.cache_clear()
