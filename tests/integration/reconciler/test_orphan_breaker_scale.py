"""Orphan GC's breaker at the size of the mass disappearance it exists for.

Its sets of worker ids are pages beside a small head item, so holding back 50,000 workers (with the
longest ids a worker can have) writes no item near DynamoDB's limit, the set is shown page by page,
confirmed by its fingerprint and decided exactly; a discovery run over 1,500 vanished workers (two pages
of the held-back set) holds them,
and once confirmed retires them in bounded passes until the last one resumes the breaker.
"""

from __future__ import annotations

import itertools
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.orphan_breaker import BreakerDecision, OrphanBreaker, fingerprint
from fleetkeeper.services import orphan_gc
from fleetkeeper.services.context import Context
from fleetkeeper.services.discovery import discover_and_collect
from fleetkeeper.store.breakers import PAGE_BUDGET_BYTES, PAGE_MAX_IDS, breaker_key
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.item_size import item_size
from fleetkeeper.store.machine_keys import machine_key_item, migration_key
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.bounds import batch_write, seed_workers
from fleetkeeper_local.faults import unhooked_client
from tests.integration.conftest import ControlPlane
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory
from tests.integration.reconciler.support import ensure_template

pytestmark = pytest.mark.integration

REGION = "us-east-1"
# The longest worker id there can be: discovery imports a machine under its worker-id tag, and EC2
# tag values are up to 256 characters.
LONGEST_ID = 256
# A discovery run's worth of vanished workers: more than one page of the held-back set (PAGE_MAX_IDS).
# The 50,000-worker test below holds the set at its largest; this one follows it through discovery.
VANISHED = 1500
# Orphans a discovery run retires once the set is confirmed: a few, so two runs show the bound.
RETIRE_PER_RUN = 10


def long_ids(count: int) -> list[str]:
    return [f"w-{n:08d}-".ljust(LONGEST_ID, "x") for n in range(count)]


def partition_items(ctx: Context, region: str) -> list[dict[str, Any]]:
    """Every item of the region's breaker partition (head and pages), read consistently.

    This is the test's own inspection, not the product's: reading 13 MB from one partition at once is
    more than a partition serves per second, so it reads outside the AWS rules rather than be throttled.
    """
    client = unhooked_client("dynamodb", REGION)
    request: dict[str, Any] = {
        "TableName": ctx.settings.table_name,
        "KeyConditionExpression": "PK = :pk",
        "ExpressionAttributeValues": {":pk": {"S": breaker_key(region)["PK"]}},
        "ConsistentRead": True,
    }
    found: list[dict[str, Any]] = []
    while True:
        page = client.query(**request)
        found.extend(page["Items"])
        if not page.get("LastEvaluatedKey"):
            return found
        request["ExclusiveStartKey"] = page["LastEvaluatedKey"]


# The full size is a scale figure (`make stress`); `make test` holds ten pages of the longest ids.
@pytest.mark.slow
@pytest.mark.parametrize("count", [pytest.param(50_000, marks=pytest.mark.scale), 2_500])
def test_given_50000_held_back_workers_with_the_longest_ids_then_every_item_stays_small_and_the_set_is_exact(
    control_plane: ControlPlane, count: int
) -> None:
    ctx = control_plane.ctx
    held = long_ids(count)
    now = utcnow()

    first = orphan_gc.gate(ctx, REGION, held, live=count * 6 // 5, now=now)
    status, listed = control_plane.api("GET", "/api/v1/reconcile/orphans")
    confirmed = control_plane.api(
        "POST",
        "/api/v1/reconcile/orphans/confirm",
        {"region": REGION, "held_back_set": listed["items"][0]["held_back_set"]},
    )
    covered = orphan_gc.gate(
        ctx, REGION, held[: count * 4 // 5], live=count * 11 // 10, now=now, retire_per_pass=1000
    )
    one_more = orphan_gc.gate(ctx, REGION, [*held[:100], "w-never-seen"], live=200, now=now)

    assert first is BreakerDecision.HOLD
    assert status == 200
    [view] = listed["items"]
    assert (view["held_back_count"], view["held_back"]) == (count, held[:100])
    assert view["held_back_set"] == fingerprint(held)
    assert confirmed[0] == 200, confirmed
    assert confirmed[1]["confirmed_count"] == count
    assert covered is BreakerDecision.CONFIRMED  # a subset of the confirmed set, read from its pages
    assert one_more is BreakerDecision.HOLD  # a suspect the operator never saw
    items = partition_items(ctx, REGION)
    sizes = sorted(item_size(i) for i in items)
    pages = [i for i in items if i["SK"]["S"] != "BREAKER"]
    # Two held-back sets were written (the last one holds 101 workers); the first is still confirmed.
    assert sum(len(p["ids"]["L"]) for p in pages) == count + 101
    assert sizes[-1] <= PAGE_BUDGET_BYTES
    head = next(i for i in items if i["SK"]["S"] == "BREAKER")
    assert item_size(head) < 1024


def test_given_the_held_back_set_then_the_api_pages_through_it_and_refuses_to_mix_two_sets(
    control_plane: ControlPlane,
) -> None:
    ctx = control_plane.ctx
    held = sorted(f"w-{n:016x}" for n in range(2 * PAGE_MAX_IDS + 7))
    orphan_gc.gate(ctx, REGION, held, live=len(held), now=utcnow())
    path = f"/api/v1/reconcile/orphans/{REGION}/held-back"

    pages = [control_plane.api("GET", path)]
    while pages[-1][1]["next_token"]:
        token, fp = pages[-1][1]["next_token"], pages[0][1]["held_back_set"]
        pages.append(control_plane.api("GET", path, query={"next_token": token, "held_back_set": fp}))
    orphan_gc.gate(ctx, REGION, held[1:], live=len(held), now=utcnow())
    changed = control_plane.api(
        "GET", path, query={"next_token": pages[0][1]["next_token"], "held_back_set": fingerprint(held)}
    )
    elsewhere = control_plane.api("GET", "/api/v1/reconcile/orphans/eu-north-1/held-back")
    not_a_region = control_plane.api("GET", "/api/v1/reconcile/orphans/Mars/held-back")

    assert [status for status, _ in pages] == [200, 200, 200]
    assert [len(body["items"]) for _, body in pages] == [PAGE_MAX_IDS, PAGE_MAX_IDS, 7]
    assert [i for _, body in pages for i in body["items"]] == held
    assert {body["count"] for _, body in pages} == {len(held)}
    assert changed[0] == 409
    assert elsewhere == (
        200,
        {"region": "eu-north-1", "held_back_set": None, "count": 0, "items": [], "next_token": None},
    )
    assert not_a_region[0] == 422


# At 1,500 a scale figure (`make stress`); `make test` runs the fewest that still fill two pages.
@pytest.mark.slow
@pytest.mark.parametrize("count", [pytest.param(VANISHED, marks=pytest.mark.scale), PAGE_MAX_IDS + 1])
def test_given_1500_vanished_workers_then_discovery_holds_them_and_once_confirmed_retires_them_run_by_run(
    control_plane: ControlPlane,
    make_ctx: ContextFactory,
    store: FleetStore,
    live_worker: LiveWorkerFactory,
    count: int,
) -> None:
    ctx = make_ctx(ORPHAN_GC_MAX_SHARE_PERCENT="20", ORPHAN_GC_MAX_RETIRE_PER_RUN=str(RETIRE_PER_RUN))
    alive = [live_worker() for _ in range(3)]
    ids = itertools.count(0x5000)
    vanished = [
        Worker(
            id=f"w-{n:016x}",
            template="lab",
            region=REGION,
            status=WorkerStatus.RUNNING,
            ec2_instance_id=f"i-{n:017x}",
            capacity=4,
            version=1,
        )
        for n in itertools.islice(ids, count)
    ]
    seed_workers(store, vanished)
    # As this release writes a fleet: each machine's key item, so discovery has no backfill to do.
    keys = [item for item in map(machine_key_item, vanished) if item is not None]
    batch_write(store._client, store.table_name, [*keys, {**migration_key(REGION), "done": True}])
    held = sorted(w.id for w in vanished)

    holding = discover_and_collect(ctx)
    region = holding.as_dict()["regions"][0]
    _, view = control_plane.api("GET", "/api/v1/reconcile/orphans")
    confirmed = control_plane.api(
        "POST",
        "/api/v1/reconcile/orphans/confirm",
        {"region": REGION, "held_back_set": view["items"][0]["held_back_set"]},
    )
    before = ctx.breakers.read(REGION)
    passes = [discover_and_collect(ctx, now=utcnow() + timedelta(minutes=5 * n)) for n in (1, 2)]
    after = ctx.breakers.read(REGION)

    assert (holding.counters["orphans_held_back"], holding.counters["orphans_terminated"]) == (count, 0)
    # The run's answer names 100 of them, the counters count them all.
    assert (len(region["orphans"]), len(region["orphans_held_back"])) == (100, 100)
    assert view["items"][0]["held_back_count"] == count
    assert view["items"][0]["held_back_set"] == fingerprint(held)
    assert confirmed[0] == 200, confirmed
    retire = RETIRE_PER_RUN
    assert [(p.counters["orphans_terminated"], p.counters["orphans_deferred"]) for p in passes] == [
        (retire, count - retire),
        (retire, count - 2 * retire),
    ]
    assert Counter(store.get_worker(w.id).status for w in alive) == {WorkerStatus.RUNNING: 3}
    statuses = Counter(w.status for w in store.get_workers([w.id for w in vanished]))
    assert statuses == {WorkerStatus.TERMINATED: 2 * retire, WorkerStatus.RUNNING: count - 2 * retire}
    # The confirmation is in use, not spent, and lives on while its workers are being retired.
    assert before is not None
    assert after is not None
    assert after.confirmed == before.confirmed
    assert before.confirmed_until is not None
    assert after.confirmed_until is not None
    assert after.confirmed_until > before.confirmed_until


def test_given_a_confirmed_set_larger_than_a_pass_then_passes_retire_it_all_and_the_last_one_resumes(
    make_ctx: ContextFactory, store: FleetStore, live_worker: LiveWorkerFactory, running_worker: Any
) -> None:
    ctx = make_ctx(ORPHAN_GC_MAX_SHARE_PERCENT="20", ORPHAN_GC_MAX_RETIRE_PER_RUN="3")
    [live_worker() for _ in range(3)]
    vanished = [running_worker(template="lab") for _ in range(7)]
    discover_and_collect(ctx)
    orphan_gc.confirm(ctx, REGION, actor="alice")

    passes = [discover_and_collect(ctx, now=utcnow() + timedelta(minutes=5 * n)) for n in (1, 2, 3, 4)]

    assert [p.counters["orphans_terminated"] for p in passes] == [3, 3, 1, 0]
    assert [p.regions[0].breaker for p in passes] == [
        BreakerDecision.CONFIRMED,
        BreakerDecision.CONFIRMED,
        BreakerDecision.CONFIRMED,
        BreakerDecision.CLOSED,
    ]
    assert {store.get_worker(w.id).status for w in vanished} == {WorkerStatus.TERMINATED}
    breaker = ctx.breakers.read(REGION)
    assert breaker is not None
    assert (breaker.held, breaker.confirmed, breaker.confirmed_until) == (None, None, None)
    assert [i["SK"]["S"] for i in partition_items(ctx, REGION)] == ["BREAKER"]  # every page collected


def test_given_writers_that_lost_or_died_then_only_the_pages_the_breaker_refers_to_remain(
    make_ctx: ContextFactory,
) -> None:
    ctx = make_ctx()
    ensure_template(ctx.store)
    breakers = ctx.breakers
    first = breakers.save(None, OrphanBreaker(region=REGION, held=breakers.write_ids(REGION, ["w-a"])))
    # A writer that read no breaker at all loses the race: it deletes its own pages.
    losing = breakers.write_ids(REGION, ["w-b"])
    with pytest.raises(StaleWrite):
        breakers.save(None, OrphanBreaker(region=REGION, held=losing))
    breakers.discard(REGION, losing)
    # One died between its pages and the head an hour ago; one is writing its pages right now.
    dead = breakers.write_ids(REGION, ["w-c"], now=utcnow() - timedelta(hours=1))
    at_work = breakers.write_ids(REGION, ["w-d"])

    second = breakers.save(first, first.model_copy(update={"held": breakers.write_ids(REGION, ["w-e"])}))

    assert second.held is not None
    pages = [str(i["SK"]["S"]) for i in partition_items(ctx, REGION) if i["SK"]["S"] != "BREAKER"]
    left = {sk.split("#")[1] for sk in pages}
    assert left == {second.held.pages_key, at_work.pages_key}
    assert first.held is not None
    assert {losing.pages_key, dead.pages_key, first.held.pages_key}.isdisjoint(left)
    assert breakers.ids(REGION, second.held) == ["w-e"]


def test_given_every_page_of_a_50000_set_then_each_fits_its_budget_by_dynamodb_s_formula() -> None:
    from fleetkeeper.store.breakers import _pages_of

    for ids in (long_ids(50_000), [f"w-{n:016x}" for n in range(50_000)]):
        pages = _pages_of(REGION, "0123456789abcdef", ids, utcnow())
        assert [i for p in pages for i in p["ids"]] == ids
        assert max(item_size(serialize(p)) for p in pages) <= PAGE_BUDGET_BYTES
        assert max(len(p["ids"]) for p in pages) <= PAGE_MAX_IDS
