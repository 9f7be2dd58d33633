"""Rollouts that reach the same workers at once, interleaved where a real DynamoDB lets them meet. The
start's own 409 is a first look (tests/integration/test_rollouts_api.py); these are the races it cannot
see, where the door for disruption (the workers' owners) keeps the rollouts apart."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.rollouts import Rollout, RolloutStatus, RolloutStrategy, replacement_id
from fleetkeeper.services.context import build_context
from fleetkeeper.services.rollouts import engine
from fleetkeeper.settings import get_settings
from fleetkeeper_local import faults

pytestmark = pytest.mark.integration


@pytest.fixture
def labs(control_plane, running_worker) -> list[Worker]:
    return [running_worker(template="lab-small", pool="labs") for _ in range(3)]


def stored_rollout(control_plane, rollout_id: str, worker_ids: list[str]) -> Rollout:
    """A RUNNING rollout over these workers, stored as a start stores it but with no claim yet: what a
    start that slipped past the first look leaves for its first step."""
    now = utcnow()
    stored: Rollout = control_plane.ctx.rollouts.start(
        Rollout(
            id=rollout_id,
            total=len(worker_ids),
            max_unavailable=len(worker_ids),
            max_unavailable_requested=len(worker_ids),
            strategy=RolloutStrategy.SURGE,
            started_by="test",
            created_at=now,
            updated_at=now,
        ),
        sorted(worker_ids),
        actor="test",
    )
    return stored


def test_given_two_rollouts_over_one_worker_then_only_the_first_to_claim_it_replaces_it(control_plane, labs):
    ids = sorted(w.id for w in labs)
    assert control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 3}]}})[0] == 200
    first = stored_rollout(control_plane, "ro-first", ids)
    second = stored_rollout(control_plane, "ro-second", ids[1:])

    engine.step(control_plane.ctx, first, utcnow())
    later = engine.step(control_plane.ctx, control_plane.ctx.rollouts.get(second.id), utcnow())

    # The first claimed all three and admitted them; the second finds them held and leaves them.
    store = control_plane.ctx.store
    assert {store.get_worker(w).owner.rollout_id for w in ids} == {first.id}
    assert (later.status, later.replaced, later.skipped) == (RolloutStatus.SUCCEEDED, 0, 2)
    assert [store.find_worker(replacement_id(second.id, w)) for w in ids[1:]] == [None, None]
    assert len([w for w in ids if store.find_worker(replacement_id(first.id, w))]) == 3


def test_given_a_rollout_takes_a_worker_between_another_ones_read_and_its_write_then_one_replacement(
    control_plane, labs
):
    """The second rollout's step reads the worker free; before its admitting write lands, the first
    takes it. The write fails on the worker's version; the door reads again and finds it held."""
    ids = sorted(w.id for w in labs)
    first = stored_rollout(control_plane, "ro-first", ids[:1])
    second = stored_rollout(control_plane, "ro-second", ids[:1])
    fired: list[str] = []
    # The first rollout's step runs on a context made before the hook, so it is not hooked itself.
    plain = control_plane.ctx

    def first_wins(params: dict[str, Any], **_: Any) -> None:
        keys = {i.get("Update", {}).get("Key", {}).get("PK", {}).get("S") for i in params["TransactItems"]}
        if fired or f"WORKER#{ids[0]}" not in keys:
            return
        fired.append(ids[0])
        engine.step(plain, plain.rollouts.get(first.id), utcnow())

    with faults.installed_hooks([("before-parameter-build.dynamodb.TransactWriteItems", first_wins)]):
        hooked = build_context(get_settings())
        later = engine.step(hooked, hooked.rollouts.get(second.id), utcnow())

    assert fired == [ids[0]]
    store = control_plane.ctx.store
    owner = store.get_worker(ids[0]).owner
    assert owner is not None
    assert owner.rollout_id == first.id
    assert (later.status, later.replaced, later.skipped) == (RolloutStatus.SUCCEEDED, 0, 1)
    assert store.find_worker(replacement_id(second.id, ids[0])) is None
    assert store.find_worker(replacement_id(first.id, ids[0])) is not None


def test_given_a_rollback_of_a_finished_rollout_then_a_start_over_its_replacements_is_409(
    control_plane, labs
):
    """Rolling back makes the rollout active again: the replacements it holds are its own again, so a
    start naming one is refused, whatever a start could see while the rollout was finished."""
    _, first = control_plane.api("POST", "/api/v1/rollouts", {"template": "lab-small", "pool": "labs"})
    store = control_plane.ctx.store
    engine.step(control_plane.ctx, control_plane.ctx.rollouts.get(first["id"]), utcnow())
    replacement = store.get_worker(replacement_id(first["id"], sorted(w.id for w in labs)[0]))
    # Its replacement came up (as the reconciler brings it up), held by the rollout.
    launched = store.transition_worker(
        replacement,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor="test",
        changes={"ec2_instance_id": "i-0123456789abcdef0"},
    )
    store.transition_worker(launched, WorkerStatus.RUNNING, cause=Cause.EC2, actor="test")
    base = f"/api/v1/rollouts/{first['id']}"
    assert control_plane.api("POST", f"{base}/cancel")[0] == 200

    # Finished, the rollout holds nothing: a start naming the replacement passes.
    assert (
        control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": [replacement.id], "dry_run": True})[0]
        == 200
    )
    status, rolling = control_plane.api("POST", f"{base}/rollback")
    refused_status, refused = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": [replacement.id]})

    assert (status, rolling["status"]) == (202, "ROLLING_BACK"), rolling
    assert (refused_status, refused["details"]["worker_id"], refused["details"]["id"]) == (
        409,
        replacement.id,
        first["id"],
    )
