"""Schedules drive reconcile and discovery; EventBridge rules deliver EC2 events; all with a DLQ."""

from __future__ import annotations

import json

from infra.triggers import EC2_REBALANCE_RECOMMENDATION, EC2_SPOT_INTERRUPTION, EC2_STATE_CHANGE, HEALTH_EVENT
from tests.infra.helpers import function_logical_id, properties, resources


def schedule_key(payload):
    """task:region, and #shard for a sharded reconcile schedule."""
    key = f"{payload['task']}:{payload.get('region', '')}"
    return key + (f"#{payload['shard']}" if "shard" in payload else "")


def schedules(template):
    return {
        schedule_key(json.loads(schedule["Target"]["Input"])): schedule
        for schedule in properties(template, "AWS::Scheduler::Schedule")
    }


def undelivered_queue(template):
    queues = [
        logical
        for logical in resources(template, "AWS::SQS::Queue")
        if logical.startswith("MessagingUndeliveredEvents")
    ]
    assert len(queues) == 1
    return queues[0]


def test_given_dev_then_reconcile_runs_every_minute_and_discovery_every_five(dev):
    found = schedules(dev)
    assert set(found) == {"reconcile:", "discover:eu-west-1"}
    assert found["reconcile:"]["ScheduleExpression"] == "rate(1 minute)"
    assert found["discover:eu-west-1"]["ScheduleExpression"] == "rate(5 minutes)"


def test_given_two_worker_regions_then_each_has_its_discovery_schedule_at_the_stage_rate(pinned):
    found = schedules(pinned)
    assert {key for key in found if key.startswith("discover")} == {
        "discover:eu-west-1",
        "discover:us-east-1",
    }
    assert {found[key]["ScheduleExpression"] for key in found if key.startswith("discover")} == {
        "rate(10 minutes)"
    }


def test_given_three_reconcile_shards_then_one_schedule_each_names_its_shard_at_the_stage_rate(pinned, dev):
    found = schedules(pinned)
    reconcile = {key: found[key] for key in found if key.startswith("reconcile")}
    assert set(reconcile) == {"reconcile:#0", "reconcile:#1", "reconcile:#2"}
    for key, schedule in reconcile.items():
        payload = json.loads(schedule["Target"]["Input"])
        assert (payload["shard"], payload["shards"]) == (int(key[-1]), 3)
        assert schedule["Target"]["Arn"] == {
            "Fn::GetAtt": [function_logical_id(pinned, "fleetkeeper-pinned-reconcile"), "Arn"]
        }
    # Staggered inside the 2-minute period: shards 1 and 2 at minute 0 of it (the second waits 7.5 s
    # after the due time the Scheduler passes in), shard 3 at minute 1.
    starts = {
        key: (
            reconcile[key]["ScheduleExpression"],
            json.loads(reconcile[key]["Target"]["Input"]).get("start_delay_seconds"),
        )
        for key in reconcile
    }
    assert starts == {
        "reconcile:#0": ("cron(0/2 * * * ? *)", None),
        "reconcile:#1": ("cron(0/2 * * * ? *)", 7.5),
        "reconcile:#2": ("cron(1/2 * * * ? *)", None),
    }
    assert json.loads(reconcile["reconcile:#1"]["Target"]["Input"])["scheduled_time"] == (
        "<aws.scheduler.scheduled-time>"
    )
    # An unsharded stage keeps its one schedule, whose input names no shard.
    assert json.loads(schedules(dev)["reconcile:"]["Target"]["Input"]) == {
        "source": "fleetkeeper.schedule",
        "task": "reconcile",
    }


def test_given_the_schedules_then_each_targets_its_function_with_retries_and_the_dlq(dev):
    found = schedules(dev)
    dlq = undelivered_queue(dev)
    targets = {"reconcile:": "fleetkeeper-dev-reconcile", "discover:eu-west-1": "fleetkeeper-dev-discover"}
    for key, function in targets.items():
        target = found[key]["Target"]
        assert target["Arn"] == {"Fn::GetAtt": [function_logical_id(dev, function), "Arn"]}
        assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": [dlq, "Arn"]}
        assert target["RetryPolicy"]["MaximumRetryAttempts"] >= 1
        assert target["RetryPolicy"]["MaximumEventAgeInSeconds"] >= 60
    assert found["reconcile:"]["Target"]["RetryPolicy"]["MaximumEventAgeInSeconds"] == 60


def test_given_the_ec2_rules_then_state_changes_spot_warnings_and_health_changes_reach_ec2_events(dev):
    rules = properties(dev, "AWS::Events::Rule")
    detail_types = sorted(rule["EventPattern"]["detail-type"][0] for rule in rules)
    assert detail_types == sorted([EC2_STATE_CHANGE, EC2_SPOT_INTERRUPTION, HEALTH_EVENT])
    ec2_events = function_logical_id(dev, "fleetkeeper-dev-ec2-events")
    dlq = undelivered_queue(dev)
    for rule in rules:
        health = rule["EventPattern"]["detail-type"] == [HEALTH_EVENT]
        assert rule["EventPattern"]["source"] == (["aws.health"] if health else ["aws.ec2"])
        if health:
            # Only EC2's scheduled changes: no invocation for any other Health event.
            assert rule["EventPattern"]["detail"] == {
                "service": ["EC2"],
                "eventTypeCategory": ["scheduledChange"],
            }
        assert "EventBusName" not in rule, "EC2 publishes on the default bus"
        (target,) = rule["Targets"]
        assert target["Arn"] == {"Fn::GetAtt": [ec2_events, "Arn"]}
        assert target["DeadLetterConfig"]["Arn"] == {"Fn::GetAtt": [dlq, "Arn"]}
        assert target["RetryPolicy"]["MaximumRetryAttempts"] > 0


def test_given_a_stage_then_its_audit_events_have_their_own_bus(dev, prod):
    assert [bus["Name"] for bus in properties(dev, "AWS::Events::EventBus")] == ["fleetkeeper-dev-audit"]
    assert [bus["Name"] for bus in properties(prod, "AWS::Events::EventBus")] == ["fleetkeeper-prod-audit"]


def test_given_rebalance_drains_on_then_only_that_stage_routes_recommendations_to_ec2_events(pinned, dev):
    def rebalance_rules(template):
        return [
            rule
            for rule in properties(template, "AWS::Events::Rule")
            if rule["EventPattern"].get("detail-type") == [EC2_REBALANCE_RECOMMENDATION]
        ]

    (rule,) = rebalance_rules(pinned)
    ec2_events = function_logical_id(pinned, "fleetkeeper-pinned-ec2-events")
    assert rule["EventPattern"]["source"] == ["aws.ec2"]
    assert rule["Targets"][0]["Arn"] == {"Fn::GetAtt": [ec2_events, "Arn"]}
    assert rebalance_rules(dev) == []
    env = properties(pinned, "AWS::Lambda::Function")
    events_env = next(
        f["Environment"]["Variables"] for f in env if f.get("FunctionName") == "fleetkeeper-pinned-ec2-events"
    )
    assert (events_env["REBALANCE_DRAIN_ENABLED"], events_env["REBALANCE_DRAIN_TIMEOUT_SECONDS"]) == (
        "true",
        "900",
    )
