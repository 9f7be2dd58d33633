"""Validation of domain records: bad input names the field and the reason."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from fleetkeeper.domain.drain_policy import (
    drain_deadline,
    estimated_completion,
    pool_drain_timeout,
    seconds_left,
    worker_drain_timeout,
)
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Instance, Pool, Worker, WorkerTemplate
from fleetkeeper.domain.placement import PlacementStrategy, rank_candidates, refusal_reason

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def worker(worker_id: str = "w-1", **overrides) -> Worker:
    fields = {
        "id": worker_id,
        "template": "lab",
        "region": "eu-west-1",
        "capacity": 4,
        "status": WorkerStatus.RUNNING,
    }
    fields.update(overrides)
    return Worker.model_validate(fields)


def field_errors(exc: ValidationError) -> dict[str, str]:
    return {".".join(str(p) for p in e["loc"]): e["msg"] for e in exc.errors()}


def test_given_negative_capacity_then_the_error_names_capacity():
    with pytest.raises(ValidationError) as raised:
        worker(capacity=-1)
    assert "capacity" in field_errors(raised.value)


def test_given_an_unknown_status_string_then_the_error_names_status():
    with pytest.raises(ValidationError) as raised:
        worker(status="SLEEPING")
    assert "status" in field_errors(raised.value)


def test_given_a_desired_status_that_is_not_a_goal_then_it_is_refused():
    with pytest.raises(ValidationError) as raised:
        worker(desired_status="DRAINING")
    assert "must be one of RUNNING, STOPPED, TERMINATED" in field_errors(raised.value)["desired_status"]


def test_given_a_negative_drain_timeout_then_the_template_is_refused():
    with pytest.raises(ValidationError) as raised:
        WorkerTemplate(
            name="t", instance_type="m5.large", ami_name_filter="x-*", capacity=2, drain_timeout_hours=-1
        )
    assert "drain_timeout_hours" in field_errors(raised.value)


def test_given_a_template_without_timeout_then_it_drains_for_four_hours():
    template = WorkerTemplate(name="t", instance_type="m5.large", ami_name_filter="x-*", capacity=2)
    assert template.drain_timeout_seconds == 4 * 3600


def test_given_a_bad_region_then_the_error_names_region():
    with pytest.raises(ValidationError) as raised:
        worker(region="Mars")
    assert "region" in field_errors(raised.value)


@pytest.mark.parametrize(("requested", "expected"), [(None, 300), (0, 300), (-5, 300), (120, 120)])
def test_given_a_pool_drain_timeout_then_absent_or_non_positive_means_300(requested, expected):
    assert pool_drain_timeout(requested) == expected


def test_given_a_pool_with_a_non_positive_stored_timeout_then_it_is_refused():
    with pytest.raises(ValidationError) as raised:
        Pool(name="labs", drain_timeout_seconds=0)
    assert "drain_timeout_seconds" in field_errors(raised.value)


def test_given_a_worker_drain_then_the_request_wins_over_the_template():
    template = WorkerTemplate(
        name="t", instance_type="m5.large", ami_name_filter="x-*", capacity=2, drain_timeout_hours=2
    )
    assert worker_drain_timeout(60, template) == 60
    assert worker_drain_timeout(0, template) == 7200
    assert worker_drain_timeout(None, None) == 4 * 3600


def test_given_active_instances_then_the_estimate_is_their_latest_end_capped_at_the_deadline():
    deadline = drain_deadline(NOW, 3600)
    early = Instance(id="i-1", worker_id="w", timeslot_end=NOW + timedelta(minutes=10))
    late = Instance(id="i-2", worker_id="w", timeslot_end=NOW + timedelta(minutes=30))
    beyond = Instance(id="i-3", worker_id="w", timeslot_end=NOW + timedelta(hours=5))
    open_ended = Instance(id="i-4", worker_id="w")
    assert estimated_completion([early, late], deadline, NOW) == NOW + timedelta(minutes=30)
    assert estimated_completion([early, beyond], deadline, NOW) == deadline
    assert estimated_completion([early, open_ended], deadline, NOW) == deadline
    assert estimated_completion([], deadline, NOW) == NOW


def test_given_a_passed_deadline_then_seconds_left_is_still_positive():
    assert seconds_left(NOW - timedelta(minutes=1), NOW) == 1
    assert seconds_left(NOW + timedelta(seconds=90), NOW) == 90


def test_given_workers_then_pack_prefers_the_fullest_and_spread_the_emptiest():
    workers = [
        worker("w-a", active_instances=1),
        worker("w-b", active_instances=3),
        worker("w-c", active_instances=4),  # full
        worker("w-d", active_instances=0, status=WorkerStatus.DRAINING),
    ]
    assert [w.id for w in rank_candidates(workers, PlacementStrategy.PACK)] == ["w-b", "w-a"]
    assert [w.id for w in rank_candidates(workers, PlacementStrategy.SPREAD)] == ["w-a", "w-b"]


def test_given_a_draining_worker_or_pool_then_placement_is_refused_with_a_reason():
    assert "DRAINING" in (refusal_reason(worker(status=WorkerStatus.DRAINING), None) or "")
    assert "draining" in (
        refusal_reason(worker(pool="labs"), Pool(name="labs", status=PoolStatus.DRAINING)) or ""
    )
    assert "full" in (refusal_reason(worker(active_instances=4), None) or "")
    assert refusal_reason(worker(), Pool(name="labs")) is None
