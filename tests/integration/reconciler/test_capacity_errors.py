"""EC2 without capacity for an instance type (the local stack's `simulate ice`, EC2's own 500 answer)
through the real reconcile handlers: the launch or start is sent once, not retried by the SDK nor in a
tight loop, comes out as a CapacityError with EC2's code and message, and the worker backs off for
minutes and gets there once capacity is back, never FAILED for it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.cloud.clients import client
from fleetkeeper.cloud.ec2 import CapacityError
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.reconcile import CAPACITY_BACKOFF_MAX_SECONDS, capacity_backoff_seconds
from fleetkeeper.services import workers
from fleetkeeper.services.context import Context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import ec2_time
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import LiveWorkerFactory
from tests.integration.reconciler.support import ensure_template, instances_tagged, stopped_wanting_to_run

pytestmark = pytest.mark.integration

S = WorkerStatus
REGION = "us-east-1"
TOKEN = "fk-capacity-test"  # noqa: S105 - RunInstances' idempotency token, no secret


@pytest.fixture
def sends() -> Iterator[dict[str, int]]:
    """HTTP attempts of the control plane's EC2 launches and starts (inside the SDK's retry loop)."""
    counted: dict[str, int] = {"RunInstances": 0, "StartInstances": 0}
    events = client("ec2", REGION).meta.events

    def count(request: Any, event_name: str, **_: Any) -> None:
        counted[event_name.rsplit(".", 1)[-1]] += 1

    for operation in counted:
        events.register(f"before-send.ec2.{operation}", count)
    yield counted
    for operation in counted:
        events.unregister(f"before-send.ec2.{operation}", count)


def test_given_no_capacity_for_the_template_type_then_the_launch_is_sent_once_and_the_worker_backs_off(
    ctx: Context, store: FleetStore, ec2: Any, lab_image: str, sends: dict[str, int]
) -> None:
    ensure_template(store)  # m5.large
    worker = workers.create_worker(store, template="lab", region=REGION, pool=None, actor="test")
    ec2_time.set_capacity(ec2, "m5.large", available=False)
    now = utcnow()

    first = reconcile_fleet(ctx, now=now)
    refused = store.get_worker(worker.id)
    early = reconcile_fleet(ctx, now=now + timedelta(seconds=30))
    again = reconcile_fleet(ctx, now=now + timedelta(seconds=61))
    twice = store.get_worker(worker.id)
    store.update_worker(twice, {"reconcile_attempts": 12}, actor="test", action="ManyRefusals")
    reconcile_fleet(ctx, now=now + timedelta(minutes=5))
    long_refused = store.get_worker(worker.id)
    ec2_time.set_capacity(ec2, "m5.large", available=True)
    reconcile_fleet(ctx, now=now + timedelta(minutes=25))

    assert first.counters["capacity_errors"] == 1
    assert first.counters["retries_scheduled"] == 1
    assert refused.status == S.PENDING
    assert refused.reconcile_attempts == 1
    assert refused.launch_token is None  # nothing was launched: the next launch picks its image afresh
    assert refused.next_reconcile_at == now + timedelta(seconds=capacity_backoff_seconds(0))
    error = refused.last_reconcile_error or ""
    assert "InsufficientInstanceCapacity" in error
    assert "We currently do not have sufficient m5.large capacity" in error
    assert early.counters["backoff_waiting"] == 1
    assert again.counters["capacity_errors"] == 1
    assert twice.next_reconcile_at == now + timedelta(seconds=61 + capacity_backoff_seconds(1))
    # Twelve refusals in a row fail a worker whose launch is refused for its own sake; not for capacity.
    assert long_refused.status == S.PENDING
    assert long_refused.next_reconcile_at == now + timedelta(minutes=5, seconds=CAPACITY_BACKOFF_MAX_SECONDS)
    # Three refused launches, one HTTP request each: the SDK never sent a refused one again.
    assert sends["RunInstances"] == 4
    launched = store.get_worker(worker.id)
    assert launched.status == S.PROVISIONING
    assert launched.reconcile_attempts == 0
    assert instances_tagged(ec2, worker.id) == [launched.ec2_instance_id]


def test_given_no_capacity_to_start_a_stopped_worker_then_it_stays_stopped_and_starts_after_the_backoff(
    ctx: Context, store: FleetStore, ec2: Any, live_worker: LiveWorkerFactory, sends: dict[str, int]
) -> None:
    worker = live_worker()
    stopped_wanting_to_run(ctx, store, ec2, worker)
    ec2_time.set_capacity(ec2, "m5.large", available=False)
    now = utcnow()

    first = reconcile_fleet(ctx, now=now)
    refused = store.get_worker(worker.id)
    early = reconcile_fleet(ctx, now=now + timedelta(seconds=30))
    ec2_time.set_capacity(ec2, "m5.large", available=True)
    reconcile_fleet(ctx, now=now + timedelta(seconds=61))
    starting = store.get_worker(worker.id)
    reconcile_fleet(ctx, now=now + timedelta(seconds=62))

    assert first.counters["capacity_errors"] == 1
    assert refused.status == S.STOPPED
    assert (refused.lead_kind, refused.lead_since) == (None, None)
    assert refused.reconcile_attempts == 1
    assert refused.next_reconcile_at is not None
    waits = refused.next_reconcile_at - refused.updated_at
    assert (
        timedelta(seconds=capacity_backoff_seconds(0) - 1)
        < waits
        <= timedelta(seconds=capacity_backoff_seconds(0))
    )
    assert "StartInstances refused: InsufficientInstanceCapacity: Insufficient capacity." in (
        refused.last_reconcile_error or ""
    )
    assert early.counters["backoff_waiting"] == 1
    assert sends["StartInstances"] == 2  # the refused one, once, and the one that went through
    assert starting.status == S.STARTING
    assert store.get_worker(worker.id).status == S.RUNNING


def test_given_no_capacity_then_the_gateway_raises_a_capacity_error_with_ec2s_code_and_message(
    ctx: Context, ec2: Any, lab_image: str, sends: dict[str, int]
) -> None:
    ec2_time.set_capacity(ec2, "c5.xlarge", available=False)

    with pytest.raises(CapacityError) as refused:
        ctx.ec2(REGION).run_instances(
            image_id=lab_image, instance_type="c5.xlarge", count=1, tags={"Name": "t"}, client_token=TOKEN
        )

    assert isinstance(refused.value, ClientError)
    assert refused.value.code == "InsufficientInstanceCapacity"
    assert refused.value.aws_message.startswith("We currently do not have sufficient c5.xlarge capacity")
    assert refused.value.instance_type == "c5.xlarge"
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 500
    assert sends["RunInstances"] == 1
