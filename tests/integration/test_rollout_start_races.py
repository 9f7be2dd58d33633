"""Two rollout starts over the same workers, interleaved where a real DynamoDB lets them: one start's
locks are in the table, its rollout not yet. The second must not take those locks over."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.rollouts import ACTIVE, RolloutRequest, RolloutStatus, replacement_id
from fleetkeeper.services import rollouts
from fleetkeeper.services.context import build_context
from fleetkeeper.settings import Settings
from fleetkeeper.store import rollouts as rollout_store
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.rollouts import (
    STARTING_LOCK_SECONDS,
    RolloutCovered,
    RolloutStore,
    rollout_lock_key,
)
from fleetkeeper.store.schema import TTL_ATTRIBUTE
from fleetkeeper_local import faults

pytestmark = pytest.mark.integration


@pytest.fixture
def labs(control_plane, running_worker) -> list[Worker]:
    return [running_worker(template="lab-small", pool="labs") for _ in range(3)]


def test_given_a_start_between_its_locks_and_its_rollout_then_an_overlapping_start_is_409(
    control_plane, labs, monkeypatch
):
    ids = sorted(w.id for w in labs)
    lock_all = RolloutStore._lock_all
    answers: list[BaseException | None] = []
    raced: list[bool] = []

    def lock_then_race(self, rollout, worker_ids):
        lock_all(self, rollout, worker_ids)
        if not raced:
            raced.append(True)
            # The first start holds its locks; its rollout is not written yet.
            # (The API serves one request at a time here: the second start goes in through the service.)
            try:
                rollouts.start(control_plane.ctx, RolloutRequest(worker_ids=ids[1:]), actor="other")
                answers.append(None)
            except RolloutCovered as refused:
                answers.append(refused)

    monkeypatch.setattr(RolloutStore, "_lock_all", lock_then_race)

    status, first = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": ids})

    (refused,) = answers
    assert status == 202, first
    assert isinstance(refused, RolloutCovered), "both starts took the same workers"
    assert refused.details() == {
        "entity": "rollout",
        "id": first["id"],
        "current_status": "STARTING",
        "worker_id": ids[1],
    }
    assert [r.id for r in control_plane.ctx.rollouts.page().items] == [first["id"]]
    assert control_plane.ctx.rollouts.lock_holders(ids) == dict.fromkeys(ids, first["id"])


def test_given_a_lock_naming_no_rollout_then_it_refuses_while_young_and_is_taken_over_once_old(
    control_plane, labs
):
    ids = sorted(w.id for w in labs)
    locks = control_plane.ctx.rollouts
    now = int(utcnow().timestamp() * 1000)
    # A start that died after its locks: one lock just taken, one taken past any start's timeout.
    for worker_id, taken_at in ((ids[0], now), (ids[1], now - (STARTING_LOCK_SECONDS + 60) * 1000)):
        item = {**rollout_lock_key(worker_id), "rollout_id": "ro-ghost", "taken_at_ms": taken_at}
        locks._client.put_item(TableName=locks.table_name, Item=serialize(item))

    status_young, young = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": ids[:1]})
    status_old, old = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": ids[1:]})

    assert (status_young, young["details"]["worker_id"], young["details"]["current_status"]) == (
        409,
        ids[0],
        "STARTING",
    )
    assert status_old == 202, old
    assert locks.lock_holders(ids) == {ids[0]: "ro-ghost", ids[1]: old["id"], ids[2]: old["id"]}


def test_given_a_rollback_of_a_finished_rollout_racing_a_start_then_only_one_covers_the_replacements(
    control_plane, labs, monkeypatch
):
    _, first = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs"})
    base = f"/api/v1/rollouts/{first['id']}"
    assert control_plane.api("POST", f"{base}/cancel")[0] == 200
    locks = control_plane.ctx.rollouts
    cancelled = locks.get(first["id"])
    reached = locks.members(cancelled, 0, cancelled.wave_bounds(0)[1])
    replacements = sorted(replacement_id(cancelled.id, w) for w in reached)
    save = RolloutStore.save
    others: list[str] = []

    def start_then_save(self, rollout, changes, **kwargs):
        if kwargs.get("action") == "RolloutRollbackStarted" and not others:
            # The rollback holds the replacements' locks; the rollout is not ROLLING_BACK yet.
            other = cancelled.model_copy(
                update={"id": "ro-other", "status": RolloutStatus.RUNNING, "finished_at": None}
            )
            other = other.model_copy(update={"total": len(replacements)})
            try:
                others.append(locks.start(other, replacements, actor="other").id)
            except RolloutCovered:
                others.append("")
        return save(self, rollout, changes, **kwargs)

    monkeypatch.setattr(RolloutStore, "save", start_then_save)

    status, rolling = control_plane.api("POST", f"{base}/rollback")

    holders = set(locks.lock_holders(replacements).values())
    active = {
        r
        for r in (first["id"], others[0])
        if r and (found := locks.find(r)) is not None and found.status in ACTIVE
    }
    assert len(active) == 1, (status, rolling, holders, active)
    # The start came while the rollback held the locks: it is the one refused, the rollback goes on.
    assert others == [""]
    assert (status, rolling["status"]) == (202, "ROLLING_BACK"), rolling
    assert holders == {first["id"]}


def test_given_a_refused_start_whose_locks_cannot_be_given_back_then_it_is_still_409(
    control_plane, labs, monkeypatch
):
    ids = sorted(w.id for w in labs)
    _, holder = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": ids[2:]})
    # One lock per transaction: the first workers' locks are taken before the last one is refused.
    monkeypatch.setattr(rollout_store, "LOCKS_PER_TRANSACTION", 1)
    plan = faults.FaultPlan(
        faults=[faults.Fault("dynamodb", "InternalServerError", frozenset({"DeleteItem"}), status=500)]
    )

    with plan.installed():
        ctx = build_context(Settings.from_environ(dict(os.environ)))
        with pytest.raises(RolloutCovered) as refused:
            rollouts.start(ctx, RolloutRequest(worker_ids=ids), actor="op")

    assert refused.value.details()["worker_id"] == ids[2]
    assert refused.value.details()["id"] == holder["id"]
    assert plan.injected["dynamodb:InternalServerError"] >= 1
    # The locks it could not give back still name the refused start: a later start takes them over
    # once they are old (test above), and the holder's lock is untouched.
    held = control_plane.ctx.rollouts.lock_holders(ids)
    assert held[ids[2]] == holder["id"]
    assert set(held) == set(ids)


def test_given_a_chunk_whose_locks_name_many_finished_rollouts_then_a_start_takes_them_all_over(
    control_plane, labs
):
    # Workers each replaced once by a rollout of their own, long finished: every lock of one chunk
    # names a different rollout. The condition of a lock may name only what that lock can hold.
    _, first = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": [labs[0].id]})
    locks = control_plane.ctx.rollouts
    ids = [f"w-many-{n:03d}" for n in range(rollout_store.LOCKS_PER_TRANSACTION)]
    old = int(utcnow().timestamp() * 1000) - (STARTING_LOCK_SECONDS + 60) * 1000
    for n, worker_id in enumerate(ids):
        item = {**rollout_lock_key(worker_id), "rollout_id": f"ro-gone-{n:03d}", "taken_at_ms": old}
        locks._client.put_item(TableName=locks.table_name, Item=serialize(item))
    template = locks.get(first["id"])
    other = template.model_copy(update={"id": "ro-many", "total": len(ids)})

    started = locks.start(other, ids, actor="op")

    assert started.status == RolloutStatus.RUNNING
    assert locks.lock_holders(ids) == dict.fromkeys(ids, "ro-many")


def test_given_a_rollback_of_a_rollout_started_long_ago_then_its_locks_do_not_expire_under_it(
    control_plane, labs
):
    _, first = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs"})
    base = f"/api/v1/rollouts/{first['id']}"
    assert control_plane.api("POST", f"{base}/cancel")[0] == 200
    locks = control_plane.ctx.rollouts
    cancelled = locks.get(first["id"])
    # Started a year and more ago (paused in between), finished lately: still inside its retention.
    retention = control_plane.ctx.settings.audit_retention_days or 365
    long_ago = cancelled.created_at - timedelta(days=retention + 30)
    cancelled = locks.save(cancelled, {"created_at": long_ago}, actor="test")
    reached = locks.members(cancelled, 0, cancelled.wave_bounds(0)[1])
    replacements = sorted(replacement_id(cancelled.id, w) for w in reached)

    status, rolling = control_plane.api("POST", f"{base}/rollback")

    assert (status, rolling["status"]) == (202, "ROLLING_BACK"), rolling
    now = utcnow().timestamp()
    for worker_id in replacements:
        lock = locks._client.get_item(
            TableName=locks.table_name, Key=serialize(rollout_lock_key(worker_id)), ConsistentRead=True
        )["Item"]
        assert lock["rollout_id"]["S"] == first["id"]
        assert int(lock[TTL_ATTRIBUTE]["N"]) > now, "the rollback's lock is already past its TTL"
