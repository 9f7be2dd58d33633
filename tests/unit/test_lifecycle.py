"""The worker lifecycle table and the EC2 state mapping."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetkeeper.domain.errors import IllegalTransition
from fleetkeeper.domain.lifecycle import (
    WORKER_TRANSITIONS,
    Cause,
    InstanceState,
    PoolStatus,
    WorkerStatus,
    can_transition,
    check_instance_transition,
    check_pool_transition,
    check_transition,
    worker_status_for_ec2_state,
)

S = WorkerStatus


def reachable(start: WorkerStatus, causes: set[Cause]) -> set[WorkerStatus]:
    seen = {start}
    queue = deque([start])
    while queue:
        current = queue.popleft()
        for target, allowed in WORKER_TRANSITIONS[current].items():
            if allowed & causes and target not in seen:
                seen.add(target)
                queue.append(target)
    return seen


def test_given_the_table_then_every_status_has_a_row():
    assert set(WORKER_TRANSITIONS) == set(WorkerStatus)


@pytest.mark.parametrize("status", [s for s in WorkerStatus if s is not S.TERMINATED])
def test_given_any_live_status_then_fleetkeeper_alone_can_reach_terminated(status):
    # No worker is ever stuck: with EC2 confirming what fleetkeeper did, every status leads to TERMINATED.
    assert S.TERMINATED in reachable(status, {Cause.CONTROL, Cause.EC2})


@pytest.mark.parametrize(
    ("current", "target"),
    [
        # seed 000
        (S.RUNNING, S.DRAINING),
        (S.DRAINING, S.RUNNING),
        (S.DRAINING, S.STOPPING),
        (S.STOPPING, S.STOPPED),
        # seed 003
        (S.PENDING, S.PROVISIONING),
        (S.PENDING, S.FAILED),
        (S.PROVISIONING, S.STARTING),
        (S.STARTING, S.RUNNING),
        (S.RUNNING, S.STOPPING),
        (S.RUNNING, S.TERMINATING),
        (S.STOPPED, S.STARTING),
        (S.STOPPED, S.TERMINATING),
        (S.TERMINATING, S.TERMINATED),
        (S.FAILED, S.TERMINATING),
        # the additions
        (S.DRAINING, S.TERMINATING),
    ],
)
def test_given_a_seed_move_when_fleetkeeper_takes_it_then_it_is_legal(current, target):
    assert can_transition(current, target, Cause.CONTROL)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (S.RUNNING, S.TERMINATED),
        (S.DRAINING, S.TERMINATED),
        (S.TERMINATED, S.RUNNING),
        (S.RUNNING, S.STOPPED),
    ],
)
def test_given_a_move_only_ec2_can_witness_when_fleetkeeper_tries_it_then_it_is_refused(current, target):
    assert not can_transition(current, target, Cause.CONTROL)
    assert can_transition(current, target, Cause.EC2)


def test_given_an_illegal_move_then_the_error_names_both_statuses():
    with pytest.raises(IllegalTransition) as raised:
        check_transition(S.STOPPED, S.DRAINING)
    assert "STOPPED" in str(raised.value)
    assert "DRAINING" in str(raised.value)
    assert raised.value.details()["current_status"] == "STOPPED"
    assert raised.value.details()["target_status"] == "DRAINING"


def test_given_terminated_then_only_ec2_evidence_resurrects_it():
    assert all(causes == {Cause.EC2} for causes in WORKER_TRANSITIONS[S.TERMINATED].values())


@pytest.mark.parametrize(
    ("ec2_state", "status"),
    [
        ("pending", S.PROVISIONING),
        ("running", S.RUNNING),
        ("stopping", S.STOPPING),
        ("stopped", S.STOPPED),
        ("shutting-down", S.TERMINATING),
        ("terminated", S.TERMINATED),
        ("rebooting", S.UNKNOWN),
        (None, S.UNKNOWN),
    ],
)
def test_given_an_ec2_state_then_it_maps_to_the_seed_003_status(ec2_state, status):
    assert worker_status_for_ec2_state(ec2_state) is status


@given(st.sampled_from(list(WorkerStatus)), st.sampled_from(list(WorkerStatus)), st.sampled_from(list(Cause)))
def test_given_any_pair_then_check_and_can_agree(current, target, cause):
    if can_transition(current, target, cause):
        check_transition(current, target, cause)
    else:
        with pytest.raises(IllegalTransition):
            check_transition(current, target, cause)


def test_given_an_ended_instance_then_it_cannot_come_back():
    for ended in (InstanceState.COMPLETED, InstanceState.FAILED, InstanceState.TERMINATED):
        with pytest.raises(IllegalTransition):
            check_instance_transition(ended, InstanceState.RUNNING)


def test_given_a_failed_instance_on_a_draining_worker_then_a_retry_is_a_legal_move():
    check_instance_transition(InstanceState.RUNNING, InstanceState.INSTANTIATING)


def test_given_an_inactive_pool_then_it_cannot_start_draining():
    with pytest.raises(IllegalTransition, match="inactive"):
        check_pool_transition(PoolStatus.INACTIVE, PoolStatus.DRAINING)
    check_pool_transition(PoolStatus.DRAINING, PoolStatus.ACTIVE)
