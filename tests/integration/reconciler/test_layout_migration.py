"""A table the earlier release wrote (no buckets, fleet-wide index keys, no counters, no pool gates) is
migrated online by the reconciler, in bounded pages per cycle, and every read sees every worker
throughout."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lifecycle import InstanceState, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Instance, Pool, Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.sharding import Shard, shard_of
from fleetkeeper.services import layout, placement
from fleetkeeper.services.reconcile import reconcile_fleet
from fleetkeeper.store.codec import record_attributes, serialize
from fleetkeeper.store.layout import LAYOUT_KEY
from fleetkeeper.store.repository import FleetStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# ---- what the earlier release wrote, frozen here (its store/keys.py) --------------------------------


def earlier_worker_item(worker: Worker, active_ids: list[str]) -> dict[str, Any]:
    item: dict[str, Any] = {
        "PK": f"WORKER#{worker.id}",
        "SK": "WORKER",
        "GSI1PK": f"WORKER#{worker.status}",
        "GSI1SK": f"{worker.region}#{worker.template}#{worker.id}",
        "GSI3PK": "KIND#WORKER",
        "GSI3SK": worker.id,
        **record_attributes(worker),
    }
    if worker.pool:
        item["GSI2PK"] = f"POOL#{worker.pool}"
        item["GSI2SK"] = f"WORKER#{worker.id}"
    if active_ids:
        item["active_instance_ids"] = set(active_ids)
    return item


def earlier_instance_item(instance: Instance) -> dict[str, Any]:
    return {
        "PK": f"INSTANCE#{instance.id}",
        "SK": "INSTANCE",
        "GSI1PK": f"INSTANCE#{instance.state}",
        "GSI1SK": f"{instance.worker_id}#{instance.id}",
        "GSI2PK": f"WORKER#{instance.worker_id}",
        "GSI2SK": f"INSTANCE#{instance.id}",
        "GSI3PK": "KIND#INSTANCE",
        "GSI3SK": instance.id,
        **record_attributes(instance),
    }


def earlier_template_item(template: WorkerTemplate) -> dict[str, Any]:
    return {
        "PK": f"TEMPLATE#{template.name}",
        "SK": "TEMPLATE",
        "GSI3PK": "KIND#TEMPLATE",
        "GSI3SK": template.name,
        **record_attributes(template),
    }


def earlier_pool_item(pool: Pool) -> dict[str, Any]:
    return {
        "PK": f"POOL#{pool.name}",
        "SK": "POOL",
        "GSI3PK": "KIND#POOL",
        "GSI3SK": pool.name,
        **record_attributes(pool),
    }


STATUSES = [WorkerStatus.RUNNING] * 14 + [WorkerStatus.STOPPED] * 4 + [WorkerStatus.TERMINATED] * 3
STATUSES += [WorkerStatus.FAILED] * 2  # the reconciler retires these: new writes on legacy items


@pytest.fixture
def earlier_table(store: FleetStore) -> dict[str, Any]:
    """The table as the earlier release left it: its items, and no layout marker."""
    client = store._client
    client.delete_item(TableName=store.table_name, Key=serialize(LAYOUT_KEY))
    items: list[dict[str, Any]] = []
    for name in ("lab", "gpu"):
        items.append(
            earlier_template_item(
                WorkerTemplate(
                    name=name, instance_type="m5.large", ami_name_filter="lab-*", capacity=4, version=1
                )
            )
        )
    items.append(earlier_pool_item(Pool(name="labs", version=1)))
    fleet: list[Worker] = []
    instances: list[Instance] = []
    for n, status in enumerate(STATUSES):
        pool = "labs" if n % 2 == 0 else None
        worker_id = f"w-{n:016x}"
        active = [f"i-{n:04d}-a"] if status == WorkerStatus.RUNNING and pool else []
        worker = Worker(
            id=worker_id,
            template="lab" if n % 3 else "gpu",
            region="us-east-1",
            pool=pool,
            status=status,
            capacity=4,
            active_instances=len(active),
            version=3,
        )
        fleet.append(worker)
        items.append(earlier_worker_item(worker, active))
        for instance_id in active:
            instances.append(
                Instance(id=instance_id, worker_id=worker_id, template=worker.template, pool=pool, version=1)
            )
        if n < 5:
            instances.append(
                Instance(id=f"i-{n:04d}-old", worker_id=worker_id, state=InstanceState.COMPLETED, version=2)
            )
    items += [earlier_instance_item(i) for i in instances]
    for item in items:
        client.put_item(TableName=store.table_name, Item=serialize(item))
    return {"fleet": fleet, "instances": instances}


def every_worker(store: FleetStore) -> list[Worker]:
    found: list[Worker] = []
    token = None
    while True:
        page = store.list_workers(limit=7, next_token=token)
        found += page.items
        token = page.next_token
        if token is None:
            return found


def every_instance(store: FleetStore, state: InstanceState | None = None) -> set[str]:
    found: set[str] = set()
    token = None
    while True:
        page = store.list_instances(state=state, limit=3, next_token=token)
        found |= {i.id for i in page.items}
        token = page.next_token
        if token is None:
            return found


def legacy_partition(store: FleetStore, kind: str) -> list[dict[str, Any]]:
    return list(
        store._query_all(
            IndexName="by_kind",
            KeyConditionExpression="GSI3PK = :k",
            ExpressionAttributeValues={":k": {"S": f"KIND#{kind}"}},
        )
    )


def truth(store: FleetStore, fleet: list[Worker]) -> FleetCounts:
    return FleetCounts.of(store.get_workers([w.id for w in fleet]))


def test_given_a_table_the_earlier_release_wrote_then_the_reconciler_migrates_it_online(
    make_ctx, earlier_table, monkeypatch
):
    fleet: list[Worker] = earlier_table["fleet"]
    instances: list[Instance] = earlier_table["instances"]
    ids = {w.id for w in fleet}
    monkeypatch.setattr(layout, "ITEMS_PER_CYCLE", 8)
    monkeypatch.setattr(layout, "PAGE_ITEMS", 5)

    # Before: the old read path, and it sees every worker.
    ctx = make_ctx()
    assert not ctx.store.layout().done
    assert {w.id for w in every_worker(ctx.store)} == ids
    assert every_instance(ctx.store) == {i.id for i in instances}

    first = reconcile_fleet(ctx)

    # One bounded page of the backfill per cycle, its progress in the report and in the stats.
    assert first.completed
    assert first.counters["layout_workers_counted"] == 8
    assert first.counters["layout_pools_gated"] == 1
    assert first.by_status[WorkerStatus.RUNNING] == STATUSES.count(WorkerStatus.RUNNING)
    gauges = make_ctx().stats.read("layout").gauges
    assert (gauges["done"], gauges["workers_counted"]) == (0, 8)
    # Meanwhile every read still sees every worker.
    assert {w.id for w in every_worker(make_ctx().store)} == ids

    cycles = 1
    while not make_ctx().store.layout().done:
        report = reconcile_fleet(make_ctx())
        assert report.completed
        assert not report.counters["layout_errors"]
        cycles += 1
        assert cycles <= 12, "the migration does not finish"

    # Three cycles counted the 23 workers (8 a cycle), and a pass that found nothing more confirmed it.
    assert cycles >= 4
    after = make_ctx()
    assert after.store.layout().done
    assert make_ctx().stats.read("layout").gauges["done"] == 1
    # The FAILED workers were retired by the cycles, on items not counted yet: counted once, where
    # they ended.
    assert after.store.fleet_counts() == truth(after.store, fleet)
    assert after.store.fleet_counts().by_status[WorkerStatus.TERMINATED] == 5
    assert {w.id for w in every_worker(after.store)} == ids
    # A shard now reads its own buckets, and the fleet's counts come from the counters.
    shard = Shard(1, 3)
    own = {w.id for w in after.store.iter_workers_by_status([WorkerStatus.RUNNING], shard=shard)}
    assert own == {w.id for w in fleet if w.status == WorkerStatus.RUNNING and shard_of(w.id, 3) == 1}
    # Placement into the pool checks the pool's gates, which the migration wrote.
    placed = placement.place_instance(after.store, actor="t", pool="labs")
    assert after.store.get_instance(placed.id).pool == "labs"

    # Past the grace, the legacy attributes go: the legacy listings empty, every read still whole.
    after.store._client.update_item(
        TableName=after.store.table_name,
        Key=serialize(LAYOUT_KEY),
        UpdateExpression="SET legacy_until = :t",
        ExpressionAttributeValues={":t": {"S": (utcnow() - timedelta(seconds=1)).isoformat()}},
    )
    for _ in range(6):
        reconcile_fleet(make_ctx())
        if not legacy_partition(after.store, "WORKER") and not legacy_partition(after.store, "INSTANCE"):
            break
    assert legacy_partition(after.store, "WORKER") == []
    assert legacy_partition(after.store, "INSTANCE") == []
    clean = make_ctx().store
    assert {w.id for w in every_worker(clean)} == ids
    assert every_instance(clean) == {i.id for i in instances} | {placed.id}
    assert every_instance(clean, InstanceState.COMPLETED) == {i.id for i in instances if not i.is_active}
    assert clean.fleet_counts() == truth(clean, fleet)


def test_given_an_earlier_release_still_writing_after_the_migration_then_the_next_cycle_repairs_it(
    make_ctx, earlier_table
):
    fleet: list[Worker] = earlier_table["fleet"]
    for _ in range(4):
        reconcile_fleet(make_ctx())
    assert make_ctx().store.layout().done
    store = make_ctx().store
    store._client.update_item(
        TableName=store.table_name,
        Key=serialize(LAYOUT_KEY),
        UpdateExpression="SET legacy_until = :t",
        ExpressionAttributeValues={":t": {"S": (utcnow() - timedelta(seconds=1)).isoformat()}},
    )
    running = next(w for w in fleet if w.status == WorkerStatus.RUNNING and not w.pool)
    current = store.get_worker(running.id)
    # A process of the earlier release (a deploy's overlap, a rollback) stops the worker its way: new
    # status, its own index keys, no counter moved.
    stopped = current.model_copy(update={"status": WorkerStatus.STOPPED, "version": current.version + 1})
    store._client.update_item(
        TableName=store.table_name,
        Key=serialize({"PK": f"WORKER#{running.id}", "SK": "WORKER"}),
        UpdateExpression="SET #s = :s, #v = :v, GSI1PK = :g1, GSI3PK = :g3, GSI3SK = :id",
        ExpressionAttributeNames={"#s": "status", "#v": "version"},
        ExpressionAttributeValues={
            ":s": {"S": "STOPPED"},
            ":v": {"N": str(stopped.version)},
            ":g1": {"S": "WORKER#STOPPED"},
            ":g3": {"S": "KIND#WORKER"},
            ":id": {"S": running.id},
        },
    )
    assert store.fleet_counts() != truth(store, fleet)

    report = reconcile_fleet(make_ctx())

    assert report.counters["layout_workers_cleaned"] >= 1
    assert store.fleet_counts() == truth(store, fleet)
    assert Counter(w.status for w in store.iter_workers_by_status([WorkerStatus.STOPPED])) == Counter(
        {WorkerStatus.STOPPED: STATUSES.count(WorkerStatus.STOPPED) + 1}
    )


def test_given_a_pool_drain_during_the_migration_then_its_gates_close_with_it(make_ctx, earlier_table):
    ctx = make_ctx()
    reconcile_fleet(ctx)  # the first cycle gates the pools
    pool = ctx.store.get_pool("labs")

    ctx.store.save_pool(pool, {"status": PoolStatus.DRAINING}, actor="t", action="PoolDrainStarted")

    gates = ctx.store._batch_get_items([{"PK": f"POOLGATE#labs#{n:02d}", "SK": "GATE"} for n in range(16)])
    assert sorted(str(g["status"]["S"]) for g in gates) == ["draining"] * 16
