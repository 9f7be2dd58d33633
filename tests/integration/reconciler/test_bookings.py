"""Bookings through the real API and reconcile handlers: a future placement that finds no room waits
for capacity (202), is placed by the cycle on the worker it brought up, fails alerted when EC2 has no
capacity by its timeslot, takes no room once ended, and never overbooks max_workers."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.bookings import NO_CAPACITY_BY_TIMESLOT
from fleetkeeper.domain.errors import CapacityUnavailable
from fleetkeeper.domain.lead_time import LeadKind
from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper.domain.models import Instance, utcnow
from fleetkeeper.domain.placement import PlacementStrategy
from fleetkeeper.services import bookings
from fleetkeeper_local import ec2_time
from fleetkeeper_local.iam import as_function
from tests.integration.conftest import ControlPlane
from tests.integration.functions import reconcile_fleet

pytestmark = pytest.mark.integration

S = InstanceState
LAB = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 1}
LEAD = timedelta(minutes=10)  # the template's lead time: the default, with no launch measured yet
place_or_book = as_function("api", bookings.place_or_book)


def booking_pool(plane: ControlPlane, slots: int = 1, **policy: Any) -> None:
    assert plane.api("PUT", "/api/v1/templates/lab", {**LAB, "capacity": slots})[0] in (200, 201)
    wanted = {"template": "lab", "max_workers": 1, "bookings": True, **policy}
    status, body = plane.api("PUT", "/api/v1/pools/labs", {"capacity": wanted})
    assert status in (200, 201), body


def book(plane: ControlPlane, starts_in: timedelta, **extra: Any) -> tuple[int, Any]:
    start = (utcnow() + starts_in).isoformat()
    return plane.api("POST", "/api/v1/instances", {"pool": "labs", "timeslot_start": start, **extra})


def cycles_until(plane: ControlPlane, done: Callable[[], bool], start: datetime, limit: int = 8) -> int:
    """Run reconcile cycles a second apart until `done`; how many it took."""
    for n in range(limit):
        reconcile_fleet(plane.ctx, now=start + timedelta(seconds=n))
        if done():
            return n + 1
    raise AssertionError(f"not done after {limit} cycles")


@pytest.fixture
def alert_feed(control_plane: ControlPlane) -> Callable[[], list[Any]]:
    """Messages published to the operators' SNS topic, via an SQS subscription."""
    sqs = boto3.client("sqs")
    queue_url = sqs.create_queue(QueueName=f"alerts-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    boto3.client("sns").subscribe(
        TopicArn=control_plane.resources.topic_arn, Protocol="sqs", Endpoint=queue_arn
    )
    return lambda: [
        json.loads(m["Body"])
        for m in sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10).get("Messages", [])
    ]


def test_given_no_room_a_lead_time_ahead_then_the_booking_waits_and_the_cycle_places_it_on_a_new_worker(
    control_plane: ControlPlane, lab_image: str
) -> None:
    booking_pool(control_plane)

    status, booked = book(control_plane, timedelta(minutes=15))
    _, view = control_plane.api("GET", "/api/v1/pools/labs/capacity")

    assert status == 202, booked
    assert (booked["state"], booked["worker_id"]) == ("WAITING_FOR_CAPACITY", None)
    start = datetime.fromisoformat(booked["timeslot_start"])
    assert datetime.fromisoformat(booked["expected_ready_by"]) == start - LEAD
    assert (view["bookings_waiting"], view["bookings_due"], view["bookings_at_risk"]) == (1, 1, 0)
    assert (view["target"]["workers"], view["target"]["rule"], view["target"]["bookings_due"]) == (
        1,
        "bookings",
        1,
    )
    store = control_plane.ctx.store

    took = cycles_until(
        control_plane, lambda: store.get_instance(booked["id"]).state == S.SCHEDULED, utcnow()
    )

    placed = store.get_instance(booked["id"])
    worker = store.get_worker(placed.worker_id)
    assert took <= 4  # create, launch, RUNNING, placed
    assert (worker.status, worker.pool, worker.active_instances) == (WorkerStatus.RUNNING, "labs", 1)
    trail = store.audit_trail("worker", worker.id)
    assert trail[0].actor == "capacity"
    placing = [e for e in store.audit_trail("instance", placed.id) if e.action == "InstancePlaced"]
    assert [(e.from_status, e.to_status) for e in placing] == [("WAITING_FOR_CAPACITY", "SCHEDULED")]
    assert control_plane.ctx.capacity.bookings_waiting("labs") == 0
    _, read = control_plane.api("GET", f"/api/v1/instances/{placed.id}")
    assert (read["state"], read["worker_id"]) == ("SCHEDULED", worker.id)


def test_given_no_ec2_capacity_then_the_booking_is_at_risk_and_fails_alerted_at_its_timeslot(
    control_plane: ControlPlane,
    lab_image: str,
    ec2: Any,
    alert_feed: Callable[[], list[Any]],
    audit_feed: Callable[[], list[str]],
) -> None:
    booking_pool(control_plane)
    ec2_time.set_capacity(ec2, "m5.large", available=False)
    _, booked = book(control_plane, timedelta(minutes=15))
    start = datetime.fromisoformat(booked["timeslot_start"])
    ctx = control_plane.ctx

    due = reconcile_fleet(ctx, now=start - timedelta(minutes=14))
    refused = reconcile_fleet(ctx, now=start - timedelta(minutes=13))
    at_risk = reconcile_fleet(ctx, now=start - timedelta(minutes=5))
    failed = reconcile_fleet(ctx, now=start)

    assert (due.counters["capacity_workers_created"], due.counters["bookings_due"]) == (1, 1)
    assert refused.counters["launches_refused_for_capacity"] == 1
    assert at_risk.counters["bookings_at_risk"] == 1
    assert failed.counters["bookings_failed"] == 1
    instance = ctx.store.get_instance(booked["id"])
    assert (instance.state, instance.reason, instance.worker_id) == (S.FAILED, NO_CAPACITY_BY_TIMESLOT, "")
    ended = [e for e in ctx.store.audit_trail("instance", instance.id) if e.action == "InstanceFailed"]
    assert [(e.from_status, e.reason) for e in ended] == [("WAITING_FOR_CAPACITY", NO_CAPACITY_BY_TIMESLOT)]
    assert "InstanceBookingFailed" in audit_feed()
    alerts = [json.loads(m["Message"]) for m in alert_feed()]
    assert [(a["instance_id"], a["reason"]) for a in alerts] == [(instance.id, NO_CAPACITY_BY_TIMESLOT)]
    assert ctx.capacity.bookings_waiting("labs") == 0
    # Failed once: a later cycle has nothing left to fail.
    assert reconcile_fleet(ctx, now=start + timedelta(minutes=1)).counters["bookings_failed"] == 0


def test_given_a_waiting_booking_ended_then_it_takes_no_room_and_releases_it_once(
    control_plane: ControlPlane,
) -> None:
    booking_pool(control_plane)  # room for one booking: max_workers 1 x 1 slot
    _, first = book(control_plane, timedelta(hours=2))
    full_status, full = book(control_plane, timedelta(hours=2))

    ended_status, ended = control_plane.api(
        "POST", f"/api/v1/instances/{first['id']}/state", {"state": "TERMINATED", "reason": "cancelled"}
    )
    again_status, _ = control_plane.api(
        "POST", f"/api/v1/instances/{first['id']}/state", {"state": "TERMINATED"}
    )
    after_status, after = book(control_plane, timedelta(hours=2))

    assert (full_status, full["error"]) == (409, "NO_CAPACITY")
    assert (ended_status, ended["state"], ended["worker_id"]) == (200, "TERMINATED", None)
    assert again_status == 409
    assert (after_status, after["state"]) == (202, "WAITING_FOR_CAPACITY")
    assert control_plane.ctx.capacity.bookings_waiting("labs") == 1
    _, view = control_plane.api("GET", "/api/v1/pools/labs/capacity")
    assert (view["bookings_waiting"], view["bookings_due"]) == (1, 0)
    # The ended booking is no longer in the pool's queue: the cycle that reaches its timeslot fails only
    # the one still waiting.
    report = reconcile_fleet(control_plane.ctx, now=datetime.fromisoformat(after["timeslot_start"]))
    assert report.counters["bookings_failed"] == 1
    assert control_plane.ctx.store.get_instance(first["id"]).state == S.TERMINATED


def test_given_two_bookings_racing_for_the_last_room_then_one_waits_and_one_is_refused(
    control_plane: ControlPlane,
) -> None:
    booking_pool(control_plane)
    timeslot = utcnow() + timedelta(hours=1)
    barrier = threading.Barrier(2)
    outcomes: list[Instance | CapacityUnavailable] = []

    def request() -> None:
        barrier.wait()
        try:
            outcomes.append(
                place_or_book(
                    control_plane.ctx,
                    actor="test",
                    template=None,
                    pool="labs",
                    worker_id=None,
                    strategy=PlacementStrategy.PACK,
                    timeslot_start=timeslot,
                    timeslot_end=None,
                )
            )
        except CapacityUnavailable as refused:
            outcomes.append(refused)

    threads = [threading.Thread(target=request) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    waiting = [o for o in outcomes if isinstance(o, Instance)]
    assert [o.state for o in waiting] == [S.WAITING_FOR_CAPACITY]
    assert len(outcomes) == 2
    assert control_plane.ctx.capacity.bookings_waiting("labs") == 1


@pytest.mark.parametrize(
    ("policy", "starts_in", "why"),
    [
        ({"bookings": False}, timedelta(hours=1), "the pool does not book"),
        ({}, timedelta(minutes=9), "less than the lead time ahead"),
        ({}, None, "no timeslot"),
    ],
)
def test_given_a_placement_that_cannot_wait_then_no_room_is_still_409(
    control_plane: ControlPlane, policy: dict[str, Any], starts_in: timedelta | None, why: str
) -> None:
    booking_pool(control_plane, **policy)

    if starts_in is None:
        status, body = control_plane.api("POST", "/api/v1/instances", {"pool": "labs"})
    else:
        status, body = book(control_plane, starts_in)

    assert (status, body["error"]) == (409, "NO_CAPACITY"), why
    assert control_plane.ctx.capacity.bookings_waiting("labs") == 0


def test_given_a_measured_lead_time_then_it_sets_how_far_ahead_a_booking_may_wait(
    control_plane: ControlPlane,
) -> None:
    booking_pool(control_plane, max_workers=2)  # room for two: only the lead time refuses the second
    for seconds in (100.0, 110.0, 120.0, 90.0, 95.0):
        control_plane.ctx.store.add_lead_sample("lab", LeadKind.LAUNCH, seconds)

    status, booked = book(control_plane, timedelta(minutes=3))
    _, view = control_plane.api("GET", "/api/v1/pools/labs/capacity")

    assert status == 202, booked
    start = datetime.fromisoformat(booked["timeslot_start"])
    assert datetime.fromisoformat(booked["expected_ready_by"]) == start - timedelta(seconds=120)
    assert view["lead_time_seconds"] == 120
    assert book(control_plane, timedelta(seconds=90))[0] == 409  # less than the lead time ahead


def test_given_a_booking_placed_on_the_worker_brought_up_for_it_then_scale_in_keeps_that_worker(
    control_plane: ControlPlane, lab_image: str
) -> None:
    # Two slots a worker: the booking leaves one free, so the worker is not full and scale-in could take it.
    booking_pool(control_plane, slots=2)
    _, booked = book(control_plane, timedelta(minutes=15))
    store = control_plane.ctx.store
    cycles_until(control_plane, lambda: store.get_instance(booked["id"]).state == S.SCHEDULED, utcnow())
    worker_id = store.get_instance(booked["id"]).worker_id

    # The launch beat its lead time: the booking's timeslot is still more than a lead time ahead.
    report = reconcile_fleet(control_plane.ctx, now=utcnow() + timedelta(seconds=30))

    worker = store.get_worker(worker_id)
    assert (worker.status, worker.owner) == (WorkerStatus.RUNNING, None)
    assert report.counters["scale_in_drain_count"] == 0
    assert store.get_instance(booked["id"]).state == S.SCHEDULED


def test_given_a_booking_waiting_when_a_worker_empties_then_scale_in_leaves_it_for_the_booking(
    control_plane: ControlPlane, lab_image: str
) -> None:
    booking_pool(control_plane, max_workers=2, min_workers=1)
    store = control_plane.ctx.store
    cycles_until(
        control_plane,
        lambda: any(w.status == WorkerStatus.RUNNING for w in store.workers_in_pool("labs")),
        utcnow(),
    )
    _, walk_in = control_plane.api("POST", "/api/v1/instances", {"pool": "labs"})
    booking_pool(control_plane, max_workers=2)  # min_workers back to 0: only the booking needs a worker
    status, booked = book(control_plane, timedelta(minutes=15))
    assert status == 202, booked
    # The walk-in ends: its worker is empty, and the booking waiting is due.
    assert (
        control_plane.api("POST", f"/api/v1/instances/{walk_in['id']}/state", {"state": "COMPLETED"})[0]
        == 200
    )

    report = reconcile_fleet(control_plane.ctx, now=utcnow())

    worker = store.get_worker(walk_in["worker_id"])
    assert (worker.status, worker.active_instances) == (WorkerStatus.RUNNING, 1)
    assert store.get_instance(booked["id"]).worker_id == worker.id
    assert report.counters["capacity_workers_created"] == 0


def test_given_more_bookings_due_than_a_cycle_looks_at_then_the_target_counts_them_all(
    control_plane: ControlPlane, lab_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bookings, "MAX_BOOKINGS_PER_CYCLE", 2)
    booking_pool(control_plane, max_workers=5)
    booked = [book(control_plane, timedelta(minutes=15)) for _ in range(3)]
    assert [status for status, _ in booked] == [202, 202, 202]

    _, view = control_plane.api("GET", "/api/v1/pools/labs/capacity")
    report = reconcile_fleet(control_plane.ctx, now=utcnow())

    assert (view["bookings_due"], view["target"]["workers"]) == (3, 3)
    assert (report.counters["bookings_due"], report.counters["capacity_workers_created"]) == (3, 3)


def test_given_a_booking_waiting_then_bookings_cannot_be_turned_off_until_it_ends(
    control_plane: ControlPlane,
) -> None:
    booking_pool(control_plane)
    _, booked = book(control_plane, timedelta(hours=1))
    off = {"template": "lab", "max_workers": 1, "bookings": False}

    # Nothing would place or fail a booking left in a pool that no longer books.
    refused = [control_plane.api("PUT", "/api/v1/pools/labs", {"capacity": c}) for c in ({}, off)]
    ended, _ = control_plane.api(
        "POST", f"/api/v1/instances/{booked['id']}/state", {"state": "TERMINATED", "reason": "cancelled"}
    )
    removed, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"capacity": {}})

    assert [(status, body["error"], body["details"]["field"]) for status, body in refused] == [
        (409, "CONFLICT", "capacity.bookings")
    ] * 2
    assert (ended, removed) == (200, 200)
    assert not control_plane.ctx.store.get_pool("labs").capacity.bookings


def test_given_bookings_turned_off_after_a_booking_read_the_pool_then_its_write_is_refused(
    control_plane: ControlPlane,
) -> None:
    booking_pool(control_plane)
    # What a booking that read the pool while it booked writes once the policy is gone.
    assert control_plane.api("PUT", "/api/v1/pools/labs", {"capacity": {}})[0] == 200
    late = Instance(id="i-late", worker_id="", pool="labs", timeslot_start=utcnow() + timedelta(hours=1))

    with pytest.raises(CapacityUnavailable, match="no longer books"):
        control_plane.ctx.store.book_instance(late, room=1, actor="test")

    assert control_plane.ctx.capacity.bookings_waiting("labs") == 0
    assert control_plane.ctx.store.find_instance("i-late") is None


def test_given_a_new_template_then_a_booking_for_the_pool_takes_it_and_one_for_a_template_keeps_its_own(
    control_plane: ControlPlane, lab_image: str
) -> None:
    booking_pool(control_plane, max_workers=2)
    _, for_pool = book(control_plane, timedelta(minutes=15))
    _, for_lab = book(control_plane, timedelta(minutes=15), template="lab")
    assert (for_pool["template"], for_lab["template"]) == (None, "lab")
    assert control_plane.api("PUT", "/api/v1/templates/lab-v2", LAB)[0] in (200, 201)
    wanted = {"template": "lab-v2", "max_workers": 2, "bookings": True}
    assert control_plane.api("PUT", "/api/v1/pools/labs", {"capacity": wanted})[0] == 200
    store, ctx = control_plane.ctx.store, control_plane.ctx

    _, view = control_plane.api("GET", "/api/v1/pools/labs/capacity")
    cycles_until(control_plane, lambda: store.get_instance(for_pool["id"]).state == S.SCHEDULED, utcnow())

    # Only the booking the new template's workers can take asks for one.
    assert (view["bookings_waiting"], view["bookings_due"], view["target"]["workers"]) == (2, 1, 1)
    placed = store.get_instance(for_pool["id"])
    assert (placed.template, store.get_worker(placed.worker_id).template) == ("lab-v2", "lab-v2")
    made = [w for w in store.workers_in_pool("labs") if w.status != WorkerStatus.TERMINATED]
    assert [w.template for w in made] == ["lab-v2"]
    # The booking for lab is not put on the lab-v2 worker, and fails alerted at its timeslot.
    kept = store.get_instance(for_lab["id"])
    assert (kept.state, kept.template) == (S.WAITING_FOR_CAPACITY, "lab")
    report = reconcile_fleet(ctx, now=datetime.fromisoformat(for_lab["timeslot_start"]))
    assert report.counters["bookings_failed"] == 1
    assert store.get_instance(for_lab["id"]).reason == NO_CAPACITY_BY_TIMESLOT
