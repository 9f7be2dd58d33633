"""EC2 events as EventBridge really delivers them: twice, out of order, late, and sometimes malformed.

Whatever the delivery, every worker ends in the status its machine is in, a malformed event is dropped
with a count (returned, never raised, so never retried), and no late event moves a worker backwards.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper_local import faults
from fleetkeeper_local.event_shapes import spot_warning_event, state_change_event
from fleetkeeper_local.invocation import invoke
from fleetkeeper_local.scheduler import Ec2EventPump
from tests.integration.conftest import ControlPlane, WorkerFactory
from tests.integration.emf import metric_totals
from tests.integration.faults.support import ec2_state, reconcile

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.usefixtures("fresh_process")]

S = WorkerStatus
REGION = "us-east-1"


class Recorder:
    """Delivers each event to the ec2_events handler and keeps what it answered (or raised)."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.raised: list[BaseException] = []
        self.log: list[tuple[Any, Any, Any]] = []

    def __call__(self, event: dict[str, Any]) -> Any:
        try:
            result = invoke("ec2_events", event)
        except Exception as exc:  # a raise is what EventBridge would retry: the test fails on it below
            self.raised.append(exc)
            raise
        self.outcomes[str(result["outcome"])] += 1
        self.log.append((event.get("detail"), event.get("time"), result))
        return result


def test_given_a_duplicated_reordered_late_and_corrupted_stream_then_every_worker_ends_as_its_machine(
    ec2_worker: WorkerFactory, ec2: Any, store: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    workers = [ec2_worker() for _ in range(6)]
    ids = [w.ec2_instance_id or "" for w in workers]
    stream = faults.EventStreamFaults(
        seed=31, duplicate=0.5, reorder=0.7, late=0.4, malformed=0.5, late_batches=2
    )
    recorder = Recorder()
    pump = Ec2EventPump(ec2, region=REGION, deliver=recorder, faults=stream, interval_seconds=3600)
    pump.poll_once()  # the baseline

    ec2.stop_instances(InstanceIds=ids[0:3])
    ec2.terminate_instances(InstanceIds=ids[3:5])
    pump.poll_once()
    time.sleep(1.1)  # events carry whole seconds: the restart must be visibly newer than the stop
    ec2.start_instances(InstanceIds=ids[0:1])
    pump.poll_once()
    for _ in range(3):
        pump.poll_once()  # nothing new happens; held-back events come out late
    pump.deliver(stream.flush())

    expected = [S.RUNNING, S.STOPPED, S.STOPPED, S.TERMINATED, S.TERMINATED, S.RUNNING]
    assert [store.get_worker(w.id).status for w in workers] == expected, [
        entry for entry in recorder.log if ids[0] in str(entry[0])
    ]
    assert recorder.raised == []
    assert stream.counts["malformed"] > 0
    assert stream.counts["duplicated"] > 0
    assert stream.counts["late"] > 0
    # Every malformed copy was dropped with a count, and nothing else was.
    assert recorder.outcomes["dropped"] == stream.counts["malformed"]
    assert metric_totals(capsys.readouterr().out)["Ec2Events.events_dropped"] == stream.counts["malformed"]

    # The reconciler agrees with what the events did: nothing left to correct, no machine touched.
    report = reconcile()
    assert [store.get_worker(w.id).status for w in workers] == expected
    assert report["counters"].get("drift_corrections", 0) == 0
    assert [ec2_state(ec2, i) for i in ids] == [
        "running",
        "stopped",
        "stopped",
        "terminated",
        "terminated",
        "running",
    ]


def test_given_a_late_stopping_event_after_an_ignored_running_event_then_the_healthy_worker_keeps_running(
    ec2_worker: WorkerFactory, ec2: Any, store: Any
) -> None:
    """The machine was stopped and started again; the `running` event overtook the `stopping` one."""
    worker = ec2_worker()
    instance_id = worker.ec2_instance_id or ""
    now = utcnow()
    recorder = Recorder()

    recorder(state_change_event(instance_id, "running", region=REGION, at=now))
    late = recorder(
        state_change_event(instance_id, "stopping", region=REGION, at=now - timedelta(seconds=20))
    )
    reconcile()

    assert late["outcome"] == "stale"
    assert store.get_worker(worker.id).status is S.RUNNING
    assert ec2_state(ec2, instance_id) == "running"  # the reconciler did not stop a healthy machine


def test_given_a_spot_warning_delivered_twice_then_one_drain_runs(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, store: Any
) -> None:
    worker = ec2_worker()
    warning = spot_warning_event(worker.ec2_instance_id or "", region=REGION)
    recorder = Recorder()

    first, second = recorder(warning), recorder(dict(warning))

    assert (first["outcome"], second["outcome"]) == ("drain_started", "unchanged")
    record = store.get_worker(worker.id).drain
    assert record is not None
    assert record.generation == 1
    assert record.execution_arn is not None
    assert control_plane.wait_for_execution(record.execution_arn, timeout=30)["status"] == "SUCCEEDED"
    assert store.get_worker(worker.id).status is S.TERMINATING
