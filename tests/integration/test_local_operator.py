"""The local control plane's operator aids: the console lines, the workload simulator, the restart."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, utcnow
from fleetkeeper.services import drains, instances, placement
from fleetkeeper.services.context import default_context
from fleetkeeper_local.console import FleetConsole
from fleetkeeper_local.controlplane import ApiServer
from fleetkeeper_local.restart import has_fleet, reconcile_after_restart
from fleetkeeper_local.stack import LocalStack, LocalStackError
from fleetkeeper_local.workload import WorkloadSettings, WorkloadSimulator
from tests.integration.conftest import eventually

pytestmark = pytest.mark.integration


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_given_a_baseline_when_a_worker_moves_then_the_console_prints_one_line_naming_it(
    store, running_worker
):
    worker = running_worker(pool="labs")
    lines: list[str] = []
    console = FleetConsole(store, printer=lines.append)
    console.poll_once()
    assert lines == []

    store.transition_worker(worker, WorkerStatus.STOPPING, cause=Cause.CONTROL, actor="test", reason="retire")
    console.poll_once()
    console.poll_once()

    assert len(lines) == 1
    assert f"worker {worker.id} (lab/labs) RUNNING -> STOPPING: retire" in lines[0]


def test_given_a_drain_that_ends_then_the_console_says_how(control_plane, store, running_worker):
    worker = running_worker()
    # A session running on it holds the drain open, so the cancel below finds it still DRAINING.
    placed = placement.place_instance(store, actor="test", worker_id=worker.id)
    instances.change_instance_state(control_plane.ctx, placed.id, InstanceState.RUNNING, actor="test")
    lines: list[str] = []
    console = FleetConsole(store, printer=lines.append)
    console.poll_once()

    drains.start_worker_drain(control_plane.ctx, worker.id, actor="alice", reason="patch")
    console.poll_once()
    drains.cancel_worker_drain(control_plane.ctx, worker.id, actor="bob")
    console.poll_once()

    assert any(f"drain of {worker.id} started by alice (patch)" in line for line in lines)
    assert any(f"drain of {worker.id} ended CANCELLED by bob" in line for line in lines)


def test_given_a_drain_that_starts_and_ends_between_two_looks_then_the_console_tells_each_step_in_order(
    store, running_worker
):
    worker = running_worker(pool="labs")
    lines: list[str] = []
    console = FleetConsole(store, printer=lines.append)
    console.poll_once()
    now = utcnow()
    record = DrainRecord(
        generation=1,
        started_at=now,
        deadline=now + timedelta(minutes=30),
        timeout_seconds=1800,
        requested_by="alice",
        reason="patch",
    )
    draining = store.transition_worker(
        store.get_worker(worker.id),
        WorkerStatus.DRAINING,
        cause=Cause.CONTROL,
        actor="alice",
        reason="patch",
        changes={"drain": record},
    )
    done = record.model_copy(update={"outcome": DrainOutcome.SUCCESS, "finished_at": utcnow()})
    store.transition_worker(
        draining,
        WorkerStatus.STOPPING,
        cause=Cause.CONTROL,
        actor="drain-workflow",
        reason="drain success",
        changes={"drain": done},
    )

    console.poll_once()

    said = [line.split("  ", 1)[1] for line in lines]
    assert said == [
        f"drain of {worker.id} started by alice (patch), deadline {record.deadline:%H:%M:%S}",
        f"worker {worker.id} (lab/labs) RUNNING -> DRAINING: patch",
        f"worker {worker.id} (lab/labs) DRAINING -> STOPPING: drain success",
        f"drain of {worker.id} ended SUCCESS; 0 instance(s) forced",
    ]


def test_given_a_drain_that_moves_scheduled_work_then_the_console_says_how_many(store, running_worker):
    source, target = running_worker(), running_worker()
    instance = placement.place_instance(store, actor="test", worker_id=source.id)
    lines: list[str] = []
    console = FleetConsole(store, printer=lines.append)
    now = utcnow()
    record = DrainRecord(generation=1, started_at=now, deadline=now, timeout_seconds=60, requested_by="alice")
    store.transition_worker(
        store.get_worker(source.id),
        WorkerStatus.DRAINING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"drain": record},
    )
    console.poll_once()

    store.move_instance(instance, target, actor="test", drain_generation=1)
    console.poll_once()
    console.poll_once()

    moves = [line for line in lines if "moved" in line]
    assert len(moves) == 1
    assert f"drain of {source.id} moved 1 scheduled instance(s) to other workers" in moves[0]


def test_given_a_drain_whose_deadline_moves_and_that_is_forced_then_the_console_says_when_and_by_whom(
    control_plane, store, ec2_worker
):
    worker = ec2_worker()
    placed = placement.place_instance(store, actor="test", worker_id=worker.id)
    instances.change_instance_state(control_plane.ctx, placed.id, InstanceState.RUNNING, actor="test")
    started = drains.start_worker_drain(control_plane.ctx, worker.id, actor="alice", timeout_seconds=3600)
    lines: list[str] = []
    console = FleetConsole(store, printer=lines.append)
    console.poll_once()

    moved = drains.move_worker_drain_deadline(
        control_plane.ctx, worker.id, timeout_seconds=7200, actor="carol", reason="exam runs late"
    )
    console.poll_once()
    drains.force_worker_drain(control_plane.ctx, worker.id, actor="dave", reason="cve fix")

    def forced() -> bool:
        console.poll_once()
        return any("forced by" in line for line in lines)

    eventually(forced, 60)

    said = [line.split("  ", 1)[1] for line in lines]
    assert said[0] == (
        f"drain of {worker.id} deadline moved {started.deadline:%H:%M:%S} -> {moved.deadline:%H:%M:%S} "
        "by carol (exam runs late)"
    )
    assert f"drain of {worker.id} forced by dave (cve fix): 1 instance(s) forced ({placed.id})" in said


def test_given_the_workload_when_time_passes_then_it_places_and_completes_instances(
    control_plane, running_worker
):
    worker = running_worker(capacity=2)
    clock = FakeClock()
    simulator = WorkloadSimulator(
        default_context,
        WorkloadSettings(placements_per_minute=60, min_seconds=5, max_seconds=10, seed=1),
        clock=clock,
    )

    simulator.step()
    assert simulator.counts.placed == 1
    assert control_plane.ctx.store.get_worker(worker.id).active_instances == 1
    clock.now = 11
    simulator.step()

    assert simulator.counts.completed == 1
    instances = control_plane.ctx.store.list_instances(worker_id=worker.id).items
    assert InstanceState.COMPLETED in {i.state for i in instances}


def test_given_instances_it_did_not_place_then_the_workload_ends_them_too(control_plane, running_worker):
    worker = running_worker()
    placed = placement.place_instance(control_plane.ctx.store, actor="someone", worker_id=worker.id)
    clock = FakeClock()
    simulator = WorkloadSimulator(
        default_context,
        WorkloadSettings(placements_per_minute=0.001, min_seconds=1, max_seconds=2, seed=1),
        clock=clock,
    )
    clock.now = 100  # past the first placement's schedule: only adoption matters
    simulator.step()
    clock.now = 103
    simulator.step()

    assert control_plane.ctx.store.get_instance(placed.id).state == InstanceState.COMPLETED


def test_given_a_kept_fleet_when_moto_restarts_empty_then_machines_are_recreated_and_the_drain_resumes(
    control_plane_factory, local_stack, ec2_worker, store
):
    plane = control_plane_factory()
    worker = ec2_worker(pool="labs")
    placement.place_instance(store, actor="test", worker_id=worker.id)
    drains.start_worker_drain(plane.ctx, worker.id, actor="alice", reason="patch", timeout_seconds=3600)
    drains.start_pool_drain(plane.ctx, "labs", actor="alice", timeout_seconds=600)
    before = store.get_worker(worker.id).drain
    pool_before = store.get_pool("labs")
    assert has_fleet(store)

    local_stack.reset_moto()  # what a restart does to the emulated EC2 and Step Functions
    plane = control_plane_factory()
    ec2: Any = boto3.client("ec2")
    lines: list[str] = []
    reconcile_after_restart(plane.ctx, ec2, lines.append)

    after = store.get_worker(worker.id)
    assert after.ec2_instance_id not in (None, worker.ec2_instance_id)
    described = ec2.describe_instances(InstanceIds=[after.ec2_instance_id])["Reservations"][0]["Instances"][0]
    assert described["State"]["Name"] in ("pending", "running")
    assert after.status == WorkerStatus.DRAINING
    assert before is not None
    assert after.drain is not None
    # The same drain goes on: its generation, deadline, reason and requester, in a new execution.
    assert (after.drain.generation, after.drain.deadline, after.drain.reason, after.drain.requested_by) == (
        before.generation,
        before.deadline,
        "patch",
        "alice",
    )
    assert plane.execution(str(after.drain.execution_arn))["status"] == "RUNNING"
    actions = [e.action for e in store.audit_trail("worker", worker.id)]
    assert "WorkerMachineRecreated" in actions
    # The resumed execution runs on its own and may already have audited its first step, so the trail is
    # read for what the restart wrote rather than for its last line.
    assert actions.count("WorkerDrainResumed") == 1
    assert actions.index("WorkerDrainResumed") > actions.index("WorkerMachineRecreated")
    assert actions.count("WorkerDrainStarted") == 1
    assert "WorkerDrainCancelled" not in actions
    pool = store.get_pool("labs")
    assert (pool.drain_generation, pool.drain_started_at) == (
        pool_before.drain_generation,
        pool_before.drain_started_at,
    )
    assert plane.execution(str(pool.drain_execution_arn))["status"] == "RUNNING"
    pool_actions = [e.action for e in store.audit_trail("pool", "labs")]
    assert pool_actions.count("PoolDrainResumed") == 1
    assert pool_actions.count("PoolDrainStarted") == 1
    assert "PoolDrainCancelled" not in pool_actions
    assert lines[-1] == "restart: 1 machine(s) re-created, 2 drain(s) resumed"


def test_given_an_empty_table_then_there_is_no_fleet_to_keep(store):
    assert not has_fleet(store)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield int(other.getsockname()[1])


def test_given_the_api_port_taken_after_the_pre_check_then_the_bind_says_so_as_the_pre_check_does(taken_port):
    with pytest.raises(LocalStackError) as taken:
        ApiServer(port=taken_port, instances=1).start()

    assert str(taken.value) == (
        f"port {taken_port} for the admin API is already taken; "
        "stop what uses it or set FLEETKEEPER_API_PORT to another port"
    )


def test_given_the_moto_port_taken_after_the_pre_check_then_the_start_fails_at_once_with_the_message(
    taken_port,
):
    stack = LocalStack(moto_port=taken_port)
    failures: list[BaseException] = []

    def start() -> None:
        try:
            stack._start_moto()
        except BaseException as exc:
            failures.append(exc)

    starting = threading.Thread(target=start, daemon=True)
    starting.start()
    starting.join(15)

    assert not starting.is_alive(), "the moto server's start waits forever for a port it never got"
    assert [str(f) for f in failures] == [
        f"port {taken_port} for the moto server is already taken; "
        "stop what uses it or set FLEETKEEPER_MOTO_PORT to another port"
    ]
