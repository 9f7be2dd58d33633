"""When the drain sweep calls Step Functions for a drain, and in which order (domain/drain_sweep.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fleetkeeper.domain.drain_sweep import (
    DrainMark,
    DueWork,
    describe_due,
    heartbeat_due,
    marked,
    sweep_order,
    waiting_since,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
ARN = "arn:aws:states:us-east-1:123456789012:execution:drain:drain-w1-g1"
HEARTBEAT = timedelta(seconds=300)
TOKEN_1, TOKEN_2 = "task-token-1", "task-token-2"


def test_given_no_mark_then_both_calls_are_due() -> None:
    assert describe_due(None, ARN, T0, timedelta(minutes=5))
    assert heartbeat_due(None, TOKEN_1, T0, HEARTBEAT)


def test_given_a_describe_then_the_next_is_due_after_the_interval_or_for_another_execution() -> None:
    mark = marked(None, "worker", "w1", now=T0, described_arn=ARN)
    interval = timedelta(minutes=5)

    assert not describe_due(mark, ARN, T0 + timedelta(seconds=299), interval)
    assert describe_due(mark, ARN, T0 + timedelta(seconds=300), interval)
    assert describe_due(mark, ARN + "-r1", T0 + timedelta(seconds=1), interval)
    assert describe_due(mark, ARN, T0, timedelta(0))


def test_given_a_heartbeat_then_the_next_is_due_at_half_the_heartbeat_or_for_a_new_task() -> None:
    mark = marked(None, "worker", "w1", now=T0, heartbeat_token=TOKEN_1)

    assert not heartbeat_due(mark, TOKEN_1, T0 + timedelta(seconds=149), HEARTBEAT)
    assert heartbeat_due(mark, TOKEN_1, T0 + timedelta(seconds=150), HEARTBEAT)
    assert heartbeat_due(mark, TOKEN_2, T0 + timedelta(seconds=1), HEARTBEAT)


def test_given_a_mark_then_a_new_call_keeps_the_other_calls_time() -> None:
    described = marked(None, "worker", "w1", now=T0, described_arn=ARN)
    both = marked(described, "worker", "w1", now=T0 + timedelta(seconds=90), heartbeat_token=TOKEN_1)

    assert both == DrainMark(
        kind="worker",
        key="w1",
        execution_arn=ARN,
        described_at=T0,
        token_digest=both.token_digest,
        heartbeat_at=T0 + timedelta(seconds=90),
    )
    assert both.token_digest is not None
    assert TOKEN_1 not in both.token_digest


def test_given_due_drains_then_lost_signals_go_first_then_the_longest_waiting() -> None:
    mark_old = marked(None, "worker", "old", now=T0, described_arn=ARN)
    mark_new = marked(None, "worker", "new", now=T0 + timedelta(minutes=3), described_arn=ARN)
    work = [
        DueWork(
            "worker",
            "new",
            describe=True,
            waiting_since=waiting_since(mark_new, heartbeat=False, describe=True),
        ),
        DueWork(
            "worker",
            "never",
            describe=True,
            waiting_since=waiting_since(None, heartbeat=False, describe=True),
        ),
        DueWork(
            "worker",
            "old",
            describe=True,
            waiting_since=waiting_since(mark_old, heartbeat=False, describe=True),
        ),
        DueWork("worker", "empty", complete=True, waiting_since=T0 + timedelta(hours=1)),
    ]

    assert [w.key for w in sweep_order(work)] == ["empty", "never", "old", "new"]
