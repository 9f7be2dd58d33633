"""Every datetime that enters the domain is timezone-aware UTC: naive ones are refused naming the field."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from pydantic import ValidationError

from fleetkeeper.domain.models import AuditEvent, DrainRecord, Instance, Pool, Worker, WorkerMetrics
from fleetkeeper.store.codec import load_record, record_attributes, serialize

NAIVE = datetime(2026, 11, 22, 12, 0)
PARIS = timezone(timedelta(hours=1))


def error_fields(exc: ValidationError) -> set[str]:
    return {".".join(str(p) for p in e["loc"]) for e in exc.errors()}


@pytest.mark.parametrize("field", ["timeslot_start", "timeslot_end", "created_at", "updated_at"])
def test_given_a_naive_instance_time_then_it_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Instance.model_validate({"id": "i-1", "worker_id": "w-1", field: NAIVE})

    assert error_fields(raised.value) == {field}
    assert "timezone" in raised.value.errors()[0]["msg"]


@pytest.mark.parametrize(
    "field", ["ec2_observed_at", "next_reconcile_at", "launch_claimed_at", "idle_since", "created_at"]
)
def test_given_a_naive_worker_time_then_it_is_refused_naming_the_field(field: str) -> None:
    with pytest.raises(ValidationError) as raised:
        Worker.model_validate(
            {"id": "w-1", "template": "lab", "region": "eu-west-1", "capacity": 1, field: NAIVE}
        )

    assert error_fields(raised.value) == {field}


def test_given_naive_times_in_nested_and_other_records_then_each_is_refused() -> None:
    aware = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    with pytest.raises(ValidationError) as raised:
        DrainRecord(generation=1, started_at=aware, deadline=NAIVE, timeout_seconds=60, requested_by="t")
    assert error_fields(raised.value) == {"deadline"}
    with pytest.raises(ValidationError):
        WorkerMetrics(collected_at=NAIVE)
    with pytest.raises(ValidationError):
        Pool(name="p", drain_started_at=NAIVE)
    with pytest.raises(ValidationError):
        AuditEvent(entity="worker", entity_id="w", action="a", actor="t", at=NAIVE)


def test_given_an_aware_time_in_another_zone_then_it_is_held_in_utc() -> None:
    instance = Instance(id="i-1", worker_id="w-1", timeslot_start=datetime(2026, 11, 22, 13, 0, tzinfo=PARIS))

    assert instance.timeslot_start == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
    assert instance.timeslot_start is not None
    assert instance.timeslot_start.utcoffset() == timedelta(0)


def test_given_a_stored_record_then_it_loads_back_aware_and_equal() -> None:
    worker = Worker(
        id="w-1",
        template="lab",
        region="eu-west-1",
        capacity=1,
        idle_since=datetime(2026, 11, 22, 12, 0, tzinfo=UTC),
    )

    loaded = load_record(Worker, serialize(record_attributes(worker)))

    assert loaded == worker
    assert loaded.created_at.tzinfo is not None


def test_given_a_stored_item_written_with_an_offset_string_then_it_loads() -> None:
    item = serialize(
        {
            "id": "i-1",
            "worker_id": "w-1",
            "timeslot_start": "2026-11-22T12:00:00+00:00",
            "created_at": "2026-11-22T12:00:00.123456+00:00",
            "updated_at": "2026-11-22T12:00:00Z",
        }
    )

    loaded = load_record(Instance, item)

    assert loaded.timeslot_start == datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
