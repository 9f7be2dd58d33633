"""EC2 events through the ec2_events handler: state changes, duplicates, reordering, spot warnings."""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.cloud.clients import client
from fleetkeeper.cloud.ec2 import Ec2Gateway
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainRecord, DrainThen, Instance, Worker, utcnow
from fleetkeeper.services import drains, workers
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from fleetkeeper_local.controlplane import refresh_process_caches
from fleetkeeper_local.invocation import invoke
from tests.integration.conftest import ControlPlane
from tests.integration.emf import metric_totals
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import ec2_state, ensure_template, launch

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("handler_context")]

S = WorkerStatus
EVENTS = Path(__file__).resolve().parents[3] / "events"


def sample(name: str, instance_id: str, *, at: datetime | None = None) -> dict[str, Any]:
    event: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text())
    event = copy.deepcopy(event)
    event["detail"]["instance-id"] = instance_id
    event["resources"] = [f"arn:aws:ec2:us-east-1:123456789012:instance/{instance_id}"]
    event["time"] = (at or utcnow()).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return event


def deliver(event: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = invoke("ec2_events", event)
    return result


def state_event(worker: Worker, state: str, *, at: datetime | None = None) -> dict[str, Any]:
    return sample(f"ec2_state_change_{state.replace('-', '_')}", worker.ec2_instance_id or "", at=at)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ("stopping", S.STOPPING),
        ("stopped", S.STOPPED),
        ("shutting-down", S.TERMINATING),
        ("terminated", S.TERMINATED),
    ],
)
def test_given_a_running_worker_when_ec2_reports_a_state_then_the_worker_follows_at_once(
    store, live_worker, state, expected
):
    worker = live_worker()

    result = deliver(state_event(worker, state))

    assert result["outcome"] == "applied"
    assert store.get_worker(worker.id).status == expected


def test_given_a_worker_terminated_in_the_console_then_it_is_terminated_and_its_instances_lost(
    store, live_worker
):
    worker = live_worker()
    placed = store.place_instance(Instance(id="i-console", worker_id=""), worker, actor="test")

    deliver(state_event(worker, "terminated"))

    gone = store.get_worker(worker.id)
    assert (gone.status, gone.terminated_by) == (S.TERMINATED, "ec2-events")
    assert store.get_instance(placed.id).state == InstanceState.TERMINATED


def test_given_a_stopped_worker_when_ec2_reports_running_then_it_runs_with_its_ip(store, ec2, live_worker):
    worker = live_worker()
    worker = store.transition_worker(worker, S.STOPPED, cause=Cause.EC2, actor="test")

    deliver(state_event(worker, "running"))

    running = store.get_worker(worker.id)
    assert running.status == S.RUNNING
    assert running.private_ip


def test_given_the_same_event_twice_then_the_second_changes_nothing(store, live_worker):
    worker = live_worker()
    event = state_event(worker, "stopped")
    deliver(event)
    after_first = store.get_worker(worker.id)

    result = deliver(event)

    assert result["outcome"] == "stale"
    assert store.get_worker(worker.id).version == after_first.version


def test_given_events_out_of_order_then_an_older_one_never_moves_the_worker_back(store, live_worker):
    worker = live_worker()
    now = utcnow()
    deliver(state_event(worker, "stopped", at=now))

    late = deliver(state_event(worker, "stopping", at=now - timedelta(seconds=5)))
    older_running = deliver(state_event(worker, "running", at=now - timedelta(seconds=30)))

    assert (late["outcome"], older_running["outcome"]) == ("stale", "stale")
    assert store.get_worker(worker.id).status == S.STOPPED


def test_given_a_terminated_worker_then_no_later_event_revives_it(store, live_worker):
    worker = live_worker()
    now = utcnow()
    deliver(state_event(worker, "terminated", at=now))

    result = deliver(state_event(worker, "running", at=now + timedelta(minutes=1)))

    assert result["outcome"] == "stale"
    assert store.get_worker(worker.id).status == S.TERMINATED


def test_given_running_reported_for_a_draining_worker_then_it_stays_draining_and_holds_the_evidence(
    store, live_worker
):
    worker = live_worker()
    draining = store.transition_worker(worker, S.DRAINING, cause=Cause.CONTROL, actor="test")

    result = deliver(state_event(worker, "running"))

    assert result["outcome"] == "unchanged"
    held = store.get_worker(worker.id)
    assert (held.status, held.ec2_state) == (S.DRAINING, "running")  # the evidence is held all the same
    assert held.version == draining.version + 1


def test_given_an_instance_no_worker_has_then_the_event_is_dropped_as_foreign(store):
    result = deliver(sample("ec2_state_change_terminated", "i-0fedcba987654321f"))

    assert result["outcome"] == "foreign"


def test_given_a_malformed_event_then_it_is_dropped_not_raised(ctx, capsys):
    event = json.loads((EVENTS / "ec2_malformed.json").read_text())

    result = deliver(event)

    assert result["outcome"] == "dropped"
    assert metric_totals(capsys.readouterr().out)["Ec2Events.events_dropped"] == 1


@pytest.mark.parametrize(
    "event", [{"hello": "world"}, {**json.loads((EVENTS / "scheduler_reconcile.json").read_text())}]
)
def test_given_a_foreign_event_shape_then_it_is_dropped(ctx, event):
    assert deliver(event)["outcome"] == "dropped"


def test_given_a_spot_warning_then_a_drain_with_the_two_minutes_left_is_started(
    store, live_worker, drains_started
):
    worker = live_worker()

    result = deliver(sample("ec2_spot_interruption_warning", worker.ec2_instance_id or ""))

    assert result["outcome"] == "drain_started"
    assert len(drains_started) == 1
    assert drains_started[0]["worker_id"] == worker.id
    assert drains_started[0]["then"] == DrainThen.TERMINATE
    assert 100 <= drains_started[0]["timeout_seconds"] <= 120


def test_given_a_spot_warning_for_a_worker_not_running_then_no_drain(store, live_worker, drains_started):
    worker = live_worker()
    store.transition_worker(worker, S.DRAINING, cause=Cause.CONTROL, actor="test")

    result = deliver(sample("ec2_spot_interruption_warning", worker.ec2_instance_id or ""))

    assert result["outcome"] == "unchanged"
    assert drains_started == []


def test_given_rebalance_drains_off_by_default_then_a_recommendation_changes_nothing(store, live_worker):
    worker = live_worker()

    result = deliver(sample("ec2_rebalance_recommendation", worker.ec2_instance_id or ""))

    assert result["outcome"] == "disabled"
    assert store.get_worker(worker.id).status == S.RUNNING


def test_given_rebalance_drains_on_then_a_recommendation_drains_once_and_repeats_or_late_copies_are_harmless(
    control_plane: ControlPlane, store, live_worker, monkeypatch
):
    monkeypatch.setenv("REBALANCE_DRAIN_ENABLED", "true")
    monkeypatch.setenv("REBALANCE_DRAIN_TIMEOUT_SECONDS", "900")
    refresh_process_caches()
    worker = live_worker()
    store.place_instance(Instance(id="i-rebalance", worker_id=""), worker, actor="test")
    recommendation = sample("ec2_rebalance_recommendation", worker.ec2_instance_id or "")

    first = deliver(recommendation)
    duplicate = deliver(recommendation)
    drains.cancel_worker_drain(control_plane.ctx, worker.id, actor="alice", reason="keep it")
    late_copy = deliver(recommendation)
    stale = deliver(
        sample("ec2_rebalance_recommendation", worker.ec2_instance_id or "", at=utcnow() - timedelta(hours=1))
    )

    assert [r["outcome"] for r in (first, duplicate, late_copy, stale)] == [
        "drain_started",
        "unchanged",
        "unchanged",
        "stale",
    ]
    after = store.get_worker(worker.id)
    assert after.status == S.RUNNING
    assert after.drain is not None
    assert (after.drain.generation, after.drain.timeout_seconds, after.drain.then) == (1, 900, DrainThen.STOP)
    assert after.drain.reason == "EC2 rebalance recommendation"


def denied(*_args: Any, **_kwargs: Any) -> Any:
    raise ClientError({"Error": {"Code": "UnauthorizedOperation", "Message": "denied"}}, "DescribeInstances")


def test_given_running_reported_but_no_address_readable_then_provisioning_waits_in_starting(
    store, live_worker, monkeypatch
):
    worker = live_worker()
    stopped = store.transition_worker(worker, S.STOPPED, cause=Cause.EC2, actor="test")
    provisioning = store.transition_worker(stopped, S.PROVISIONING, cause=Cause.EC2, actor="test")
    monkeypatch.setattr(Ec2Gateway, "describe", denied)

    result = deliver(state_event(provisioning, "running"))

    assert result["outcome"] == "applied"
    assert store.get_worker(worker.id).status == S.STARTING


def test_given_a_worker_stopped_in_the_console_then_its_sessions_end_instead_of_haunting_it(
    store, live_worker
):
    worker = live_worker()
    placed = store.place_instance(Instance(id="i-ghost", worker_id=""), worker, actor="test")

    deliver(state_event(worker, "stopped"))

    stopped = store.get_worker(worker.id)
    assert (stopped.status, stopped.active_instances) == (S.STOPPED, 0)
    ended = store.get_instance(placed.id)
    assert (ended.state, ended.reason) == (InstanceState.TERMINATED, "worker_stopped")


def test_given_a_retirement_cut_short_when_the_event_comes_again_then_it_is_finished(store, live_worker):
    worker = live_worker()
    placed = store.place_instance(Instance(id="i-half", worker_id=""), worker, actor="test")
    # The worker moved, then the function died before ending its instances.
    store.transition_worker(store.get_worker(worker.id), S.TERMINATED, cause=Cause.EC2, actor="ec2-events")

    deliver(state_event(worker, "terminated"))

    assert store.get_worker(worker.id).active_instances == 0
    ended = store.get_instance(placed.id)
    assert (ended.state, ended.reason) == (InstanceState.TERMINATED, "worker_lost")


def test_given_an_ignored_running_event_when_an_older_stopping_arrives_then_it_is_stale(
    ctx, store, ec2, live_worker
):
    worker = live_worker()
    record = DrainRecord(
        generation=1,
        started_at=utcnow(),
        deadline=utcnow() + timedelta(hours=1),
        timeout_seconds=3600,
        requested_by="test",
        execution_arn="arn:aws:states:us-east-1:123456789012:execution:drain:w",
    )
    draining = store.transition_worker(
        worker, S.DRAINING, cause=Cause.CONTROL, actor="test", changes={"drain": record}
    )
    now = utcnow()
    ignored = deliver(state_event(worker, "running", at=now))

    # A `stopping` from before the `running`, delayed by EventBridge retries.
    late = deliver(state_event(worker, "stopping", at=now - timedelta(seconds=20)))
    reconcile_fleet(ctx)

    assert (ignored["outcome"], late["outcome"]) == ("unchanged", "stale")
    held = store.get_worker(worker.id)
    assert held.status == S.DRAINING
    assert held.drain == draining.drain
    assert ec2_state(ec2, worker.ec2_instance_id or "") == "running"


def test_given_the_instance_index_lags_when_a_just_launched_machine_reports_then_its_worker_is_found(
    table_name, ec2, lab_image
):
    plan = faults.FaultPlan(index_lag_seconds=60)
    with plan.installed():
        lagging = FleetStore(client("dynamodb"), table_name)
        ensure_template(lagging)
        worker = workers.create_worker(lagging, template="lab", region="us-east-1", actor="test")
        machine = launch(ec2, worker.id, lab_image)
        lagging.transition_worker(
            worker, S.PROVISIONING, cause=Cause.CONTROL, actor="test", changes={"ec2_instance_id": machine}
        )
        indexed = list(lagging.iter_workers_by_status([S.PROVISIONING]))

        result = deliver(sample("ec2_state_change_running", machine))

    # The indexes do not show the worker yet; the machine's key item, written with it, does.
    assert indexed == []
    assert plan.hidden_by_lag >= 1
    assert result["outcome"] == "applied"
    assert result["worker_id"] == worker.id
    assert lagging.get_worker(worker.id).status in (S.RUNNING, S.STARTING)


def test_given_a_machine_tagged_for_a_worker_that_never_recorded_it_then_the_event_is_foreign(
    store, ec2, lab_image
):
    ensure_template(store)
    pending = workers.create_worker(store, template="lab", region="us-east-1", actor="test")
    machine = launch(ec2, pending.id, lab_image)

    result = deliver(sample("ec2_state_change_running", machine))

    assert result["outcome"] == "foreign"
    assert store.get_worker(pending.id).status == S.PENDING


def test_given_a_worker_retired_on_purpose_when_a_late_running_event_arrives_then_it_stays_retired(
    store, live_worker
):
    worker = live_worker()
    ending = store.transition_worker(worker, S.TERMINATING, cause=Cause.CONTROL, actor="reconciler")
    store.transition_worker(
        ending,
        S.TERMINATED,
        cause=Cause.CONTROL,
        actor="reconciler",
        changes={"terminated_by": "reconciler", "terminated_reason": "desired TERMINATED"},
    )

    result = deliver(state_event(worker, "running"))

    assert result["outcome"] == "not_applicable"
    assert store.get_worker(worker.id).status == S.TERMINATED
