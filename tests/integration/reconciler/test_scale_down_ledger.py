"""The scale-down ledger under the DynamoDB answers the emulator never gives on its own: another cycle
writing first, a write whose answer is lost, a ledger that keeps changing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud import retry
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.scale_down import Action
from fleetkeeper.domain.scale_down_ledger import InFlight
from fleetkeeper.services.reconcile.scale_down import LEDGER_ATTEMPTS
from fleetkeeper.store.ledger import LEDGER_KEY
from fleetkeeper_local import faults
from tests.integration.functions import reconcile_fleet

pytestmark = pytest.mark.integration

ENABLED = {"SCALE_DOWN_ENABLED": "true", "IDLE_WINDOW_SECONDS": "1800", "SCALE_DOWN_COOLDOWN_SECONDS": "0"}


def ledger_write(operation: str, params: dict[str, Any]) -> bool:
    return operation == "PutItem" and params.get("Item", {}).get("PK", {}).get("S") == LEDGER_KEY["PK"]


def idle_scope(store: Any, live_worker: Any) -> tuple[Any, Any]:
    """Two workers of one scope, one idle for two hours: scaling it down is a stop."""
    keep = live_worker()
    idle = store.update_worker(
        live_worker(), {"idle_since": utcnow() - timedelta(hours=2)}, actor="test", action="IdleSeeded"
    )
    return keep, idle


def test_given_two_writes_from_one_read_then_the_second_is_a_stale_write(ctx):
    ledger = ctx.ledger
    read = ledger.read()
    entry = InFlight(worker_id="w-1", scope="lab#-", action=Action.STOP, until=utcnow())
    ledger.save(read, [entry])

    with pytest.raises(StaleWrite):
        ledger.save(read, [entry.model_copy(update={"worker_id": "w-2"})])
    assert [e.worker_id for e in ledger.read().entries] == ["w-1"]


def test_given_another_cycle_wrote_the_ledger_first_then_the_scale_down_is_decided_again_and_goes_ahead(
    make_ctx, store, live_worker
):
    keep, idle = idle_scope(store, live_worker)
    raced = faults.Fault("dynamodb", "ConditionalCheckFailedException", when=ledger_write, limit=1)

    with faults.FaultPlan(faults=[raced]).installed():
        report = reconcile_fleet(make_ctx(**ENABLED))

    assert raced.injected == 1
    assert report.counters["scale_down_stop_count"] == 1
    assert store.get_worker(idle.id).status == WorkerStatus.STOPPING
    assert store.get_worker(keep.id).status == WorkerStatus.RUNNING


def test_given_the_answer_to_the_ledger_write_is_lost_then_the_retry_finds_its_own_entry_and_goes_ahead(
    make_ctx, store, live_worker
):
    _keep, idle = idle_scope(store, live_worker)
    lost = faults.Fault("dynamodb", "InternalServerError", when=ledger_write, status=500, after=True, limit=1)

    with faults.FaultPlan(faults=[lost]).installed():
        report = reconcile_fleet(make_ctx(**ENABLED))

    assert lost.injected == 1
    assert report.counters["scale_down_stop_count"] == 1
    assert report.counters["scale_down_refused_in_flight"] == 0
    assert [e.worker_id for e in make_ctx().ledger.read().entries] == [idle.id]


def test_given_a_ledger_that_keeps_changing_then_only_that_worker_waits_and_the_cycle_goes_on(
    make_ctx, store, live_worker
):
    _keep, idle = idle_scope(store, live_worker)
    pending = store.update_worker(
        live_worker(), {"desired_status": WorkerStatus.STOPPED}, actor="t", action="D"
    )
    contended = faults.Fault("dynamodb", "ConditionalCheckFailedException", when=ledger_write)
    lost_races = retry.retry_counts().get("conflict:scale-down-ledger", 0)

    with faults.FaultPlan(faults=[contended]).installed():
        report = reconcile_fleet(make_ctx(**ENABLED))

    assert contended.injected == LEDGER_ATTEMPTS
    # Every lost turn but the last was followed by a jittered pause (cloud/retry.py) before the next.
    assert retry.retry_counts()["conflict:scale-down-ledger"] - lost_races == LEDGER_ATTEMPTS - 1
    assert report.completed
    assert report.counters["scale_down_refused_in_flight"] == 1
    assert report.counters["worker_errors"] == 0
    waiting = store.get_worker(idle.id)
    # Not an error of the worker: no backoff, and looked at again next cycle.
    assert (waiting.status, waiting.reconcile_attempts) == (WorkerStatus.RUNNING, 0)
    # Another worker's step in the same cycle still ran.
    assert store.get_worker(pending.id).status == WorkerStatus.STOPPING


def cooldown_claim(operation: str, params: dict[str, Any]) -> bool:
    key = params.get("Key", {}).get("PK", {}).get("S")
    return operation == "UpdateItem" and key == "STATS#scale-down" and "ConditionExpression" in params


def test_given_another_cycle_took_the_scopes_cooldown_first_then_the_ledger_place_is_given_back(
    make_ctx, store, live_worker
):
    _keep, idle = idle_scope(store, live_worker)
    taken = faults.Fault("dynamodb", "ConditionalCheckFailedException", when=cooldown_claim, limit=1)

    with faults.FaultPlan(faults=[taken]).installed():
        report = reconcile_fleet(make_ctx(**{**ENABLED, "SCALE_DOWN_COOLDOWN_SECONDS": "600"}))

    assert taken.injected == 1
    assert report.counters["scale_down_refused_cooldown"] == 1
    assert store.get_worker(idle.id).status == WorkerStatus.RUNNING
    # The place it won is free again: it holds neither the scope's minimum nor the budget.
    assert make_ctx().ledger.read().entries == []
