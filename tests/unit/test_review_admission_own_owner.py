"""Review: the door admits a worker already counted as the asker's before the rule's other checks, so
a surge's (or expiry's) admission ahead goes on to drain a worker that became protected, or whose pool
stopped being ACTIVE, after the admission."""

from __future__ import annotations

from fleetkeeper.domain.admission import Ask, judge
from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.lifecycle import PoolStatus
from fleetkeeper.domain.models import Owner
from tests.unit.test_admission import NOW, ROLLOUT, always_active, held, pool, state, worker

SURGE_OWNER = Owner(reason="rollout", actor="rollout:ro-1", since=NOW, counted=True, rollout_id="ro-1")


def test_given_a_surge_admission_and_then_do_not_disrupt_then_the_drain_waits_protected() -> None:
    verdict = judge(
        ROLLOUT, worker(owner=SURGE_OWNER, do_not_disrupt=True), state(), NOW, active=always_active
    )
    assert held(verdict) == "protected"


def test_given_a_surge_admission_and_then_a_pool_drain_then_the_voluntary_drain_waits() -> None:
    verdict = judge(
        ROLLOUT,
        worker(owner=SURGE_OWNER),
        state(pool(status=PoolStatus.INACTIVE)),
        NOW,
        active=always_active,
    )
    assert held(verdict) == "pool_not_active"


def test_given_an_expiry_admission_and_then_do_not_disrupt_then_the_drain_waits_protected() -> None:
    ask = Ask(DisruptionReason.EXPIRED, "reconciler", ahead=True)
    lease = Owner(reason="expired", actor="reconciler", since=NOW, counted=True, until=NOW.replace(hour=13))
    verdict = judge(ask, worker(owner=lease, do_not_disrupt=True), state(), NOW, active=always_active)
    assert held(verdict) == "protected"
