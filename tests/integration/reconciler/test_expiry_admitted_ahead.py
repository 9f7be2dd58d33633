"""An expired worker admitted ahead (its lease live) whose pool closed, or which an operator protected,
since: it is not drained, and its admission is given back at once."""

from __future__ import annotations

import pytest

from fleetkeeper.domain.admission import Ask
from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.services import admission
from fleetkeeper.services.reconcile.expiry import EXPIRY_ACTOR, replacement_id
from tests.integration.conftest import ControlPlane
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory
from tests.integration.reconciler.test_expiry import fleet_of

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_given_a_live_expiry_lease_and_an_inactive_pool_then_the_expired_worker_is_not_drained(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
) -> None:
    (old,) = fleet_of(store, ec2, ages_hours=[3])
    ctx = make_ctx()
    # A cycle admitted the expired worker ahead, then died before making its replacement.
    with admission.door(ctx) as door:
        admission.hold_ahead(ctx, door, old.id, Ask(DisruptionReason.EXPIRED, EXPIRY_ACTOR, ahead=True))
    pool = store.get_pool("labs")
    store.save_pool(pool, {"status": PoolStatus.INACTIVE}, actor="test", action="PoolDeactivated")

    report = reconcile_fleet(make_ctx())

    assert store.find_worker(replacement_id(old.id)) is None
    # The rule: a voluntary disruption waits while its pool is not ACTIVE; never a drain with no replacement.
    left = store.get_worker(old.id)
    assert (left.status, left.owner) == (WorkerStatus.RUNNING, None), report.counters
    assert report.counters["expiry_held_pool_not_active"] == 1


def test_given_a_live_expiry_lease_and_an_operator_protecting_the_worker_then_it_is_not_drained(
    control_plane: ControlPlane, make_ctx: ContextFactory, store, ec2
) -> None:
    (old,) = fleet_of(store, ec2, ages_hours=[3])
    ctx = make_ctx()
    with admission.door(ctx) as door:
        admission.hold_ahead(ctx, door, old.id, Ask(DisruptionReason.EXPIRED, EXPIRY_ACTOR, ahead=True))
    current = store.get_worker(old.id)
    store.update_worker(current, {"do_not_disrupt": True}, actor="operator", action="WorkerProtected")

    report = reconcile_fleet(make_ctx())

    # The rule: a protected worker waits (`protected`), whoever asks; the lease is given back at once.
    left = store.get_worker(old.id)
    assert (left.status, left.owner) == (WorkerStatus.RUNNING, None), report.counters
