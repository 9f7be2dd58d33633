"""Two reconcile cycles at once never launch two machines for one worker."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.services import workers
from fleetkeeper.services.reconcile import CycleReport
from fleetkeeper.store.stats import StatsStore
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import ensure_template, instances_tagged

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKERS = 6


def run_two_cycles_at_once(make_ctx: Any) -> list[CycleReport]:
    barrier = threading.Barrier(2)
    reports: list[CycleReport] = []
    lock = threading.Lock()

    def cycle(owner: str) -> None:
        ctx = make_ctx()
        barrier.wait()
        report = reconcile_fleet(ctx, owner=owner)
        with lock:
            reports.append(report)

    threads = [threading.Thread(target=cycle, args=(f"cycle-{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return reports


def pending_fleet(store: Any) -> list[str]:
    ensure_template(store)
    return [
        workers.create_worker(store, template="lab", region="us-east-1", actor="test").id
        for _ in range(WORKERS)
    ]


def test_given_two_concurrent_cycles_then_one_holds_the_lease_and_each_worker_gets_one_machine(
    make_ctx, store, ec2, lab_image
):
    ids = pending_fleet(store)

    reports = run_two_cycles_at_once(make_ctx)

    assert len(reports) == 2
    assert sum(r.lease_acquired for r in reports) >= 1
    for worker_id in ids:
        assert len(instances_tagged(ec2, worker_id)) == 1
    launched = sum(r.counters["provisioned_count"] for r in reports)
    assert launched == WORKERS


def test_given_the_lease_bypassed_then_the_per_worker_launch_claim_still_prevents_double_launches(
    make_ctx, store, ec2, lab_image, monkeypatch
):
    # A cycle that outlived its lease is the case the per-worker claim exists for.
    monkeypatch.setattr(StatsStore, "acquire_lease", lambda *_args, **_kwargs: True)
    ids = pending_fleet(store)

    reports = run_two_cycles_at_once(make_ctx)

    assert all(r.lease_acquired for r in reports)
    for worker_id in ids:
        assert len(instances_tagged(ec2, worker_id)) == 1
        assert store.get_worker(worker_id).status == WorkerStatus.PROVISIONING
    assert sum(r.counters["provisioned_count"] for r in reports) == WORKERS
