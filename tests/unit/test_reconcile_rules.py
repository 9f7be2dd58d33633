"""Seed 003's per-status reconcile rules, the EC2 drift table, backoff and event staleness."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainRecord, DrainThen, Worker
from fleetkeeper.domain.reconcile import (
    Ec2Call,
    Observation,
    Outcome,
    backoff_seconds,
    decide,
    drain_is_finished,
    follow_ec2,
    is_due,
    is_stale_evidence,
)

S = WorkerStatus
NOW = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)
TIMEOUT = timedelta(minutes=15)


def worker(status: WorkerStatus, **changes: object) -> Worker:
    base = Worker(
        id="w-1",
        template="lab",
        region="us-east-1",
        capacity=4,
        status=status,
        ec2_instance_id="i-1",
        updated_at=NOW - timedelta(minutes=1),
    )
    return base.model_copy(update=changes)


def seen(state: str | None, *, ip: str | None = "10.0.0.1", launched: datetime | None = None) -> Observation:
    return Observation(state=state, private_ip=ip, launch_time=launched or NOW, observed_at=NOW)


def step_for(w: Worker, obs: Observation | None):
    return decide(w, obs, NOW, provisioning_timeout=TIMEOUT)


@pytest.mark.parametrize(
    ("attempts", "seconds"), [(0, 1), (1, 2), (2, 4), (3, 8), (5, 32), (6, 60), (7, 60), (50, 60)]
)
def test_given_n_failed_attempts_then_backoff_is_one_second_doubling_capped_at_60(attempts, seconds):
    assert backoff_seconds(attempts) == seconds


def test_given_a_backoff_in_the_future_then_the_worker_is_not_due():
    assert not is_due(worker(S.RUNNING, next_reconcile_at=NOW + timedelta(seconds=5)), NOW)
    assert is_due(worker(S.RUNNING, next_reconcile_at=NOW), NOW)
    assert is_due(worker(S.RUNNING), NOW)


def test_given_pending_then_the_step_is_a_launch():
    step = step_for(worker(S.PENDING, ec2_instance_id=None), None)
    assert (step.call, step.target, step.counter) == (Ec2Call.LAUNCH, None, "provisioned_count")


def test_given_pending_and_desired_terminated_then_it_is_terminated_without_a_launch():
    step = step_for(worker(S.PENDING, ec2_instance_id=None, desired_status=S.TERMINATED), None)
    assert (step.target, step.call) == (S.TERMINATED, None)


@pytest.mark.parametrize(
    "launched",
    [
        {"launch_claimed_at": NOW - timedelta(minutes=6)},
        {"reconcile_attempts": 1},
    ],
)
def test_given_pending_desired_terminated_after_a_launch_was_claimed_then_its_machine_is_sought_first(
    launched: dict[str, Any],
):
    step = step_for(worker(S.PENDING, ec2_instance_id=None, desired_status=S.TERMINATED, **launched), None)
    assert (step.target, step.call) == (S.TERMINATED, Ec2Call.RETIRE_LAUNCHED)


def test_given_pending_desired_terminated_while_a_launch_is_in_flight_then_it_waits_for_the_launch():
    claimed = worker(
        S.PENDING,
        ec2_instance_id=None,
        desired_status=S.TERMINATED,
        launch_claimed_at=NOW - timedelta(minutes=1),
    )
    step = step_for(claimed, None)
    assert (step.outcome, step.target, step.call) == (Outcome.SKIP, None, None)


def test_given_provisioning_without_an_instance_id_then_it_fails():
    step = step_for(worker(S.PROVISIONING, ec2_instance_id=None), None)
    assert step.target == S.FAILED


def test_given_provisioning_and_ec2_running_with_an_ip_then_running_with_the_ip():
    step = step_for(worker(S.PROVISIONING), seen("running"))
    assert step.target == S.RUNNING
    assert step.changes["private_ip"] == "10.0.0.1"
    assert step.counter == "started_count"


def test_given_provisioning_and_ec2_running_without_an_ip_then_starting():
    step = step_for(worker(S.PROVISIONING), seen("running", ip=None))
    assert (step.target, step.outcome) == (S.STARTING, Outcome.REQUEUE)


def test_given_starting_and_still_no_ip_then_requeue_without_a_write():
    step = step_for(worker(S.STARTING), seen("running", ip=None))
    assert (step.target, step.outcome) == (None, Outcome.REQUEUE)


def test_given_provisioning_and_ec2_pending_within_the_timeout_then_requeue():
    step = step_for(worker(S.PROVISIONING), seen("pending", launched=NOW - timedelta(minutes=5)))
    assert (step.target, step.outcome) == (None, Outcome.REQUEUE)


def test_given_provisioning_and_ec2_pending_beyond_the_timeout_then_failed():
    step = step_for(worker(S.PROVISIONING), seen("pending", launched=NOW - timedelta(minutes=16)))
    assert step.target == S.FAILED
    assert "timeout" in step.reason


def test_given_provisioning_and_instance_not_visible_for_too_long_then_failed():
    w = worker(S.PROVISIONING, updated_at=NOW - timedelta(hours=1))
    assert step_for(w, Observation(state=None)).target == S.FAILED


@pytest.mark.parametrize(
    ("desired", "target", "call"),
    [(S.STOPPED, S.STOPPING, Ec2Call.STOP), (S.TERMINATED, S.TERMINATING, Ec2Call.TERMINATE)],
)
def test_given_running_with_a_desired_status_then_it_moves_and_calls_ec2(desired, target, call):
    step = step_for(worker(S.RUNNING, desired_status=desired), seen("running"))
    assert (step.target, step.call, step.cause) == (target, call, Cause.CONTROL)


def test_given_running_and_ec2_running_then_steady_with_nothing_to_write():
    step = step_for(worker(S.RUNNING), seen("running"))
    assert (step.outcome, step.target, step.call) == (Outcome.SUCCESS, None, None)


# Seed 003's EC2-to-worker mapping, applied as drift to a RUNNING worker.
@pytest.mark.parametrize(
    ("ec2_state", "expected"),
    [
        ("pending", S.PROVISIONING),
        ("running", None),
        ("stopping", S.STOPPING),
        ("stopped", S.STOPPED),
        ("shutting-down", S.TERMINATING),
        ("terminated", S.TERMINATED),
        ("rebooting-weirdly", S.UNKNOWN),
    ],
)
def test_given_running_and_ec2_reports_a_state_then_the_drift_table_applies(ec2_state, expected):
    step = step_for(worker(S.RUNNING), seen(ec2_state))
    assert step.target == expected
    if expected is not None:
        assert step.cause == Cause.EC2
        assert step.drift
        assert step.changes["ec2_state"] == ec2_state


def test_given_running_and_ec2_does_not_know_the_instance_then_unknown_for_gc_to_confirm():
    step = step_for(worker(S.RUNNING), Observation(state=None, observed_at=NOW))
    assert (step.target, step.cause) == (S.UNKNOWN, Cause.EC2)


def drain_record(**overrides: Any) -> DrainRecord:
    """A drain started now with a one-hour deadline; tests override what they are about."""
    fields: dict[str, Any] = {
        "generation": 1,
        "started_at": NOW,
        "deadline": NOW + timedelta(hours=1),
        "timeout_seconds": 3600,
        "requested_by": "op",
    }
    return DrainRecord(**{**fields, **overrides})


def test_given_draining_with_a_running_workflow_then_the_reconciler_keeps_out():
    drain = drain_record(execution_arn="arn:exec")
    step = step_for(worker(S.DRAINING, drain=drain, active_instances=2), seen("running"))
    assert (step.outcome, step.target, step.call) == (Outcome.SKIP, None, None)


@pytest.mark.parametrize(
    ("then", "target", "call"),
    [(DrainThen.STOP, S.STOPPING, Ec2Call.STOP), (DrainThen.TERMINATE, S.TERMINATING, Ec2Call.TERMINATE)],
)
def test_given_draining_with_a_finished_drain_then_it_moves_on_per_then(then, target, call):
    drain = drain_record(then=then, execution_arn="arn:exec", outcome=DrainOutcome.SUCCESS)
    step = step_for(worker(S.DRAINING, drain=drain), seen("running"))
    assert (step.target, step.call) == (target, call)


def test_given_draining_without_execution_and_instances_before_deadline_then_it_waits():
    drain = drain_record()
    busy = worker(S.DRAINING, drain=drain, active_instances=1)
    assert not drain_is_finished(busy, NOW)
    assert drain_is_finished(busy, NOW + timedelta(hours=2))
    assert drain_is_finished(busy.model_copy(update={"active_instances": 0}), NOW)


@pytest.mark.parametrize(
    ("ec2_state", "target", "call", "outcome"),
    [
        ("stopped", S.STOPPED, None, Outcome.SUCCESS),
        ("running", None, Ec2Call.STOP, Outcome.REQUEUE),
        ("stopping", None, None, Outcome.REQUEUE),
        ("terminated", S.TERMINATED, None, Outcome.SUCCESS),
        (None, S.STOPPED, None, Outcome.SUCCESS),
    ],
)
def test_given_stopping_then_seed_003_section_6_applies(ec2_state, target, call, outcome):
    step = step_for(worker(S.STOPPING), seen(ec2_state))
    assert (step.target, step.call, step.outcome) == (target, call, outcome)


@pytest.mark.parametrize(
    ("ec2_state", "target", "call", "outcome"),
    [
        ("terminated", S.TERMINATED, None, Outcome.SUCCESS),
        ("shutting-down", None, None, Outcome.REQUEUE),
        ("running", None, Ec2Call.TERMINATE, Outcome.REQUEUE),
        ("stopped", None, Ec2Call.TERMINATE, Outcome.REQUEUE),
        (None, S.TERMINATED, None, Outcome.SUCCESS),
    ],
)
def test_given_terminating_then_seed_003_section_7_applies(ec2_state, target, call, outcome):
    step = step_for(worker(S.TERMINATING), seen(ec2_state))
    assert (step.target, step.call, step.outcome) == (target, call, outcome)


def test_given_stopped_and_desired_running_then_starting_and_start_called():
    step = step_for(worker(S.STOPPED, desired_status=S.RUNNING), seen("stopped"))
    assert (step.target, step.call) == (S.STARTING, Ec2Call.START)


def test_given_stopped_and_started_outside_fleetkeeper_then_running():
    step = step_for(worker(S.STOPPED), seen("running"))
    assert (step.target, step.cause) == (S.RUNNING, Cause.EC2)


def test_given_failed_with_a_live_instance_then_cleanup_terminates_it():
    step = step_for(worker(S.FAILED), seen("running"))
    assert (step.target, step.call) == (S.TERMINATING, Ec2Call.TERMINATE)


def test_given_failed_without_an_instance_then_terminated():
    step = step_for(worker(S.FAILED, ec2_instance_id=None), None)
    assert step.target == S.TERMINATED


def test_given_unknown_and_ec2_knows_nothing_then_left_to_discovery():
    step = step_for(worker(S.UNKNOWN), Observation(state=None))
    assert (step.outcome, step.target) == (Outcome.SKIP, None)


def test_given_a_draining_worker_and_ec2_running_then_no_drift():
    assert follow_ec2(worker(S.DRAINING), seen("running")) is None


def test_given_an_event_older_than_the_evidence_applied_then_it_is_stale():
    w = worker(S.STOPPED, ec2_state="stopped", ec2_observed_at=NOW)
    assert is_stale_evidence(w, "stopping", NOW - timedelta(seconds=1))
    assert is_stale_evidence(w, "stopping", NOW)
    assert not is_stale_evidence(w, "pending", NOW + timedelta(seconds=1))


def test_given_a_terminated_instance_then_no_later_event_is_believed():
    w = worker(S.TERMINATED, ec2_state="terminated", ec2_observed_at=NOW)
    assert is_stale_evidence(w, "running", NOW + timedelta(hours=1))


def test_given_an_observation_with_microseconds_then_an_event_of_the_same_second_is_ordered_by_state():
    w = worker(S.RUNNING, ec2_state="running", ec2_observed_at=NOW + timedelta(milliseconds=400))
    assert not is_stale_evidence(w, "terminated", NOW)
    assert is_stale_evidence(w, "pending", NOW)


@pytest.mark.parametrize(
    ("desired", "then"), [(S.STOPPED, DrainThen.STOP), (S.TERMINATED, DrainThen.TERMINATE)]
)
def test_given_a_busy_running_worker_with_a_desired_status_then_it_is_drained_first(desired, then):
    step = step_for(worker(S.RUNNING, desired_status=desired, active_instances=2), seen("running"))
    assert (step.drain_then, step.target, step.call) == (then, None, None)


def test_given_a_failed_drain_with_instances_still_running_then_the_reconciler_does_not_stop_it():
    failed = drain_record(outcome=DrainOutcome.ERROR)
    step = step_for(worker(S.DRAINING, drain=failed, active_instances=2), seen("running"))
    assert (step.outcome, step.target, step.call) == (Outcome.SKIP, None, None)


@pytest.mark.parametrize(
    ("retired_by", "revived"), [("discovery-gc", True), ("reconciler", False), ("api", False)]
)
def test_given_a_terminated_worker_when_its_machine_runs_then_only_a_gc_retirement_is_undone(
    retired_by: str, revived: bool
):
    retired = worker(S.TERMINATED, terminated_by=retired_by)

    step = follow_ec2(retired, seen("running"))

    assert (step is not None and step.target == S.RUNNING) is revived
