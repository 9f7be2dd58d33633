"""The turn that says where the next cycle starts serving active rollouts is written on the condition
that it is still what the writing cycle started from: of two cycles that raced, the first one's stands."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.domain.rollouts import RolloutStatus
from fleetkeeper.store.rollouts import RolloutStore

pytestmark = pytest.mark.integration

RUNNING = RolloutStatus.RUNNING


@pytest.fixture
def rollouts(dynamodb: Any, table_name: str) -> RolloutStore:
    return RolloutStore(dynamodb, table_name)


def test_given_no_turn_yet_then_the_first_cycle_writes_it_and_a_second_that_read_none_loses(rollouts):
    assert rollouts.turn(RUNNING) is None

    first = rollouts.set_turn(RUNNING, "ro-b", read=None)
    second = rollouts.set_turn(RUNNING, "ro-c", read=None)

    assert (first, second) == (True, False)
    assert rollouts.turn(RUNNING) == "ro-b"


def test_given_a_turn_then_only_a_cycle_that_read_it_moves_it(rollouts):
    rollouts.set_turn(RUNNING, "ro-b", read=None)

    moved = rollouts.set_turn(RUNNING, "ro-d", read="ro-b")
    stale = rollouts.set_turn(RUNNING, "ro-a", read="ro-b")

    assert (moved, stale) == (True, False)
    assert rollouts.turn(RUNNING) == "ro-d"
    # Each status keeps its own turn.
    assert rollouts.turn(RolloutStatus.ROLLING_BACK) is None
