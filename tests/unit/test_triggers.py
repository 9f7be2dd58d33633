"""Trigger event models: Scheduler events, plain schedule input, EC2 events."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from fleetkeeper.domain.stagger import shard_starts
from fleetkeeper.triggers import (
    Ec2Event,
    Ec2RebalanceEvent,
    Ec2SpotWarningEvent,
    Ec2StateChangeEvent,
    HealthScheduledChangeEvent,
    schedule_input,
)

EVENTS = Path(__file__).resolve().parents[2] / "events"


def load(name: str) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((EVENTS / f"{name}.json").read_text())
    return loaded


def test_given_the_reconcile_schedule_input_then_it_names_its_task():
    request = schedule_input(load("scheduler_reconcile"))
    assert (request.task, request.target_regions) == ("reconcile", None)


def test_given_a_discovery_schedule_input_then_it_sweeps_its_region():
    assert schedule_input(load("scheduler_discover")).target_regions == ["us-east-1"]


def test_given_a_scheduled_event_without_input_then_it_means_the_configured_regions():
    assert schedule_input(load("scheduler_default_scheduled_event")).target_regions is None
    rule_event = {**load("scheduler_default_scheduled_event"), "source": "aws.events", "detail": {}}
    assert schedule_input(rule_event).target_regions is None


def test_given_plain_input_with_regions_then_they_are_read():
    assert schedule_input({"regions": ["eu-west-1"]}).target_regions == ["eu-west-1"]


def test_given_plain_input_with_a_bad_region_then_it_is_refused():
    with pytest.raises(ValidationError):
        schedule_input({"region": "Mars"})


@pytest.mark.parametrize(
    "name",
    [
        "ec2_state_change_pending",
        "ec2_state_change_running",
        "ec2_state_change_stopping",
        "ec2_state_change_stopped",
        "ec2_state_change_shutting_down",
        "ec2_state_change_terminated",
    ],
)
def test_given_each_state_change_sample_then_it_parses_as_a_state_change(name):
    parsed = Ec2Event.model_validate(load(name)).root
    assert isinstance(parsed, Ec2StateChangeEvent)
    assert parsed.detail.instance_id == "i-0abc1234def567890"


def test_given_the_spot_warning_sample_then_it_parses_as_a_spot_warning():
    parsed = Ec2Event.model_validate(load("ec2_spot_interruption_warning")).root
    assert isinstance(parsed, Ec2SpotWarningEvent)
    assert parsed.detail.instance_action == "terminate"


def test_given_the_rebalance_sample_then_it_parses_as_a_rebalance_recommendation():
    parsed = Ec2Event.model_validate(load("ec2_rebalance_recommendation")).root
    assert isinstance(parsed, Ec2RebalanceEvent)
    assert parsed.detail.instance_id == "i-0abc1234def567890"


def test_given_the_health_retirement_sample_then_it_names_the_machine_and_when_aws_acts():
    parsed = Ec2Event.model_validate(load("health_instance_retirement")).root
    assert isinstance(parsed, HealthScheduledChangeEvent)
    assert parsed.instance_ids == ["i-0abc1234def567890"]
    assert parsed.instance_region == "us-east-1"
    assert parsed.not_before is not None
    assert parsed.not_before.isoformat() == "2026-02-15T12:00:00+00:00"
    assert parsed.detail.event_type_code == "AWS_EC2_INSTANCE_RETIREMENT_SCHEDULED"


def test_given_a_health_event_of_another_service_or_category_then_it_does_not_parse():
    for field, value in (("service", "RDS"), ("eventTypeCategory", "issue")):
        event = load("health_instance_retirement")
        event["detail"] = {**event["detail"], field: value}  # type: ignore[dict-item]
        with pytest.raises(ValidationError):
            Ec2Event.model_validate(event)


def test_given_the_malformed_sample_then_it_does_not_parse():
    with pytest.raises(ValidationError):
        Ec2Event.model_validate(load("ec2_malformed"))


def test_given_a_shard_schedule_input_then_the_cycle_covers_that_shard():
    request = schedule_input(load("scheduler_reconcile_shard"))
    shard = request.reconcile_shard
    assert (shard.index, shard.count) == (1, 4)
    # Its start inside the period, as the stack writes it (domain/stagger.py) and the Scheduler fills it.
    assert request.start_delay_seconds == shard_starts(4, 1)[1].delay_seconds
    assert request.scheduled_time is not None
    assert request.scheduled_time.utcoffset() == timedelta(0)
    assert schedule_input(load("scheduler_reconcile")).reconcile_shard.count == 1


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"shard": 4, "shards": 4}, "shard must be below shards"),
        ({"shard": 0, "shards": 0}, "shards"),
        ({"shard": 0, "shards": 65}, "shards"),
        ({"shard": "1", "shards": 2}, "shard"),
        ({"shard": True, "shards": 2}, "shard"),
    ],
)
def test_given_an_impossible_shard_input_then_it_is_refused_naming_the_field(fields, named):
    with pytest.raises(ValidationError, match=named):
        schedule_input({"source": "fleetkeeper.schedule", "task": "reconcile", **fields})
