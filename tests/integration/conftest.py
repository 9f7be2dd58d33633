"""Builders for integration tests on the local stack."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate
from fleetkeeper.services import catalog, workers
from fleetkeeper.store.repository import FleetStore

pytestmark = pytest.mark.integration

_fake_ec2_ids = (f"i-{n:017x}" for n in itertools.count(0xABC000))

WorkerFactory = Callable[..., Worker]


@pytest.fixture
def running_worker(store: FleetStore) -> WorkerFactory:
    """Make a RUNNING worker through the real lifecycle (PENDING -> PROVISIONING -> RUNNING)."""

    def make(
        *,
        template: str = "lab",
        capacity: int = 4,
        pool: str | None = None,
        region: str = "us-east-1",
        drain_timeout_hours: float = 4,
    ) -> Worker:
        if store.find_template(template) is None:
            catalog.put_template(
                store,
                WorkerTemplate(
                    name=template,
                    instance_type="m5.large",
                    ami_name_filter="lab-*",
                    capacity=capacity,
                    drain_timeout_hours=drain_timeout_hours,
                ),
                actor="test",
            )
        if pool is not None:
            catalog.ensure_pool(store, pool, actor="test")
        worker = workers.create_worker(store, template=template, region=region, pool=pool, actor="test")
        if worker.capacity != capacity:
            worker = store.update_worker(worker, {"capacity": capacity}, actor="test", action="Resized")
        worker = store.transition_worker(
            worker,
            WorkerStatus.PROVISIONING,
            cause=Cause.CONTROL,
            actor="test",
            changes={"ec2_instance_id": next(_fake_ec2_ids)},
        )
        return store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="test")

    return make
