"""The signals that make a worker unhealthy, each through the function that receives it on AWS: an AWS
Health scheduled change through the EC2 events handler (delivered by the local event pump from a
simulated retirement), and discovery's sweep of DescribeInstanceStatus (the emulator answers with the
simulated events and checks)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.repair import HealthSource, HealthStatus
from fleetkeeper_local import health
from fleetkeeper_local.event_shapes import health_event
from fleetkeeper_local.invocation import invoke
from fleetkeeper_local.scheduler import Ec2EventPump
from tests.integration.functions import discover_and_collect
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("handler_context")]


def test_given_a_health_scheduled_change_then_the_worker_is_unhealthy_until_it_closes(
    live_worker: LiveWorkerFactory, store: Any
) -> None:
    worker = live_worker(pool="labs")
    assert worker.ec2_instance_id is not None
    not_before = (utcnow() + timedelta(days=3)).replace(microsecond=0)
    event = health_event(
        worker.ec2_instance_id,
        code="instance-retirement",
        not_before=not_before,
        event_id="e-1",
        region="us-east-1",
    )

    answer = invoke("ec2_events", event)
    again = invoke("ec2_events", event)

    assert answer["outcome"] == "applied", answer
    recorded = store.get_worker(worker.id)
    assert recorded.health is not None
    assert (recorded.health.status, recorded.health.source) == (
        HealthStatus.UNHEALTHY,
        HealthSource.SCHEDULED_EVENT,
    )
    assert recorded.health.event is not None
    assert recorded.health.event.not_before == not_before
    # A redelivery changes nothing: no second write.
    assert again["outcome"] == "applied"
    assert store.get_worker(worker.id).version == recorded.version

    closed = health_event(
        worker.ec2_instance_id,
        code="instance-retirement",
        not_before=not_before,
        event_id="e-1",
        closed=True,
        region="us-east-1",
    )
    invoke("ec2_events", closed)

    healed = store.get_worker(worker.id).health
    assert healed is not None
    assert healed.status == HealthStatus.HEALTHY


def test_given_a_simulated_retirement_then_the_pump_delivers_the_health_event_once(
    live_worker: LiveWorkerFactory, ec2: Any, store: Any
) -> None:
    worker = live_worker(pool="labs")
    assert worker.ec2_instance_id is not None
    delivered: list[dict[str, Any]] = []
    pump = Ec2EventPump(ec2, deliver=delivered.append)
    pump.poll_once()  # baseline

    health.retire(ec2, worker.ec2_instance_id, within=timedelta(hours=2))
    first = pump.poll_once()
    second = pump.poll_once()

    assert [e["detail-type"] for e in first] == ["AWS Health Event"]
    assert second == []
    assert first[0]["detail"]["affectedEntities"] == [{"entityValue": worker.ec2_instance_id}]


def test_given_simulated_signals_then_discovery_records_them_and_their_end(
    live_worker: LiveWorkerFactory, make_ctx: ContextFactory, ec2: Any, store: Any
) -> None:
    impaired, retiring, well = (live_worker(pool="labs") for _ in range(3))
    assert impaired.ec2_instance_id is not None
    assert retiring.ec2_instance_id is not None
    health.impair(ec2, impaired.ec2_instance_id)
    health.retire(ec2, retiring.ec2_instance_id, within=timedelta(hours=2))

    report = discover_and_collect(make_ctx())

    assert report.counters["health_changed"] == 2, report.counters
    sick = store.get_worker(impaired.id).health
    assert sick is not None
    assert (sick.status, sick.source) == (HealthStatus.UNHEALTHY, HealthSource.STATUS_CHECK)
    assert sick.reason == "system status ok, instance status impaired"
    event = store.get_worker(retiring.id).health
    assert event is not None
    assert event.source == HealthSource.SCHEDULED_EVENT
    assert event.event is not None
    assert event.event.code == "instance-retirement"
    assert store.get_worker(well.id).health is None
    # Nothing changed: nothing written.
    assert discover_and_collect(make_ctx()).counters["health_changed"] == 0

    health.recover(ec2, impaired.ec2_instance_id)
    health.recover(ec2, retiring.ec2_instance_id)
    ended = discover_and_collect(make_ctx())

    assert ended.counters["health_changed"] == 2
    for worker in (impaired, retiring):
        found = store.get_worker(worker.id).health
        assert found is not None
        assert found.status == HealthStatus.HEALTHY
