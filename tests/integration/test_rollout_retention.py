"""A finished rollout and its member pages expire with the audit retention; a rollback of a finished
rollout takes the expiry off again, in the same transaction as the status change."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.errors import NotFound
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.rollouts import Rollout, RolloutStatus, RolloutStrategy
from fleetkeeper.store import rollouts as rollout_store
from fleetkeeper.store.rollouts import RolloutStore, member_page_key, rollout_key
from fleetkeeper.store.schema import TTL_ATTRIBUTE

pytestmark = pytest.mark.integration

RETENTION_DAYS = 30
PAGE = 4


@pytest.fixture
def rollouts(dynamodb: Any, table_name: str, monkeypatch: pytest.MonkeyPatch) -> RolloutStore:
    monkeypatch.setattr(rollout_store, "MEMBER_PAGE_SIZE", PAGE)
    return RolloutStore(dynamodb, table_name, audit_retention_days=RETENTION_DAYS)


def _started(rollouts: RolloutStore, total: int = 10) -> Rollout:
    now = utcnow()
    ids = [f"w-{n:03d}" for n in range(total)]
    rollout = Rollout(
        id="ro-retention",
        template="lab",
        total=total,
        max_unavailable=3,
        max_unavailable_requested="3",
        strategy=RolloutStrategy.SURGE,
        started_by="op",
        created_at=now,
        updated_at=now,
    )
    return rollouts.start(rollout, ids, actor="op")


def _expiry(dynamodb: Any, table_name: str, key: dict[str, str]) -> int | None:
    item = dynamodb.get_item(
        TableName=table_name, Key={k: {"S": v} for k, v in key.items()}, ConsistentRead=True
    )["Item"]
    return int(item[TTL_ATTRIBUTE]["N"]) if TTL_ATTRIBUTE in item else None


def _keys(rollout: Rollout) -> list[dict[str, str]]:
    return [rollout_key(rollout.id), *(member_page_key(rollout.id, p) for p in range(3))]


def test_given_a_running_rollout_then_nothing_of_it_expires(rollouts, dynamodb, table_name):
    rollout = _started(rollouts)

    assert [_expiry(dynamodb, table_name, k) for k in _keys(rollout)] == [None] * 4


def test_given_a_rollout_that_finishes_then_it_and_its_pages_expire_after_the_audit_retention(
    rollouts, dynamodb, table_name
):
    rollout = _started(rollouts)
    finished_at = utcnow()

    done = rollouts.save(
        rollout,
        {"status": RolloutStatus.SUCCEEDED, "finished_at": finished_at},
        actor="reconciler",
        action="RolloutSucceeded",
    )

    expected = int((finished_at + timedelta(days=RETENTION_DAYS)).timestamp())
    assert [_expiry(dynamodb, table_name, k) for k in _keys(done)] == [expected] * 4
    # Its pages still read: a finished rollout can be rolled back until it expires.
    assert rollouts.members(done, 0, 10) == [f"w-{n:03d}" for n in range(10)]


def test_given_a_finished_rollout_rolled_back_then_its_expiry_is_taken_off(rollouts, dynamodb, table_name):
    rollout = _started(rollouts)
    done = rollouts.save(
        rollout,
        {"status": RolloutStatus.SUCCEEDED, "finished_at": utcnow()},
        actor="r",
        action="RolloutSucceeded",
    )

    back = rollouts.save(
        done, {"status": RolloutStatus.ROLLING_BACK, "rollback_through_wave": 3}, actor="op", action="X"
    )

    assert back.status == RolloutStatus.ROLLING_BACK
    assert [_expiry(dynamodb, table_name, k) for k in _keys(back)] == [None] * 4


def test_given_a_page_already_expired_when_the_rollout_finishes_then_not_found_and_nothing_written(
    rollouts, dynamodb, table_name
):
    rollout = _started(rollouts)
    dynamodb.delete_item(
        TableName=table_name, Key={k: {"S": v} for k, v in member_page_key(rollout.id, 1).items()}
    )

    with pytest.raises(NotFound):
        rollouts.save(rollout, {"status": RolloutStatus.CANCELLED, "finished_at": utcnow()}, actor="op")

    # The update could not create the missing page, and the item kept its status.
    assert rollouts.get(rollout.id).status == RolloutStatus.RUNNING
    missing = dynamodb.get_item(
        TableName=table_name, Key={k: {"S": v} for k, v in member_page_key(rollout.id, 1).items()}
    )
    assert "Item" not in missing
