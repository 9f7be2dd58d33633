"""A template's lead time, measured: a worker that comes up from a launch or a start adds one sample
when it reaches RUNNING (through the reconciler or an EC2 event), the samples stay bounded and none is
lost to a concurrent writer, a sample that cannot be written never fails the worker's move, and
GET /api/v1/templates/{name} shows the figures."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lead_time import SAMPLES_KEPT, LeadKind
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.services import ec2_events, lead_time, workers
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.store.item_size import item_size
from fleetkeeper.store.lead_times import lead_time_key
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import ec2_time, faults
from fleetkeeper_local.ec2_time import Delays
from tests.integration.conftest import ControlPlane
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import LiveWorkerFactory
from tests.integration.reconciler.support import ensure_template, stopped_wanting_to_run

pytestmark = pytest.mark.integration

S = WorkerStatus
BOOT = Delays(launch_seconds=1.0, start_seconds=0.5)


def until_running(ctx: Context, store: FleetStore, worker_id: str, *, within: float = 10) -> None:
    deadline = time.monotonic() + within
    while store.get_worker(worker_id).status != S.RUNNING:
        assert time.monotonic() < deadline, f"{worker_id} not RUNNING within {within} s"
        reconcile_fleet(ctx)
        time.sleep(0.2)


@pytest.mark.usefixtures("lab_image")
def test_given_a_launch_that_takes_a_second_then_the_template_keeps_one_launch_sample_of_that_long(
    control_plane: ControlPlane, store: FleetStore
) -> None:
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", pool=None, actor="test")

    with ec2_time.delayed(BOOT):
        until_running(control_plane.ctx, store, worker.id)
    status, body = control_plane.api("GET", "/api/v1/templates/lab")

    samples = store.lead_samples("lab")
    assert len(samples[LeadKind.LAUNCH]) == 1
    assert BOOT.launch_seconds <= samples[LeadKind.LAUNCH][0] < 10
    assert samples[LeadKind.START] == []
    running = store.get_worker(worker.id)
    assert (running.lead_kind, running.lead_since) == (None, None)
    assert status == 200
    assert body["lead_time"] == {
        "launch_seconds": 600.0,
        "start_seconds": 120.0,
        "samples_launch": 1,
        "samples_start": 0,
        "source": "default",
    }


def test_given_a_stopped_worker_started_then_its_start_is_sampled_when_an_ec2_event_says_running(
    ctx: Context, store: FleetStore, ec2: Any, live_worker: LiveWorkerFactory
) -> None:
    worker = live_worker()
    stopped_wanting_to_run(ctx, store, ec2, worker)
    with ec2_time.delayed(BOOT):
        reconcile_fleet(ctx)
        starting = store.get_worker(worker.id)
        time.sleep(BOOT.start_seconds)

    result = ec2_events.apply_state_change(
        ctx, instance_id=str(worker.ec2_instance_id), state="running", at=utcnow(), region="us-east-1"
    )

    assert (starting.status, starting.lead_kind) == (S.STARTING, LeadKind.START)
    assert store.get_worker(worker.id).status == S.RUNNING
    assert result.outcome == ec2_events.EventOutcome.APPLIED
    samples = store.lead_samples("lab")
    assert samples[LeadKind.LAUNCH] == []
    assert len(samples[LeadKind.START]) == 1
    assert samples[LeadKind.START][0] >= BOOT.start_seconds - 1  # event times have whole seconds


def test_given_writers_racing_then_every_sample_is_kept_and_the_list_stays_bounded(
    store: FleetStore, dynamodb: Any
) -> None:
    def add(writer: int) -> None:
        for n in range(5):
            store.add_lead_sample("lab", LeadKind.LAUNCH, float(writer * 100 + n))

    threads = [threading.Thread(target=add, args=(writer,)) for writer in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    raced = store.lead_samples("lab")[LeadKind.LAUNCH]
    for n in range(SAMPLES_KEPT + 10):
        store.add_lead_sample("lab", LeadKind.START, float(n))
    key = {k: {"S": v} for k, v in lead_time_key("lab").items()}
    item = dynamodb.get_item(TableName=store.table_name, Key=key)

    assert sorted(raced) == sorted(float(w * 100 + n) for w in range(6) for n in range(5))
    samples = store.lead_samples("lab")
    assert samples[LeadKind.START] == [float(n) for n in range(10, SAMPLES_KEPT + 10)]
    assert item_size(item["Item"]) < 1024
    lead = lead_time.lead_time("lab", default_context())
    assert (lead.samples_launch, lead.samples_start, lead.source) == (30, SAMPLES_KEPT, "measured")
    assert lead.start_seconds == 57.0  # nearest-rank p95 of 10..59


@pytest.mark.usefixtures("lab_image")
def test_given_the_sample_write_failing_then_the_worker_still_runs_and_the_loss_is_counted(
    store: FleetStore, table_name: str
) -> None:
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", pool=None, actor="test")

    def sample_write(operation: str, params: dict[str, Any]) -> bool:
        return bool(params.get("Item", {}).get("SK", {}).get("S") == "LEADTIME")

    refused = faults.Fault("dynamodb", "AccessDeniedException", frozenset({"PutItem"}), when=sample_write)
    with faults.FaultPlan(seed=32, faults=[refused]).installed():
        launched = reconcile_fleet(default_context())
        ran = reconcile_fleet(default_context(), now=utcnow() + timedelta(seconds=5))

    assert launched.counters["provisioned_count"] == 1
    assert refused.injected == 1
    assert ran.counters["lead_time_samples_lost"] == 1
    assert ran.counters["reconcile_errors"] == 0
    assert store.get_worker(worker.id).status == S.RUNNING
    assert store.lead_samples("lab")[LeadKind.LAUNCH] == []
