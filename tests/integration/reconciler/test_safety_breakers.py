"""Safety breakers of discovery: orphan GC's circuit breaker, and the import grace of young machines."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.cloud.events import EVENT_SOURCE
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.orphan_breaker import OrphanBreaker
from fleetkeeper.services.worker_exit import retire_worker
from fleetkeeper.store.repository import FleetStore
from tests.integration.conftest import ControlPlane
from tests.integration.functions import discover_and_collect
from tests.integration.reconciler.support import ensure_template, launch

pytestmark = pytest.mark.integration

REGION = "us-east-1"


@pytest.fixture
def fleet(live_worker: Any, running_worker: Any) -> tuple[list[Worker], list[Worker]]:
    """Five workers: three on live machines, two whose machines EC2 has never heard of (40 %)."""
    alive = [live_worker() for _ in range(3)]
    vanished = [running_worker(template="lab") for _ in range(2)]
    return alive, vanished


def audit_listener(bus: str) -> Callable[[], list[dict[str, Any]]]:
    """A queue subscribed to the audit bus's orphan GC events; the returned call drains it."""
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName="orphan-gc-audit")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    events = boto3.client("events")
    pattern = {"source": [EVENT_SOURCE], "detail-type": [{"prefix": "Orphan GC"}]}
    events.put_rule(Name="orphan-gc-audit", EventBusName=bus, EventPattern=json.dumps(pattern))
    events.put_targets(Rule="orphan-gc-audit", EventBusName=bus, Targets=[{"Id": "queue", "Arn": arn}])

    def received() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        while messages := sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages"):
            found.extend(json.loads(m["Body"]) for m in messages)
            for m in messages:
                sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
        return found

    return received


def statuses(store: FleetStore, workers: list[Worker]) -> set[WorkerStatus]:
    return {store.get_worker(w.id).status for w in workers}


def test_given_two_of_five_workers_orphaned_then_gc_holds_both_back_and_names_them(make_ctx, store, fleet):
    ctx = make_ctx(ORPHAN_GC_MAX_SHARE_PERCENT="20")
    _, vanished = fleet
    held = sorted(w.id for w in vanished)

    report = discover_and_collect(ctx)
    again = discover_and_collect(ctx)

    assert statuses(store, vanished) == {WorkerStatus.RUNNING}
    assert (report.counters["orphans_held_back"], report.counters["orphans_terminated"]) == (2, 0)
    region = report.as_dict()["regions"][0]
    assert (region["orphan_gc_breaker"], region["orphans_held_back"]) == ("hold", held)
    breaker = ctx.breakers.read(REGION)
    assert breaker is not None
    assert breaker.held is not None
    assert (ctx.breakers.ids(REGION, breaker.held), breaker.live_workers, breaker.share_percent) == (
        held,
        5,
        40.0,
    )
    # The same held-back set on the next pass: still held, and the breaker's item is not rewritten.
    assert again.counters["orphans_held_back"] == 2
    assert ctx.breakers.read(REGION) == breaker


def test_given_the_share_falls_within_the_limit_then_gc_resumes_by_itself(make_ctx, store, fleet):
    ctx = make_ctx(ORPHAN_GC_MAX_SHARE_PERCENT="30")
    _, (first, second) = fleet
    discover_and_collect(ctx)
    # An operator retires one of them by hand: one orphan of four live workers is 25 %.
    retire_worker(ctx, store.get_worker(first.id), cause=Cause.EC2, actor="alice", reason="checked by hand")

    report = discover_and_collect(ctx)

    assert store.get_worker(second.id).status == WorkerStatus.TERMINATED
    assert (report.counters["orphans_held_back"], report.counters["orphans_terminated"]) == (0, 1)
    breaker = ctx.breakers.read(REGION)
    assert breaker is not None
    assert (breaker.held, breaker.tripped_at) == (None, None)


def test_given_an_operator_confirms_through_the_api_then_the_next_pass_retires_the_held_back_set_once(
    control_plane: ControlPlane, make_ctx, store, fleet
):
    ctx = make_ctx(ORPHAN_GC_MAX_SHARE_PERCENT="20")
    _, vanished = fleet
    held = sorted(w.id for w in vanished)
    audit_events = audit_listener(ctx.settings.audit_bus_name)
    assert control_plane.api("POST", "/api/v1/reconcile/orphans/confirm", {"region": REGION})[0] == 409
    not_a_region = control_plane.api("POST", "/api/v1/reconcile/orphans/confirm", {"region": "Mars 1"})
    discover_and_collect(ctx)

    status, listed = control_plane.api("GET", "/api/v1/reconcile/orphans")
    stale = control_plane.api(
        "POST", "/api/v1/reconcile/orphans/confirm", {"region": REGION, "worker_ids": ["w-x"]}
    )
    status_confirmed, confirmed = control_plane.api(
        "POST", "/api/v1/reconcile/orphans/confirm", {"region": REGION, "worker_ids": held}, caller="alice"
    )
    report = discover_and_collect(ctx)

    assert not_a_region[0] == 422
    assert {d["field"] for d in not_a_region[1]["details"]} == {"body.region"}
    assert status == 200
    assert [(b["region"], b["holding"], b["held_back"]) for b in listed["items"]] == [(REGION, True, held)]
    assert stale[0] == 409
    assert status_confirmed == 200, confirmed
    assert confirmed["confirmed_ids"] == held
    assert confirmed["confirmed_until"] is not None
    assert statuses(store, vanished) == {WorkerStatus.TERMINATED}
    assert report.counters["orphans_terminated"] == 2
    # The confirmation was spent by that pass: nothing is held back, and nothing is left to confirm.
    _, after = control_plane.api("GET", "/api/v1/reconcile/orphans")
    assert [(b["holding"], b["confirmed_until"]) for b in after["items"]] == [(False, None)]
    assert control_plane.api("POST", "/api/v1/reconcile/orphans/confirm", {"region": REGION})[0] == 409
    published = [(e["detail-type"], e["detail"]) for e in audit_events()]
    assert [kind for kind, _ in published] == [
        "Orphan GC Held Back",
        "Orphan GC Confirmed",
        "Orphan GC Resumed",
    ]
    assert all(detail["worker_ids"] == held for _, detail in published)
    assert (published[1][1]["confirmed_by"], published[2][1]["how"]) == ("alice", "confirmed")


def test_given_a_machine_launched_seconds_ago_then_discovery_imports_it_only_after_the_grace(
    make_ctx, store, ec2, lab_image
):
    ctx = make_ctx(IMPORT_GRACE_SECONDS="30")
    ensure_template(store)
    launch(ec2, "w-00000000young", lab_image)

    early = discover_and_collect(ctx)
    late = discover_and_collect(ctx, now=utcnow() + timedelta(seconds=31))

    assert (early.counters["import_deferred"], early.counters["imported"]) == (1, 0)
    assert late.counters["imported"] == 1
    assert store.get_worker("w-00000000young").status == WorkerStatus.RUNNING


def test_given_two_writers_of_one_breaker_then_the_one_holding_a_stale_read_gets_a_typed_conflict(ctx):
    held = ctx.breakers.write_ids("eu-west-3", ["w-a"])
    first = ctx.breakers.save(None, OrphanBreaker(region="eu-west-3", held=held))
    confirmed = ctx.breakers.save(first, first.model_copy(update={"confirmed": held, "confirmed_by": "bob"}))

    with pytest.raises(StaleWrite):
        ctx.breakers.save(first, first.model_copy(update={"held": None}))
    with pytest.raises(StaleWrite):
        ctx.breakers.save(None, OrphanBreaker(region="eu-west-3"))

    assert ctx.breakers.read("eu-west-3") == confirmed
    assert ctx.breakers.ids("eu-west-3", held) == ["w-a"]  # held and confirmed share their pages
    assert [b.region for b in ctx.breakers.list_all()] == ["eu-west-3"]
