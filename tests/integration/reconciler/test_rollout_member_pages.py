"""A rollout's scope in member pages, advanced by reconcile cycles with the real drain workflow: waves
and a rollback whose workers span two pages each read exactly the workers of plan_waves, and a rollout
stored with its ids inline (before member pages) still advances."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.rollouts import Rollout, RolloutStrategy, plan_waves, replacement_id
from fleetkeeper.store import rollouts as rollout_store
from fleetkeeper.store.codec import record_attributes, serialize
from fleetkeeper_local.images import publish_newer_image
from tests.integration.reconciler.support import cycle_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

S = WorkerStatus
MAX_CYCLES = 120
# Five workers in member pages of 2 (three pages) and waves of 3: both waves span two pages and the
# last one is short.
FLEET = 5
PAGE = 2
WIDTH = 3


def _cycles(control_plane, until: Callable[[], Any], sample: Callable[[], None] = lambda: None) -> Any:
    return cycle_until(control_plane, until, sample, max_cycles=MAX_CYCLES, pause=0.1)


def _status_is(control_plane, rollout_id: str, *statuses: str) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        status, view = control_plane.api("GET", f"/api/v1/rollouts/{rollout_id}")
        assert status == 200, view
        return dict(view) if view["status"] in statuses else None

    return probe


def _wave_recorder(
    control_plane, rollout_id: str, rollback: bool
) -> tuple[dict[int, set[str]], Callable[[], None]]:
    """The workers each wave (of the rollout, or of its rollback) held in its progress, by wave."""
    seen: dict[int, set[str]] = {}

    def sample() -> None:
        rollout = control_plane.ctx.rollouts.get(rollout_id)
        wave, progress = (
            (rollout.rollback_wave, rollout.rollback_progress)
            if rollback
            else (rollout.wave, rollout.progress)
        )
        if progress:
            seen.setdefault(wave, set()).update(progress)

    return seen, sample


@pytest.fixture
def fleet_of_five(control_plane, ec2, monkeypatch) -> list[str]:
    """Five RUNNING workers of template lab in pool labs launched by the reconciler (so they record their
    image and type), member pages of 2 ids, a budget of 3 disruptions at once; their ids, sorted."""
    monkeypatch.setattr(rollout_store, "MEMBER_PAGE_SIZE", PAGE)
    body = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 4}
    assert control_plane.api("PUT", "/api/v1/templates/lab", body)[0] in {200, 201}
    publish_newer_image(ec2, "lab-*")
    budget = {"disruption": {"budgets": [{"max": WIDTH}]}}
    assert control_plane.api("PUT", "/api/v1/pools/labs", budget)[0] == 201
    ids = []
    for _ in range(FLEET):
        status, created = control_plane.api("POST", "/api/v1/workers", {"template": "lab", "pool": "labs"})
        assert status == 201, created
        ids.append(created["id"])
    store = control_plane.ctx.store
    _cycles(control_plane, lambda: set(store.worker_statuses(ids).values()) == {S.RUNNING}, lambda: None)
    return sorted(ids)


def test_given_a_scope_over_three_member_pages_then_waves_and_rollback_cross_pages_to_the_end(
    control_plane, ec2, fleet_of_five
):
    old = fleet_of_five
    store = control_plane.ctx.store
    waves = plan_waves(old, WIDTH)
    # Waves 0 (ids 0-2) and 1 (ids 3-4) each span two pages (ids 0-1, 2-3, 4).
    assert [len(w) for w in waves] == [3, 2]
    publish_newer_image(ec2, "lab-*")
    status, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "max_unavailable": WIDTH}
    )
    assert (status, started["total"], started["waves"], started["remaining"]) == (202, FLEET, 2, FLEET), (
        started
    )
    rollout_id = started["id"]
    stored = control_plane.ctx.rollouts.get(rollout_id)
    assert (stored.worker_ids, stored.member_page_size) == ([], PAGE)
    assert control_plane.ctx.rollouts.members(stored, 0, FLEET) == old
    forward, sample = _wave_recorder(control_plane, rollout_id, rollback=False)

    done = _cycles(control_plane, _status_is(control_plane, rollout_id, "SUCCEEDED", "FAILED"), sample)

    assert (done["status"], done["replaced"], done["skipped"], done["remaining"]) == (
        "SUCCEEDED",
        FLEET,
        0,
        0,
    )
    assert [sorted(forward[k]) for k in sorted(forward)] == waves
    replacements = [replacement_id(rollout_id, w) for w in old]
    assert set(store.worker_statuses(replacements).values()) == {S.RUNNING}

    status, rolling = control_plane.api("POST", f"/api/v1/rollouts/{rollout_id}/rollback", {"reason": "bad"})
    assert (status, rolling["rollback"]["total"], rolling["rollback"]["waves"]) == (202, FLEET, 2), rolling
    backward, sample = _wave_recorder(control_plane, rollout_id, rollback=True)

    done = _cycles(control_plane, _status_is(control_plane, rollout_id, "ROLLED_BACK", "FAILED"), sample)

    assert (done["status"], done["rollback"]["rolled_back"], done["rollback"]["skipped"]) == (
        "ROLLED_BACK",
        FLEET,
        0,
    ), done
    assert [sorted(backward[k]) for k in sorted(backward)] == waves
    assert set(store.worker_statuses(replacements).values()) == {S.TERMINATED}


def test_given_a_rollout_stored_with_its_ids_inline_then_it_still_advances_to_the_end(
    control_plane, live_worker
):
    assert control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 2}]}})[0] == 201
    old = sorted(live_worker(pool="labs").id for _ in range(3))
    now = utcnow() - timedelta(minutes=1)
    legacy = Rollout(
        id="ro-inline0000000001",
        template="lab",
        pool="labs",
        worker_ids=old,
        total=len(old),
        max_unavailable=2,
        max_unavailable_requested=2,
        strategy=RolloutStrategy.SURGE,
        started_by="test",
        created_at=now,
        updated_at=now,
        version=1,
    )
    # The item as the version before member pages wrote it: the ids inline, no total, no page size.
    attributes = {
        k: v for k, v in record_attributes(legacy).items() if k not in {"total", "member_page_size"}
    }
    item = {
        **rollout_store.rollout_key(legacy.id),
        **attributes,
        "GSI1PK": rollout_store.rollout_status_partition(legacy.status),
        "GSI1SK": legacy.id,
        "GSI3PK": "KIND#ROLLOUT",
        "GSI3SK": f"{now.isoformat()}#{legacy.id}",
    }
    rollouts = control_plane.ctx.rollouts
    rollouts._client.put_item(TableName=rollouts.table_name, Item=serialize(item))
    status, view = control_plane.api("GET", f"/api/v1/rollouts/{legacy.id}")
    assert (status, view["total"], view["waves"], view["remaining"]) == (200, 3, 2, 3), view
    forward, sample = _wave_recorder(control_plane, legacy.id, rollback=False)

    done = _cycles(control_plane, _status_is(control_plane, legacy.id, "SUCCEEDED", "FAILED"), sample)

    assert (done["status"], done["replaced"], done["waves"]) == ("SUCCEEDED", 3, 2), done
    assert [sorted(forward[k]) for k in sorted(forward)] == plan_waves(old, 2)
    new = [replacement_id(legacy.id, w) for w in old]
    assert set(control_plane.ctx.store.worker_statuses(new).values()) == {S.RUNNING}
    status, rolling = control_plane.api("POST", f"/api/v1/rollouts/{legacy.id}/rollback")
    assert (status, rolling["rollback"]["total"], rolling["rollback"]["waves"]) == (202, 3, 2), rolling
