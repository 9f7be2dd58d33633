"""How fast a steady fleet fills the table: one system information interval of simulated one-minute
reconcile cycles, counted item by item. Every item a steady worker adds is an operation or its audit
trail, and every one expires."""

from __future__ import annotations

import json

import pytest

from fleetkeeper.domain.models import utcnow
from fleetkeeper_local.storage import steady_hour
from tests.integration.operations.conftest import CATALOGUE
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKERS = 4
DAY_SECONDS = 24 * 3600


# The production hour is a figure for `make stress`; ten minutes ask every worker once just the same,
# in a sixth of the cycles.
@pytest.mark.parametrize("interval", [pytest.param(3600, marks=pytest.mark.scale), 600])
def test_given_a_steady_fleet_for_one_interval_then_each_worker_adds_four_items_and_every_one_expires(
    make_ctx: ContextFactory, live_worker: LiveWorkerFactory, interval: int
) -> None:
    ctx = make_ctx(
        OPERATIONS_CATALOGUE=json.dumps(CATALOGUE),
        SYSTEM_INFO_INTERVAL_SECONDS=str(interval),
        OPERATION_RETENTION_DAYS="14",
        AUDIT_RETENTION_DAYS="30",
    )
    for _ in range(WORKERS):
        live_worker(registered=True)  # their machines answer collect-system-info

    growth = steady_hour(ctx, WORKERS, start=utcnow(), cycles=interval // 60)

    # One collect-system-info a worker: the operation, its request and success, the information stored.
    assert growth.created == {
        "operation collect-system-info": WORKERS,
        "audit OperationRequested": WORKERS,
        "audit OperationSucceeded": WORKERS,
        "audit WorkerSystemInfoCollected": WORKERS,
    }
    assert growth.per_worker_day == 4 * DAY_SECONDS / interval  # 96 at the hourly default
    assert growth.kept_forever == 0
