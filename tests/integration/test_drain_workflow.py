"""Worker drains on the local stack, executing the real ASL file on moto's Step Functions."""

from __future__ import annotations

import itertools
import json
import uuid
from datetime import UTC, datetime, timedelta

import boto3
import pytest

from fleetkeeper.domain.drain_policy import MAX_RECHECKS_PER_DRAIN
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.services import drains
from tests.integration.conftest import eventually
from tests.integration.functions import sweep_waiting_drains

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# History events of one heartbeat re-check cycle (AwaitEmpty timing out, Recheck, CheckProgress, the
# next AwaitEmpty), as docs/drains.md counts them.
EVENTS_PER_RECHECK_CYCLE = 13


def place(plane, worker_id, **body):
    status, instance = plane.api("POST", "/api/v1/instances", {"worker_id": worker_id, **body})
    assert status == 201, instance
    return instance


def test_given_running_instances_when_the_last_one_completes_then_the_worker_stops(
    control_plane, ec2_worker, ec2
):
    worker = ec2_worker()
    first, second = place(control_plane, worker.id), place(control_plane, worker.id)

    status, drain = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {"reason": "maintenance"})
    assert status == 202, drain
    assert drain["status"] == "RUNNING"
    assert drain["worker_status"] == "DRAINING"
    assert drain["active_instances"] == 2
    store = control_plane.ctx.store
    eventually(
        lambda: (store.get_worker(worker.id).drain or {}) and store.get_worker(worker.id).drain.task_token
    )

    control_plane.api("POST", f"/api/v1/instances/{first['id']}/state", {"state": "COMPLETED"})
    assert store.get_worker(worker.id).status is WorkerStatus.DRAINING
    control_plane.api("POST", f"/api/v1/instances/{second['id']}/state", {"state": "COMPLETED"})

    execution = control_plane.wait_for_execution(drain["execution_arn"])
    assert execution["status"] == "SUCCEEDED"
    final = store.get_worker(worker.id)
    assert final.status is WorkerStatus.STOPPING
    _, status_body = control_plane.api("GET", f"/api/v1/workers/{worker.id}/drain")
    assert status_body["status"] == "SUCCESS"
    assert status_body["finished_at"] is not None
    state = ec2.describe_instances(InstanceIds=[worker.ec2_instance_id])["Reservations"][0]["Instances"][0][
        "State"
    ]
    assert state["Name"] in ("stopping", "stopped")
    assert control_plane.states_entered(drain["execution_arn"]) == [
        "Route",
        "Begin",
        "CheckProgress",
        "AwaitEmpty",
        "Finish",
        "Drained",
    ]


def test_given_an_empty_worker_when_drained_then_it_stops_at_once(control_plane, ec2_worker):
    worker = ec2_worker()
    status, drain = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {"then": "terminate"})
    assert status == 202
    assert control_plane.wait_for_execution(drain["execution_arn"], timeout=15)["status"] == "SUCCEEDED"
    assert control_plane.ctx.store.get_worker(worker.id).status is WorkerStatus.TERMINATING


def test_given_a_stuck_instance_when_the_deadline_passes_then_it_is_forced(control_plane, ec2_worker):
    worker = ec2_worker()
    stuck = place(control_plane, worker.id)
    drain = short_drain(control_plane, worker.id, 2)
    assert drain["timeout_seconds"] == 2
    execution = control_plane.wait_for_execution(drain["execution_arn"], timeout=20)
    assert execution["status"] == "SUCCEEDED"
    store = control_plane.ctx.store
    instance = store.get_instance(stuck["id"])
    assert instance.state is InstanceState.TERMINATED
    assert instance.reason == "drain_timeout"
    _, body = control_plane.api("GET", f"/api/v1/workers/{worker.id}/drain")
    assert body["status"] == "TIMED_OUT"
    assert body["forced_instances"] == 1
    assert store.get_worker(worker.id).status is WorkerStatus.STOPPING
    assert "Force" in control_plane.states_entered(drain["execution_arn"])


def drain(plane, worker_id, **body):
    status, payload = plane.api("POST", f"/api/v1/workers/{worker_id}/drain", body)
    assert status == 202, payload
    return payload


def short_drain(plane, worker_id, seconds):
    """A drain with a deadline seconds away. The API refuses timeouts under a minute (a typo, not a policy),
    so the workflow's deadline handling is driven through the service the API calls. Its work stays on
    the worker (no rescheduling): these drains are about what happens at the deadline."""
    status = drains.start_worker_drain(
        plane.ctx, worker_id, actor="test", timeout_seconds=seconds, reschedule=False
    )
    return status.model_dump(mode="json")


def token_stored(plane, worker_id):
    return lambda: (
        (plane.ctx.store.get_worker(worker_id).drain or None)
        and plane.ctx.store.get_worker(worker_id).drain.task_token
    )


def test_given_a_waiting_drain_when_an_admin_cancels_then_the_worker_runs_again(control_plane, ec2_worker):
    worker = ec2_worker()
    place(control_plane, worker.id)
    started = drain(control_plane, worker.id)
    eventually(token_stored(control_plane, worker.id))

    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/cancel-drain", caller="arn:aws:iam::123456789012:user/alice"
    )
    assert status == 200
    assert body["status"] == "RUNNING"
    assert control_plane.wait_for_execution(started["execution_arn"])["status"] == "SUCCEEDED"
    assert control_plane.states_entered(started["execution_arn"])[-1] == "Cancelled"
    _, drain_status = control_plane.api("GET", f"/api/v1/workers/{worker.id}/drain")
    assert drain_status["status"] == "CANCELLED"
    assert drain_status["cancelled_by"] == "arn:aws:iam::123456789012:user/alice"
    # Back in service: placements land again.
    assert place(control_plane, worker.id)["worker_id"] == worker.id


def test_given_a_cancel_before_the_token_is_stored_then_the_cancel_still_wins(control_plane, ec2_worker):
    worker = ec2_worker()
    place(control_plane, worker.id)
    fn = control_plane.resources.drain_function_arn.split(":")[-1]
    # await-empty crashes once, so the cancel lands while no token is stored; its retry then finds the
    # drain cancelled and fails its own token.
    control_plane.dispatcher.inject_failure(fn, step="await_empty", times=1)
    started = drain(control_plane, worker.id)
    eventually(lambda: (fn, "await_empty") in control_plane.dispatcher.invocations)
    assert control_plane.ctx.store.get_worker(worker.id).drain.task_token is None

    status, _ = control_plane.api("POST", f"/api/v1/workers/{worker.id}/cancel-drain")
    assert status == 200
    assert control_plane.wait_for_execution(started["execution_arn"])["status"] == "SUCCEEDED"
    assert control_plane.states_entered(started["execution_arn"])[-1] == "Cancelled"
    final = control_plane.ctx.store.get_worker(worker.id)
    assert final.status is WorkerStatus.RUNNING
    assert final.drain.outcome.value == "CANCELLED"


def test_given_a_draining_worker_then_a_second_drain_is_409(control_plane, ec2_worker):
    worker = ec2_worker()
    place(control_plane, worker.id)
    drain(control_plane, worker.id)
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {})
    assert status == 409
    assert body["message"] == "Drain already in progress"
    assert body["error"] == "DRAIN_IN_PROGRESS"


def test_given_a_worker_that_is_not_running_then_drain_is_409_naming_its_status(
    control_plane, store, running_worker
):
    worker = running_worker()
    store.transition_worker(
        store.get_worker(worker.id), WorkerStatus.STOPPING, cause=Cause.CONTROL, actor="t"
    )
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/drain", {})
    assert status == 409
    assert body["details"]["current_status"] == "STOPPING"
    assert "STOPPING" in body["message"]
    status, body = control_plane.api("POST", "/api/v1/workers/w-nope/drain", {})
    assert status == 404
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/cancel-drain")
    assert status == 409


def test_given_a_draining_worker_then_no_placement_lands_on_it(control_plane, ec2_worker):
    worker = ec2_worker(template="solo")
    place(control_plane, worker.id)
    drain(control_plane, worker.id)
    status, body = control_plane.api("POST", "/api/v1/instances", {"worker_id": worker.id})
    assert status == 409
    assert "DRAINING" in body["message"]
    status, body = control_plane.api("POST", "/api/v1/instances", {"template": "solo"})
    assert (status, body["error"]) == (409, "NO_CAPACITY")
    assert "no RUNNING worker" in body["message"]
    assert control_plane.ctx.store.get_worker(worker.id).active_instances == 1


def test_given_a_dry_run_then_nothing_starts(control_plane, ec2_worker):
    worker = ec2_worker()
    place(control_plane, worker.id, timeslot_end="2099-01-01T00:00:00Z")
    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/drain", {"dry_run": True, "timeout_seconds": 600}
    )
    assert status == 200
    assert body["dry_run"] is True
    assert body["may_start"] is True
    assert body["active_instances"] == 1
    assert body["estimated_completion"] == body["deadline"]
    assert control_plane.ctx.store.get_worker(worker.id).status is WorkerStatus.RUNNING


def test_given_failures_on_a_draining_worker_then_retried_three_times_then_terminated(
    control_plane, ec2_worker
):
    worker = ec2_worker()
    instance = place(control_plane, worker.id)
    drain(control_plane, worker.id)
    eventually(token_stored(control_plane, worker.id))
    path = f"/api/v1/instances/{instance['id']}/state"
    for attempt in (1, 2, 3):
        status, body = control_plane.api("POST", path, {"state": "FAILED", "reason": "boot error"})
        assert status == 200
        assert (body["state"], body["retry_count"]) == ("INSTANTIATING", attempt)
    status, body = control_plane.api("POST", path, {"state": "FAILED"})
    assert (body["state"], body["reason"]) == ("TERMINATED", "max_retries_exceeded")
    # The worker is now empty, so its drain completes.
    eventually(lambda: control_plane.ctx.store.get_worker(worker.id).status is WorkerStatus.STOPPING)


def test_given_a_failure_when_the_worker_left_draining_then_terminated_worker_stopped(
    control_plane, ec2_worker, store
):
    worker = ec2_worker()
    instance = place(control_plane, worker.id)
    store.transition_worker(
        store.get_worker(worker.id), WorkerStatus.STOPPING, cause=Cause.CONTROL, actor="t"
    )
    _, body = control_plane.api("POST", f"/api/v1/instances/{instance['id']}/state", {"state": "FAILED"})
    assert (body["state"], body["reason"]) == ("TERMINATED", "worker_stopped_during_retry")
    other = ec2_worker()
    plain = place(control_plane, other.id)
    _, body = control_plane.api("POST", f"/api/v1/instances/{plain['id']}/state", {"state": "FAILED"})
    assert body["state"] == "FAILED"


def test_given_a_task_lambda_crash_mid_drain_then_retry_recovers(control_plane, ec2_worker):
    worker = ec2_worker()
    fn = control_plane.resources.drain_function_arn.split(":")[-1]
    control_plane.dispatcher.inject_failure(fn, step="finish", times=2)
    started = drain(control_plane, worker.id)
    assert control_plane.wait_for_execution(started["execution_arn"], timeout=30)["status"] == "SUCCEEDED"
    assert control_plane.ctx.store.get_worker(worker.id).status is WorkerStatus.STOPPING
    assert [s for f, s in control_plane.dispatcher.invocations if f == fn].count("finish") == 3


def test_given_a_lost_signal_then_the_heartbeat_recheck_completes_the_drain(
    control_plane_factory, ec2_worker
):
    plane = control_plane_factory(heartbeat_seconds=2)
    worker = ec2_worker()
    instance = place(plane, worker.id)
    # Ten minutes: short enough that the heartbeat is not stretched (long drains re-check less often, see
    # recheck_heartbeat), long enough that only the heartbeat, not the deadline, can end the wait in time.
    started = drain(plane, worker.id, timeout_seconds=600)
    eventually(token_stored(plane, worker.id))
    # End the instance behind the service's back: nobody sends the token.
    store = plane.ctx.store
    store.end_instance(store.get_instance(instance["id"]), InstanceState.COMPLETED, actor="test")
    assert plane.wait_for_execution(started["execution_arn"], timeout=30)["status"] == "SUCCEEDED"
    timeouts = [
        e["taskTimedOutEventDetails"]["error"]
        for e in boto3.client("stepfunctions").get_execution_history(executionArn=started["execution_arn"])[
            "events"
        ]
        if "taskTimedOutEventDetails" in e
    ]
    # One timed-out wait, minutes before the deadline: the heartbeat's. (moto names it States.Timeout where
    # AWS says States.HeartbeatTimeout; the state machine routes both to the re-check.)
    assert len(timeouts) == 1
    entered = plane.states_entered(started["execution_arn"])
    assert "Recheck" in entered
    assert "Force" not in entered
    assert store.get_worker(worker.id).status is WorkerStatus.STOPPING
    assert store.get_worker(worker.id).drain.outcome.value == "SUCCESS"


def test_given_a_lost_signal_then_the_sweep_completes_the_drain(control_plane, ec2_worker):
    worker = ec2_worker()
    instance = place(control_plane, worker.id)
    started = drain(control_plane, worker.id)
    eventually(token_stored(control_plane, worker.id))
    store = control_plane.ctx.store
    store.end_instance(store.get_instance(instance["id"]), InstanceState.COMPLETED, actor="test")
    swept = sweep_waiting_drains(control_plane.ctx)
    assert (swept["completed"], swept["heartbeats"]) == (1, 0)
    assert control_plane.wait_for_execution(started["execution_arn"])["status"] == "SUCCEEDED"
    assert "Recheck" not in control_plane.states_entered(started["execution_arn"])


def test_given_a_step_that_keeps_failing_then_the_drain_ends_in_error_not_silence(control_plane, ec2_worker):
    worker = ec2_worker()
    fn = control_plane.resources.drain_function_arn.split(":")[-1]
    control_plane.dispatcher.inject_failure(fn, step="finish", times=10)
    started = drain(control_plane, worker.id)
    execution = control_plane.wait_for_execution(started["execution_arn"], timeout=60)
    assert execution["status"] == "FAILED"
    _, body = control_plane.api("GET", f"/api/v1/workers/{worker.id}/drain")
    assert body["status"] == "ERROR"
    assert "InjectedFault" in body["error"]
    # Not stuck: the admin can cancel the failed drain, and the worker is back in service.
    status, after = control_plane.api("POST", f"/api/v1/workers/{worker.id}/cancel-drain")
    assert (status, after["status"]) == (200, "RUNNING")


@pytest.fixture
def alert_feed(control_plane):
    """Messages published to the operators' SNS topic, via an SQS subscription."""
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=f"alerts-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    boto3.client("sns").subscribe(
        TopicArn=control_plane.resources.topic_arn, Protocol="sqs", Endpoint=queue_arn
    )
    return lambda: [
        json.loads(m["Body"])
        for m in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
    ]


def test_given_drains_then_every_transition_is_on_the_audit_bus(
    control_plane, ec2_worker, audit_feed, alert_feed
):
    cancelled, forced = ec2_worker(), ec2_worker()
    place(control_plane, cancelled.id)
    stuck = place(control_plane, forced.id)
    # Neither instance may move to the other worker: this drain is about waiting, then cancelling.
    drain(control_plane, cancelled.id, reschedule=False)
    eventually(token_stored(control_plane, cancelled.id))
    control_plane.api("POST", f"/api/v1/workers/{cancelled.id}/cancel-drain")
    timed_out = short_drain(control_plane, forced.id, 2)
    control_plane.wait_for_execution(timed_out["execution_arn"], timeout=20)

    seen = audit_feed()
    for detail_type in (
        "WorkerDrainStarted",
        "WorkerDrainCancelled",
        "WorkerDrainTimedOut",
        "InstanceForceTerminated",
        "WorkerDrainCompleted",
    ):
        assert detail_type in seen, (detail_type, seen)
    alerts = alert_feed()
    assert len(alerts) == 1
    assert forced.id in alerts[0]["Subject"]
    assert stuck["id"] in alerts[0]["Message"]
    trail = [e.action for e in control_plane.ctx.store.audit_trail("worker", forced.id)]
    assert {"WorkerDrainStarted", "WorkerDrainTimedOut", "WorkerDrainCompleted"} <= set(trail)


def test_given_rechecks_without_a_sweep_then_each_cycle_costs_a_fixed_number_of_history_events(
    control_plane_factory, ec2_worker
):
    """The history bound of docs/drains.md: events per heartbeat re-check cycle, measured on the ASL."""
    plane = control_plane_factory(heartbeat_seconds=1)
    worker = ec2_worker()
    place(plane, worker.id)
    started = short_drain(plane, worker.id, 6)
    assert plane.wait_for_execution(started["execution_arn"], timeout=40)["status"] == "SUCCEEDED"
    events = boto3.client("stepfunctions").get_execution_history(
        executionArn=started["execution_arn"], maxResults=1000
    )["events"]
    rechecks = [
        i for i, e in enumerate(events) if e.get("stateEnteredEventDetails", {}).get("name") == "Recheck"
    ]
    assert len(rechecks) >= 2
    per_cycle = {b - a for a, b in itertools.pairwise(rechecks)}
    assert len(per_cycle) == 1
    (cycle,) = per_cycle
    assert cycle <= EVENTS_PER_RECHECK_CYCLE, [e["type"] for e in events[rechecks[0] : rechecks[1]]]
    outside_cycles = len(events) - cycle * len(rechecks)
    # The longest drain re-checks at most MAX_RECHECKS_PER_DRAIN times, even with no sweep at all.
    worst = outside_cycles + cycle * MAX_RECHECKS_PER_DRAIN
    assert worst < 25_000 // 2


# ---- rescheduling: a drain moves what has not started yet (docs/drains.md, "Rescheduling") ------------


def later_timeslot() -> dict[str, str]:
    """A timeslot an hour away: a drain that waited for it would still be running when the test ends."""
    start = datetime.now(UTC) + timedelta(hours=1)
    return {
        "timeslot_start": start.isoformat(),
        "timeslot_end": (start + timedelta(hours=2)).isoformat(),
    }


def test_given_only_scheduled_work_when_drained_then_it_moves_and_the_drain_completes_at_once(
    control_plane, ec2_worker, running_worker
):
    source, target = ec2_worker(pool="labs"), running_worker(pool="labs")
    first, second = (place(control_plane, source.id, **later_timeslot()) for _ in range(2))

    started = drain(control_plane, source.id)

    assert control_plane.wait_for_execution(started["execution_arn"], timeout=15)["status"] == "SUCCEEDED"
    assert control_plane.states_entered(started["execution_arn"]) == [
        "Route",
        "Begin",
        "CheckProgress",
        "Finish",
        "Drained",
    ]
    store = control_plane.ctx.store
    assert {store.get_instance(i["id"]).worker_id for i in (first, second)} == {target.id}
    assert [store.get_worker(w.id).active_instances for w in (source, target)] == [0, 2]
    assert store.get_worker(source.id).status is WorkerStatus.STOPPING
    _, status = control_plane.api("GET", f"/api/v1/workers/{source.id}/drain")
    assert (status["status"], status["reschedule"]) == ("SUCCESS", True)
    assert (status["moved_instances"], status["left_instances"]) == (2, 0)


def test_given_reschedule_false_when_drained_then_scheduled_work_stays_and_the_drain_waits(
    control_plane, running_worker
):
    source, target = running_worker(pool="labs"), running_worker(pool="labs")
    instance = place(control_plane, source.id, **later_timeslot())

    drain(control_plane, source.id, reschedule=False)
    eventually(token_stored(control_plane, source.id))

    store = control_plane.ctx.store
    assert store.get_instance(instance["id"]).worker_id == source.id
    assert [store.get_worker(w.id).active_instances for w in (source, target)] == [1, 0]
    _, status = control_plane.api("GET", f"/api/v1/workers/{source.id}/drain")
    assert (status["status"], status["reschedule"]) == ("RUNNING", False)
    assert (status["moved_instances"], status["left_instances"]) == (0, 1)


def test_given_a_dry_run_then_it_reports_what_would_move_and_what_would_stay(control_plane, running_worker):
    source, target = running_worker(pool="labs"), running_worker(pool="labs", capacity=2)
    place(control_plane, target.id)  # one free slot left in the pool
    scheduled = [place(control_plane, source.id) for _ in range(2)]
    started = place(control_plane, source.id)
    status, _ = control_plane.api("POST", f"/api/v1/instances/{started['id']}/state", {"state": "RUNNING"})
    assert status == 200

    answers = [
        control_plane.api("POST", f"/api/v1/workers/{source.id}/drain", {"dry_run": True, **body})
        for body in ({}, {"reschedule": False})
    ]

    assert [code for code, _ in answers] == [200, 200]
    assert [(p["moved_instances"], p["left_instances"]) for _, p in answers] == [(1, 2), (0, 3)]
    store = control_plane.ctx.store
    assert store.get_worker(source.id).drain is None
    assert {store.get_instance(i["id"]).worker_id for i in scheduled} == {source.id}
