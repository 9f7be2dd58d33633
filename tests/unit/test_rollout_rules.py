"""Rollouts, the pure part: the request's validation, the wave plan, and the status transitions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.rollouts import (
    ACTIVE,
    FINISHED,
    MAX_ID_LENGTH,
    MAX_RESTORATION_ATTEMPTS,
    MAX_ROLLBACK_ALARMS,
    MAX_ROLLOUT_WORKERS,
    MAX_WAIT_SECONDS,
    MAX_WAVE_WORKERS,
    ROLLBACK_FROM,
    Blocked,
    RollbackAction,
    Rollout,
    RolloutRequest,
    RolloutStatus,
    RolloutStrategy,
    WorkerPhase,
    WorkerProgress,
    can_move,
    check_move,
    checkpoint_reached,
    percent_done,
    plan_waves,
    replacement_id,
    resolve_max_unavailable,
    restoration_id,
    rollback_action,
    rollback_scope,
    wave_bounds,
    wave_count,
)
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.item_size import ITEM_BUDGET_BYTES, item_size
from fleetkeeper.store.rollouts import MEMBER_PAGE_SIZE, RolloutStore, member_page_item


def test_given_only_a_template_then_the_defaults_apply():
    request = RolloutRequest.model_validate({"template": "lab-small"})

    assert request.max_unavailable == "10%"
    assert request.strategy == RolloutStrategy.SURGE
    assert (request.checkpoints, request.bake_seconds, request.replace, request.dry_run) == (
        [],
        0,
        True,
        False,
    )
    assert request.checkpoint_delay_seconds is None


BAD_FIELDS: list[tuple[dict[str, Any], str]] = [
    ({"max_unavailable": 0}, "max_unavailable"),
    ({"max_unavailable": MAX_WAVE_WORKERS + 1}, "max_unavailable"),
    ({"max_unavailable": "0%"}, "max_unavailable"),
    ({"max_unavailable": "101%"}, "max_unavailable"),
    ({"max_unavailable": "ten"}, "max_unavailable"),
    ({"max_unavailable": True}, "max_unavailable"),
    ({"strategy": "big_bang"}, "strategy"),
    ({"checkpoints": [0]}, "checkpoints.0"),
    ({"checkpoints": [100]}, "checkpoints.0"),
    ({"checkpoints": [50, 25]}, "checkpoints"),
    ({"checkpoints": [50, 50]}, "checkpoints"),
    ({"bake_seconds": -1}, "bake_seconds"),
    ({"bake_seconds": MAX_WAIT_SECONDS + 1}, "bake_seconds"),
    ({"checkpoint_delay_seconds": MAX_WAIT_SECONDS + 1}, "checkpoint_delay_seconds"),
    ({"drain_timeout_seconds": 5}, "drain_timeout_seconds"),
    ({"worker_ids": ["w-1", "w-1"]}, "worker_ids"),
    ({"worker_ids": []}, "worker_ids"),
    ({"worker_ids": [f"w-{n}" for n in range(MAX_ROLLOUT_WORKERS + 1)]}, "worker_ids"),
    ({"reason": "x" * 501}, "reason"),
    ({"replace": "yes"}, "replace"),
    ({"template": "lab small"}, "template"),
    ({"nodes": 3}, "nodes"),
]


@pytest.mark.parametrize(("fields", "field"), BAD_FIELDS)
def test_given_a_bad_field_then_validation_names_it(fields, field):
    with pytest.raises(ValidationError) as raised:
        RolloutRequest.model_validate({"template": "lab-small", **fields})

    assert {".".join(str(p) for p in e["loc"]) for e in raised.value.errors()} == {field}


def test_given_a_percentage_then_it_resolves_against_the_scope_rounded_down_at_least_one():
    assert resolve_max_unavailable("25%", 10) == 2
    assert resolve_max_unavailable("10%", 5) == 1
    assert resolve_max_unavailable("100%", 7) == 7
    assert resolve_max_unavailable("50%", 0) == 1
    assert resolve_max_unavailable(3, 2) == 3
    assert resolve_max_unavailable("100%", MAX_ROLLOUT_WORKERS) == MAX_WAVE_WORKERS


def test_given_workers_in_any_order_then_the_plan_is_sorted_and_stable():
    waves = plan_waves(["w-5", "w-1", "w-4", "w-2", "w-3"], 2)

    assert waves == [["w-1", "w-2"], ["w-3", "w-4"], ["w-5"]]
    assert plan_waves(["w-3", "w-2", "w-1"], 5) == [["w-1", "w-2", "w-3"]]
    assert plan_waves([], 2) == []


@given(
    workers=st.sets(st.text(alphabet="abcdef0123456789-", min_size=1, max_size=8), max_size=60),
    spec=st.one_of(st.integers(min_value=1, max_value=70), st.integers(1, 100).map(lambda p: f"{p}%")),
)
def test_property_the_waves_partition_the_workers_and_none_exceeds_max_unavailable(workers, spec):
    limit = resolve_max_unavailable(spec, len(workers))

    waves = plan_waves(list(workers), limit)

    flat = [w for wave in waves for w in wave]
    assert sorted(flat) == sorted(workers)
    assert len(flat) == len(set(flat))
    assert all(1 <= len(wave) <= limit for wave in waves)
    assert flat == sorted(flat)


def test_given_the_transition_table_then_pause_resume_and_cancel_move_only_from_their_statuses():
    running, paused = RolloutStatus.RUNNING, RolloutStatus.PAUSED
    assert [s for s in RolloutStatus if can_move(s, paused)] == [running]
    assert [s for s in RolloutStatus if can_move(s, running)] == [paused]
    assert {s for s in RolloutStatus if can_move(s, RolloutStatus.CANCELLED)} == {
        running,
        paused,
        RolloutStatus.ROLLING_BACK,
    }
    # A finished rollout can only be rolled back (a rolled back one not even that).
    assert all(not can_move(s, t) for s in FINISHED for t in RolloutStatus if t != RolloutStatus.ROLLING_BACK)
    assert {running, paused, *FINISHED} - {RolloutStatus.ROLLED_BACK} == ROLLBACK_FROM
    assert {s for s in RolloutStatus if can_move(RolloutStatus.ROLLING_BACK, s)} == {
        RolloutStatus.ROLLED_BACK,
        RolloutStatus.FAILED,
        RolloutStatus.CANCELLED,  # nothing else lets an operator stop a rollback that cannot go on
    }
    assert ACTIVE.isdisjoint(FINISHED)
    assert set(RolloutStatus) == ACTIVE | FINISHED


def test_given_an_illegal_move_then_the_conflict_names_the_current_status():
    with pytest.raises(Conflict) as raised:
        check_move("ro-1", RolloutStatus.SUCCEEDED, RolloutStatus.PAUSED)

    assert raised.value.current_status == "SUCCEEDED"
    assert "SUCCEEDED" in raised.value.message


def test_given_progress_then_the_checkpoint_reached_is_the_highest_not_yet_passed():
    assert percent_done(2, 6) == 33
    assert percent_done(0, 0) == 100
    assert checkpoint_reached([50], [], 2, 6) is None
    assert checkpoint_reached([50], [], 3, 6) == 50
    assert checkpoint_reached([25, 50], [], 4, 6) == 50
    assert checkpoint_reached([50], [50], 4, 6) is None


def _longest_id(n: int) -> str:
    return f"w-{n:062x}"  # MAX_ID_LENGTH characters: the longest id a request may name


def test_given_the_largest_rollout_then_its_item_stays_inside_the_item_budget():
    now = datetime(2026, 11, 27, tzinfo=UTC)
    ids = [_longest_id(n) for n in range(MAX_ROLLOUT_WORKERS)]
    assert len(ids[0]) == MAX_ID_LENGTH
    rollout = Rollout(
        id="ro-0123456789abcdef",
        template="lab-small",
        pool="labs",
        total=len(ids),
        member_page_size=MEMBER_PAGE_SIZE,
        # 500-wide waves, the first in full progress, each with a replacement: the most the item holds.
        max_unavailable=MAX_WAVE_WORKERS,
        max_unavailable_requested="100%",
        strategy=RolloutStrategy.SURGE,
        checkpoints=list(range(1, 100)),
        reason="r" * 500,
        started_by="arn:aws:iam::123456789012:role/" + "o" * 64,
        created_at=now,
        updated_at=now,
        wave=MAX_ROLLOUT_WORKERS // MAX_WAVE_WORKERS - 1,
        replaced=MAX_ROLLOUT_WORKERS - MAX_WAVE_WORKERS,
        progress={
            w: WorkerProgress(phase=WorkerPhase.REPLACED_PENDING, replacement_id=f"w-{n:016x}", since=now)
            for n, w in enumerate(ids[:MAX_WAVE_WORKERS])
        },
        rollback_on_alarms=[f"{n}" + "a" * 254 for n in range(MAX_ROLLBACK_ALARMS)],
        rollback_through_wave=MAX_ROLLOUT_WORKERS // MAX_WAVE_WORKERS - 1,
        rollback_reason="b" * 500,
        rollback_started_by="arn:aws:iam::123456789012:role/" + "o" * 64,
        rollback_started_at=now,
        blocked=Blocked(reason="capacity", detail="d" * 200, since=now),
    )
    store = RolloutStore(cast(Any, None), "fleetkeeper")

    item = serialize(store._item(rollout))

    assert rollout.total == 10_000
    assert rollout.wave_count == 20
    assert item_size(item) <= ITEM_BUDGET_BYTES
    # The progress of the wave is what the item holds: a rollback's in full instead weighs the same.
    rollback = rollout.model_copy(update={"rollback_progress": rollout.progress, "progress": {}})
    assert item_size(serialize(store._item(rollback))) <= ITEM_BUDGET_BYTES


def test_given_the_largest_scope_then_each_member_page_stays_inside_the_item_budget():
    ids = sorted(_longest_id(n) for n in range(MEMBER_PAGE_SIZE))

    item = serialize(member_page_item("ro-0123456789abcdef", MAX_ROLLOUT_WORKERS // MEMBER_PAGE_SIZE, ids))

    assert item_size(item) <= ITEM_BUDGET_BYTES // 2
    # Every page of the largest scope, the rollout and its audit are one transaction (100 items, 4 MB).
    assert MAX_ROLLOUT_WORKERS // MEMBER_PAGE_SIZE + 2 <= 100
    assert (MAX_ROLLOUT_WORKERS // MEMBER_PAGE_SIZE) * item_size(item) + 2 * ITEM_BUDGET_BYTES < 4_000_000


@pytest.mark.parametrize(("total", "width"), [(1, 1), (7, 3), (10, 5), (23, 4), (10_000, 500), (9_999, 333)])
def test_given_a_scope_then_each_wave_is_its_slice_and_the_rollback_recuts_the_same_waves(total, width):
    ids = [f"w-{n:05d}" for n in range(total)]
    waves = plan_waves(ids, width)

    assert wave_count(total, width) == len(waves)
    assert [ids[slice(*wave_bounds(total, width, k))] for k in range(len(waves))] == waves
    for through in range(min(len(waves), 6)):
        assert plan_waves(rollback_scope(ids, width, through), width) == waves[: through + 1]


def test_given_a_rollback_then_its_scope_is_the_waves_the_rollout_reached():
    ids = [f"w-{i}" for i in range(7)]

    assert rollback_scope(ids, 3, 0) == ids[:3]
    assert rollback_scope(list(reversed(ids)), 3, 1) == ids[:6]
    assert rollback_scope(ids, 3, 5) == ids  # past the last wave: every worker


@pytest.mark.parametrize(
    ("drained", "serving", "elsewhere", "action"),
    [
        (True, True, False, RollbackAction.RESTORE),
        # its replacement failed to launch, was never made, or lost its machine: the old one comes back
        (True, False, False, RollbackAction.RESTORE),
        # its replacement was drained by an operator or its expiry: whatever took its place stays
        (True, False, True, RollbackAction.NOTHING),
        (False, True, False, RollbackAction.DRAIN),  # surge stopped before the drain: the old worker stays
        (False, False, False, RollbackAction.NOTHING),
        (False, False, True, RollbackAction.NOTHING),
    ],
)
def test_given_a_worker_of_a_rollback_then_its_action_depends_on_whether_the_rollout_drained_it(
    drained, serving, elsewhere, action
):
    assert (
        rollback_action(
            old_drained_by_rollout=drained, replacement_serving=serving, replacement_taken_elsewhere=elsewhere
        )
        is action
    )


def test_given_a_rollout_and_a_worker_then_the_replacement_and_restoration_ids_are_stable_and_distinct():
    assert replacement_id("ro-1", "w-1") == replacement_id("ro-1", "w-1")
    assert restoration_id("ro-1", "w-1") == restoration_id("ro-1", "w-1")
    assert restoration_id("ro-1", "w-1") != replacement_id("ro-1", "w-1")
    assert restoration_id("ro-1", "w-1") != restoration_id("ro-2", "w-1")
    assert len(restoration_id("ro-1", "w-1")) <= 64
    attempts = {restoration_id("ro-1", "w-1", attempt) for attempt in range(MAX_RESTORATION_ATTEMPTS)}
    assert len(attempts) == MAX_RESTORATION_ATTEMPTS
    assert restoration_id("ro-1", "w-1", 0) == restoration_id("ro-1", "w-1")
