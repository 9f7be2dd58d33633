"""Parallel reconcile shards: each worker is handled by exactly one shard per cycle, the shards never wait
on each other, and the fleet-wide scale-down limits hold across them."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.cloud.fleet_reads import describe_instances
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Instance, Worker, utcnow
from fleetkeeper.domain.sharding import Shard, shard_of
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE
from fleetkeeper.services import workers
from fleetkeeper.services.reconcile import CycleReport
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.support import ensure_template, instances_tagged

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SHARDS = 3
WORKERS = 18


def in_every_shard(make: Callable[[], Worker], *, each: int = 2) -> list[Worker]:
    """Workers made until every shard owns at least `each` of them (ids are random)."""
    made: list[Worker] = []
    while min(Counter(shard_of(w.id, SHARDS) for w in made).get(i, 0) for i in range(SHARDS)) < each:
        made.append(make())
    return made


def run_shards_at_once(make_ctx: Callable[..., Any], count: int, **settings: str) -> list[CycleReport]:
    """One cycle per shard, all started together, as one schedule per shard starts them, on a stage
    configured for `count` shards."""
    barrier = threading.Barrier(count)
    reports: list[CycleReport] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def cycle(index: int) -> None:
        ctx = make_ctx(RECONCILE_SHARDS=str(count), **settings)
        barrier.wait()
        try:
            report = reconcile_fleet(ctx, shard=Shard(index, count), owner=f"shard-{index}")
        except BaseException as error:  # surfaced below: a thread's exception would vanish
            with lock:
                failures.append(error)
            return
        with lock:
            reports.append(report)

    threads = [threading.Thread(target=cycle, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    return sorted(reports, key=lambda r: r.shard.index)


def test_given_three_shards_at_once_then_every_worker_is_launched_once_by_its_own_shard(
    make_ctx, store, ec2, lab_image
):
    ensure_template(store)
    ids = [
        workers.create_worker(store, template="lab", region="us-east-1", actor="test").id
        for _ in range(WORKERS)
    ]
    expected = Counter(shard_of(worker_id, SHARDS) for worker_id in ids)

    reports = run_shards_at_once(make_ctx, SHARDS)

    # Each shard took its own lease, so none skipped its turn for another.
    assert [r.lease_acquired for r in reports] == [True] * SHARDS
    assert [r.workers for r in reports] == [expected[index] for index in range(SHARDS)]
    # EC2's RunInstances request bucket (the AWS rules) may turn some of a burst of launches away: such
    # a worker stays PENDING, launched by no shard, and says why; every other one has exactly one machine.
    deferred: Counter[int] = Counter()
    for worker_id in ids:
        worker = store.get_worker(worker_id)
        if worker.status == WorkerStatus.PENDING:
            assert "RequestLimitExceeded" in (worker.last_reconcile_error or ""), worker_id
            assert instances_tagged(ec2, worker_id) == [], worker_id
            deferred[shard_of(worker_id, SHARDS)] += 1
        else:
            assert worker.status == WorkerStatus.PROVISIONING, worker_id
            assert len(instances_tagged(ec2, worker_id)) == 1, worker_id
    assert [r.counters["provisioned_count"] + deferred[r.shard.index] for r in reports] == [
        expected[index] for index in range(SHARDS)
    ]


def test_given_shards_then_each_worker_appears_in_exactly_one_shards_cycle(make_ctx, store, live_worker):
    fleet = [live_worker() for _ in range(9)]

    reports = run_shards_at_once(make_ctx, SHARDS)

    assert sum(r.workers for r in reports) == len(fleet)
    # Every shard has the fleet-wide counts (the counters), and the lead alone reports them.
    assert all(r.by_status[WorkerStatus.RUNNING] == len(fleet) for r in reports)
    stats = make_ctx().stats
    assert stats.read("reconcile").gauges["running_worker_count"] == len(fleet)
    for report in reports:
        own = stats.read(f"reconcile#{report.shard.index + 1}of{SHARDS}")
        assert own.gauges["last_cycle_workers"] == report.workers
        assert "last_completed_at" in own.timestamps


class WorkerReads:
    """The worker items one client's calls returned: from the bucket index, from the legacy indexes, and
    read by key."""

    def __init__(self, dynamodb: Any) -> None:
        self._events = dynamodb.meta.events
        self.from_bucket_index: Counter[str] = Counter()
        self.from_legacy_indexes: Counter[str] = Counter()
        self.read_by_key: Counter[str] = Counter()

    def __enter__(self) -> WorkerReads:
        self._events.register("provide-client-params.dynamodb.*", self._params, unique_id="shard-reads-p")
        self._events.register("after-call.dynamodb.*", self._answer, unique_id="shard-reads-a")
        return self

    def __exit__(self, *_: object) -> None:
        self._events.unregister("provide-client-params.dynamodb.*", unique_id="shard-reads-p")
        self._events.unregister("after-call.dynamodb.*", unique_id="shard-reads-a")

    @staticmethod
    def _params(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["shard_reads"] = params

    def _answer(self, parsed: dict[str, Any], context: dict[str, Any], model: Any, **_: Any) -> None:
        params = context.get("shard_reads", {})
        if model.name == "Query":
            ids = [i["PK"]["S"] for i in parsed.get("Items", []) if i.get("SK", {}).get("S") == "WORKER"]
            into = (
                self.from_bucket_index if params.get("IndexName") == "by_shard" else self.from_legacy_indexes
            )
            into.update(ids)
        elif model.name == "BatchGetItem":
            for table in parsed.get("Responses", {}).values():
                self.read_by_key.update(i["PK"]["S"] for i in table if i.get("SK", {}).get("S") == "WORKER")


def test_given_a_fleet_then_each_shard_reads_its_own_workers_and_no_other(make_ctx, store, live_worker):
    fleet = in_every_shard(live_worker, each=3)

    for index in range(SHARDS):
        ctx = make_ctx(RECONCILE_SHARDS=str(SHARDS))
        own = Counter(f"WORKER#{w.id}" for w in fleet if shard_of(w.id, SHARDS) == index)
        with WorkerReads(ctx.store._client) as reads:
            report = reconcile_fleet(ctx, shard=Shard(index, SHARDS), owner=f"shard-{index}")

        assert report.workers == len(own)
        # Each of its workers once from the index, once by key; nothing of another shard's.
        assert reads.from_bucket_index == own
        assert reads.read_by_key == own
        assert not reads.from_legacy_indexes
        # The fleet-wide counts still cover every worker: they come from the counters.
        assert report.by_status[WorkerStatus.RUNNING] == len(fleet)


def test_given_idle_workers_of_one_scope_in_every_shard_then_one_scale_down_per_cooldown_in_all(
    make_ctx, store, live_worker
):
    fleet = in_every_shard(live_worker)  # one scope that spans every shard
    idle = utcnow() - timedelta(hours=2)
    for worker in fleet:
        store.update_worker(worker, {"idle_since": idle}, actor="test", action="IdleSeeded")

    reports = run_shards_at_once(
        make_ctx,
        SHARDS,
        SCALE_DOWN_ENABLED="true",
        IDLE_WINDOW_SECONDS="1800",
        SCALE_DOWN_COOLDOWN_SECONDS="3600",
        METRICS_INTERVAL_SECONDS="0",
    )

    stopped = [w.id for w in fleet if store.get_worker(w.id).status == WorkerStatus.STOPPING]
    assert len(stopped) == 1
    assert sum(r.counters["scale_down_stop_count"] for r in reports) == 1
    # Every other idle worker was held by the cooldown: read at the start of its shard's cycle, or lost
    # to the conditional claim of the shard that stopped one first.
    assert sum(r.counters["scale_down_refused_cooldown"] for r in reports) == len(fleet) - 1


def test_given_idle_busy_workers_in_every_shard_then_the_drains_of_all_shards_stay_within_the_budget(
    make_ctx, store, live_worker, drains_started
):
    """Each idle worker has a scope of its own (no cooldown in the way) and holds a session, so
    scaling it down is a drain; two may run fleet-wide. Every shard has candidates."""
    scopes = iter(range(1000))

    def idle_candidate() -> Worker:
        template = f"lab{next(scopes)}"
        worker = live_worker(template=template)
        live_worker(template=template)  # the scope's other worker keeps it above its minimum
        store.place_instance(Instance(id=f"i-{worker.id}", worker_id=""), worker, actor="test")
        idle: Worker = store.update_worker(
            store.get_worker(worker.id),
            {"idle_since": utcnow() - timedelta(hours=2)},
            actor="test",
            action="IdleSeeded",
        )
        return idle

    fleet = in_every_shard(idle_candidate)
    settings = {
        "SCALE_DOWN_ENABLED": "true",
        "IDLE_WINDOW_SECONDS": "1800",
        "SCALE_DOWN_COOLDOWN_SECONDS": "60",
        "MAX_CONCURRENT_DRAINS": "2",
        "METRICS_INTERVAL_SECONDS": "0",
    }

    def start_drains() -> int:
        before = len(drains_started)
        run_shards_at_once(make_ctx, SHARDS, **settings)
        return len(drains_started) - before

    # Each shard sees two drains' worth of room in what it read; the door's writes carry the budget as
    # their condition, so the budget is filled once across all three, not once per shard.
    assert start_drains() == 2
    assert start_drains() == 0
    draining = [w.id for w in fleet if store.get_worker(w.id).status == WorkerStatus.DRAINING]
    assert len(draining) == 2


def test_given_one_scope_idle_in_every_shard_and_no_cooldown_then_its_minimum_holds_across_shards(
    make_ctx, store, live_worker
):
    fleet = in_every_shard(live_worker)
    for worker in fleet:
        store.update_worker(
            worker, {"idle_since": utcnow() - timedelta(hours=2)}, actor="test", action="IdleSeeded"
        )
    minimum = len(fleet) - 2

    reports = run_shards_at_once(
        make_ctx,
        SHARDS,
        SCALE_DOWN_ENABLED="true",
        IDLE_WINDOW_SECONDS="1800",
        SCALE_DOWN_COOLDOWN_SECONDS="0",
        MIN_WORKERS=str(minimum),
        # The stage default would allow only a few; the minimum is what this test holds.
        MAX_CONCURRENT_DRAINS="100%",
        METRICS_INTERVAL_SECONDS="0",
    )

    # Every shard reads the whole scope idle and two above its minimum: without the door's condition on
    # the scope's count each would stop two of its own.
    running = [w.id for w in fleet if store.get_worker(w.id).status == WorkerStatus.RUNNING]
    assert len(running) == minimum
    assert sum(r.counters["scale_down_stop_count"] for r in reports) == 2


def test_given_a_shards_share_of_a_region_then_it_reads_its_own_instances_by_id_not_the_whole_region(
    ctx, ec2, lab_image
):
    launched = ec2.run_instances(
        ImageId=lab_image,
        InstanceType="m5.large",
        MinCount=450,
        MaxCount=450,
        TagSpecifications=[
            {"ResourceType": "instance", "Tags": [{"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE}]}
        ],
    )["Instances"]
    ids = {raw["InstanceId"] for raw in launched}
    share = set(sorted(ids)[:210])  # about a third would be one of three shards; past one call's 200
    gateway = ctx.ec2("us-east-1")
    filters: list[str] = []
    gateway._client.meta.events.register(
        "provide-client-params.ec2.DescribeInstances",
        lambda params, **_: filters.extend(f["Name"] for f in params.get("Filters", [])),
    )

    own = describe_instances(gateway, share, managed_in_region=len(ids))
    whole = describe_instances(gateway, ids, managed_in_region=len(ids))

    assert set(own) == share
    assert set(whole) == ids
    # The share: two calls by instance id. The whole region: one listing by the managed-by tag.
    assert filters == ["instance-id", "instance-id", f"tag:{MANAGED_BY_TAG}"]
