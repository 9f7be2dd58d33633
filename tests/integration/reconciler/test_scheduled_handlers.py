"""The reconcile and discover handlers, invoked with the events in events/ as the Scheduler sends them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.sharding import shard_of
from fleetkeeper.services import workers
from fleetkeeper.services.context import default_context
from fleetkeeper_local.invocation import invoke
from tests.integration.reconciler.support import ensure_template

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("handler_context")]

EVENTS = Path(__file__).resolve().parents[3] / "events"


def event(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((EVENTS / f"{name}.json").read_text())
    return loaded


def test_given_the_scheduler_event_then_the_reconcile_handler_runs_a_cycle(store, lab_image):
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", actor="api")

    result = invoke("reconcile", event("scheduler_reconcile"))

    assert result["lease_acquired"] is True
    assert result["counters"]["provisioned_count"] == 1
    assert store.get_worker(worker.id).status == WorkerStatus.PROVISIONING


def test_given_the_scheduler_event_then_the_discover_handler_sweeps_the_region(
    store, running_worker, monkeypatch
):
    # One worker of one is all of the region: the circuit breaker would hold it back.
    monkeypatch.setenv("ORPHAN_GC_MAX_SHARE_PERCENT", "100")
    orphan = running_worker(template="lab")

    result = invoke("discover", event("scheduler_discover"))

    assert [r["region"] for r in result["regions"]] == ["us-east-1"]
    assert result["counters"]["orphans_terminated"] == 1
    assert store.get_worker(orphan.id).status == WorkerStatus.TERMINATED


def test_given_a_plain_input_naming_regions_then_discovery_covers_those(store, ec2):
    result = invoke("discover", {"regions": ["us-east-2"]})

    assert [r["region"] for r in result["regions"]] == ["us-east-2"]


def test_given_a_shard_schedule_then_the_handler_reconciles_that_shard_only(store, lab_image, monkeypatch):
    monkeypatch.setenv("RECONCILE_SHARDS", "4")
    ensure_template(store)
    created = [
        workers.create_worker(store, template="lab", region="us-east-1", actor="api") for _ in range(8)
    ]
    mine = [w.id for w in created if shard_of(w.id, 4) == 1]

    result = invoke("reconcile", event("scheduler_reconcile_shard"))

    assert (result["shard"], result["shards"], result["lease_acquired"]) == (1, 4, True)
    assert result["workers"] == len(mine)
    assert result["counters"].get("provisioned_count", 0) == len(mine)
    launched = {w.id for w in created if store.get_worker(w.id).status == WorkerStatus.PROVISIONING}
    assert launched == set(mine)


def test_given_a_shard_schedule_on_an_unsharded_stage_then_the_cycle_is_refused_and_touches_nothing(
    store, lab_image
):
    ensure_template(store)
    worker = workers.create_worker(store, template="lab", region="us-east-1", actor="api")

    result = invoke("reconcile", event("scheduler_reconcile_shard"))

    assert (result["lease_acquired"], result["workers"]) == (False, 0)
    assert "this stage runs 1 reconcile shard(s)" in result["refused"]
    assert result["counters"] == {"shard_mismatch": 1}
    assert store.get_worker(worker.id).status == WorkerStatus.PENDING
    assert default_context().stats.read("reconcile").counters == {"shard_mismatch": 1}
