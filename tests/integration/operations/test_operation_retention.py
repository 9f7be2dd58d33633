"""Finished operations and their audit items expire (the table's TTL), from the stage's retention; an
operation still PENDING or RUNNING never carries a TTL, so it cannot expire under its waiters."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.operations import Operation, OperationStatus, system_info_due
from fleetkeeper.services import operations
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.store import keys
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.operations import operation_key
from fleetkeeper.store.schema import TTL_ATTRIBUTE
from fleetkeeper_local import faults
from fleetkeeper_local.controlplane import refresh_process_caches

pytestmark = pytest.mark.integration

DAY = 86400
LICENSE = {"licenseServer": "licenses.example.com"}


@pytest.fixture
def settings_overrides() -> dict[str, str]:
    return {
        "OPERATION_RETENTION_DAYS": "7",
        "AUDIT_RETENTION_DAYS": "30",
        "SYSTEM_INFO_INTERVAL_SECONDS": "3600",
    }


def stored(ctx: Context, op: Operation) -> dict[str, Any]:
    item = boto3.client("dynamodb").get_item(
        TableName=ctx.settings.table_name,
        Key=serialize(operation_key(op.worker_id, op.id)),
        ConsistentRead=True,
    )["Item"]
    return dict(item)


def expires(item: dict[str, Any]) -> int | None:
    return int(item[TTL_ATTRIBUTE]["N"]) if TTL_ATTRIBUTE in item else None


def audit_expiries(ctx: Context, worker_id: str) -> dict[str, set[int | None]]:
    """Action -> the TTLs of the worker's audit items of that action."""
    items = boto3.client("dynamodb").query(
        TableName=ctx.settings.table_name,
        KeyConditionExpression="PK = :pk",
        ExpressionAttributeValues={":pk": {"S": keys.audit_partition("worker", worker_id)}},
        ConsistentRead=True,
    )["Items"]
    found: dict[str, set[int | None]] = {}
    for item in items:
        found.setdefault(str(item["action"]["S"]), set()).add(expires(dict(item)))
    return found


def near(value: int | None, moment: datetime, days: int) -> bool:
    return value is not None and abs(value - (moment.timestamp() + days * DAY)) < 120


def cycle(ctx: Context, now: datetime, workers: list[Worker] | None = None) -> None:
    counters: Counter[str] = Counter()
    operations.reconcile_operations(ctx, workers or [], now, counters)
    assert counters["operation_errors"] == 0


def test_given_an_operation_then_it_carries_a_ttl_only_once_finished_counted_from_its_end(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    op = operations.request(ctx, worker.id, "register-license", LICENSE, actor="op")
    pending = stored(ctx, op)
    now = utcnow()
    cycle(ctx, now)
    running = stored(ctx, op)
    cycle(ctx, now + timedelta(hours=2))
    finished = ctx.store.get_operation(worker.id, op.id)
    ctx.store.update_worker(ctx.store.get_worker(worker.id), {"capacity": 5}, actor="op", action="Resized")

    assert (expires(pending), expires(running)) == (None, None)
    assert finished.status == OperationStatus.SUCCESS
    assert finished.finished_at is not None
    assert near(expires(stored(ctx, op)), finished.finished_at, 7)
    trail = audit_expiries(ctx, worker.id)
    assert all(near(v, utcnow(), 7) for v in trail["OperationRequested"] | trail["OperationSucceeded"])
    assert all(near(v, utcnow(), 30) for v in trail["Resized"])  # the rest of the trail: audit retention


def test_given_collected_system_information_then_its_audit_item_shares_the_operations_retention(
    ctx: Context, machine_worker: Callable[..., Worker]
) -> None:
    worker = machine_worker()
    now = next(
        t
        for t in (utcnow() + timedelta(minutes=m) for m in range(61))
        if system_info_due(worker.id, None, t, 3600, 60)
    )
    plan = faults.FaultPlan(faults=[faults.ssm_command_result("Success", stdout=json.dumps({"cpus": 4}))])

    with plan.installed():
        cycle(ctx, now, [worker])
        cycle(ctx, now + timedelta(seconds=5), [ctx.store.get_worker(worker.id)])

    assert ctx.store.get_worker(worker.id).system_info == {"cpus": 4}
    [collected] = audit_expiries(ctx, worker.id)["WorkerSystemInfoCollected"]
    assert near(collected, utcnow(), 7)


@pytest.mark.parametrize(
    ("overrides", "operation_days", "audit_days"),
    [
        ({"OPERATION_RETENTION_DAYS": "0", "AUDIT_RETENTION_DAYS": "30"}, None, 30),
        ({"OPERATION_RETENTION_DAYS": "60", "AUDIT_RETENTION_DAYS": "30"}, 60, 30),
        ({"OPERATION_RETENTION_DAYS": "0", "AUDIT_RETENTION_DAYS": "0"}, None, None),
    ],
)
def test_given_other_retentions_then_operations_are_kept_that_long_and_their_audit_no_longer_than_the_trail(
    ctx: Context,
    *,
    running_worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
    overrides: dict[str, str],
    operation_days: int | None,
    audit_days: int | None,
) -> None:
    for key, value in overrides.items():
        monkeypatch.setenv(key, value)
    refresh_process_caches()
    ctx = default_context()
    worker = running_worker()
    op = operations.request(ctx, worker.id, "register-license", LICENSE, actor="op")
    cancelled = {"status": OperationStatus.CANCELLED, "finished_at": utcnow()}
    ctx.store.save_operation(op, cancelled, actor="op", action="OperationCancelled")

    item_ttl = expires(stored(ctx, op))
    trail = audit_expiries(ctx, worker.id)

    assert item_ttl is None if operation_days is None else near(item_ttl, utcnow(), operation_days)
    for ttl in trail["OperationRequested"] | trail["OperationCancelled"]:
        assert ttl is None if audit_days is None else near(ttl, utcnow(), audit_days)
