"""Scale-down through the door under the DynamoDB answers the emulator never gives on its own: another
decider taking the count first, another cycle taking the scope's cooldown."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.clients import client
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.store.disruption import read_counts
from fleetkeeper_local import faults
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.test_door_faults import admitting

pytestmark = pytest.mark.integration

ENABLED = {"SCALE_DOWN_ENABLED": "true", "IDLE_WINDOW_SECONDS": "1800", "SCALE_DOWN_COOLDOWN_SECONDS": "0"}
NO_POOL = "-"


def idle_scope(store: Any, live_worker: Any) -> tuple[Any, Any]:
    """Two workers of one scope, one idle for two hours: scaling it down is a stop."""
    keep = live_worker()
    idle = store.update_worker(
        live_worker(), {"idle_since": utcnow() - timedelta(hours=2)}, actor="test", action="IdleSeeded"
    )
    return keep, idle


def in_use(ctx: Any) -> int:
    return read_counts(client("dynamodb"), ctx.settings.table_name, NO_POOL).in_use


def test_given_another_decider_took_the_count_first_then_the_scale_down_is_decided_again_and_goes_ahead(
    make_ctx, store, live_worker
):
    keep, idle = idle_scope(store, live_worker)
    raced = faults.Fault("dynamodb", "TransactionCanceledException", when=admitting(NO_POOL), limit=1)

    with faults.FaultPlan(faults=[raced]).installed():
        report = reconcile_fleet(make_ctx(**ENABLED))

    assert raced.injected == 1
    assert report.counters["scale_down_stop_count"] == 1
    assert store.get_worker(idle.id).status == WorkerStatus.STOPPING
    assert store.get_worker(keep.id).status == WorkerStatus.RUNNING
    assert in_use(make_ctx()) == 1


def cooldown_claim(operation: str, params: dict[str, Any]) -> bool:
    key = params.get("Key", {}).get("PK", {}).get("S")
    return operation == "UpdateItem" and key == "STATS#scale-down" and "ConditionExpression" in params


def test_given_another_cycle_took_the_scopes_cooldown_first_then_nothing_is_admitted(
    make_ctx, store, live_worker
):
    _keep, idle = idle_scope(store, live_worker)
    taken = faults.Fault("dynamodb", "ConditionalCheckFailedException", when=cooldown_claim, limit=1)

    with faults.FaultPlan(faults=[taken]).installed():
        report = reconcile_fleet(make_ctx(**{**ENABLED, "SCALE_DOWN_COOLDOWN_SECONDS": "600"}))

    assert taken.injected == 1
    assert report.counters["scale_down_refused_cooldown"] == 1
    assert store.get_worker(idle.id).status == WorkerStatus.RUNNING
    # The cooldown is claimed before the door: no place in the budgets was taken for it.
    assert (store.get_worker(idle.id).owner, in_use(make_ctx())) == (None, 0)
