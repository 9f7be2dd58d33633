"""The dashboard shows the fleet and the alarms page through the SNS topic."""

from __future__ import annotations

import pytest

from infra import metrics
from tests.infra.helpers import flat, properties, resources

FUNCTION_SLUGS = ("api", "drain-tasks", "reconcile", "discover", "ec2-events")


def alarms(template, stage):
    prefix = f"fleetkeeper-{stage}-"
    return {
        alarm["AlarmName"].removeprefix(prefix): alarm
        for alarm in properties(template, "AWS::CloudWatch::Alarm")
    }


def dashboard_body(template) -> str:
    (dashboard,) = properties(template, "AWS::CloudWatch::Dashboard")
    return flat(dashboard["DashboardBody"])


def test_given_the_dashboard_then_it_plots_every_fleet_metric(dev):
    body = dashboard_body(dev)
    for name in metrics.ALL_METRICS:
        assert f'"{name}"' in body, name
    assert '"fleetkeeper","' in body
    assert '"service","fleetkeeper"' in body


def test_given_the_dashboard_then_it_shows_api_state_machine_lambda_and_dlq_health(dev):
    body = dashboard_body(dev)
    for metric in ("4XXError", "5XXError", "Latency", "ExecutionsFailed", "Errors", "Throttles"):
        assert f'"{metric}"' in body, metric
    assert "ApproximateNumberOfMessagesVisible" in body
    for title in (
        "Workers by status",
        "Drains",
        "Drain duration",
        "Reconcile duration",
        "API latency",
        "Rollouts",
        "Rollout steps (reconciler)",
    ):
        assert title in body


def test_given_the_alarms_then_each_concern_of_the_issue_has_one(dev):
    expected = {
        "drain-timed-out",
        "drain-failed",
        "drain-execution-lost",
        "before-stop-operation-failed",
        "orphan-gc-breaker-tripped",
        "repair-blocked",
        "capacity-blocked",
        "bookings-at-risk",
        "state-machine-failed",
        "api-5xx-rate",
        "reconcile-not-running",
        "dlq-async-failures-not-empty",
        "dlq-undelivered-events-not-empty",
        *(f"{slug}-errors" for slug in FUNCTION_SLUGS),
        *(f"{slug}-throttles" for slug in FUNCTION_SLUGS),
    }
    assert set(alarms(dev, "dev")) == expected


@pytest.mark.parametrize("stage", ["dev", "prod", "pinned"])
def test_given_any_alarm_then_it_notifies_the_topic_when_raised_and_cleared(synthesized, stage):
    template = synthesized.template(stage)
    (topic,) = resources(template, "AWS::SNS::Topic")
    for name, alarm in alarms(template, stage).items():
        assert alarm["AlarmActions"] == [{"Ref": topic}], name
        assert alarm["OKActions"] == [{"Ref": topic}], name


@pytest.mark.parametrize(
    ("slug", "metric"),
    [
        ("drain-timed-out", "DrainTimedOut"),
        ("drain-failed", "DrainFailed"),
        ("drain-execution-lost", "DrainExecutionLost"),
    ],
)
def test_given_a_drain_outcome_alarm_then_it_fires_on_the_first_occurrence(dev, slug, metric):
    alarm = alarms(dev, "dev")[slug]
    assert alarm["Namespace"] == metrics.NAMESPACE
    assert alarm["MetricName"] == metric
    assert alarm["Dimensions"] == [{"Name": "service", "Value": "fleetkeeper"}]
    assert alarm["Statistic"] == "Sum"
    assert alarm["Threshold"] == 1
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    assert alarm["TreatMissingData"] == "notBreaching"


@pytest.mark.parametrize(("stage", "period", "shards"), [("dev", 60, 1), ("pinned", 120, 3)])
def test_given_a_shard_without_heartbeat_for_three_reconcile_periods_then_the_alarm_fires(
    synthesized, stage, period, shards
):
    alarm = alarms(synthesized.template(stage), stage)["reconcile-not-running"]
    assert alarm["MetricName"] == metrics.RECONCILE_HEARTBEAT
    assert alarm["Period"] == period
    # One heartbeat per shard per period: fewer than the shard count means one of them stopped.
    assert (alarm["Statistic"], alarm["Threshold"]) == ("Sum", shards)
    assert alarm["EvaluationPeriods"] == 3
    assert alarm["DatapointsToAlarm"] == 3
    assert alarm["ComparisonOperator"] == "LessThanThreshold"
    assert alarm["TreatMissingData"] == "breaching"


def test_given_the_api_5xx_alarm_then_it_watches_the_error_rate_not_the_count(dev):
    alarm = alarms(dev, "dev")["api-5xx-rate"]
    expressions = [query["Expression"] for query in alarm["Metrics"] if "Expression" in query]
    assert expressions == ["IF(requests > 0, 100 * errors / requests, 0)"]
    names = {
        query["MetricStat"]["Metric"]["MetricName"] for query in alarm["Metrics"] if "MetricStat" in query
    }
    assert names == {"5XXError", "Count"}
    assert alarm["Threshold"] == 5


def test_given_the_state_machine_alarm_then_it_counts_failed_drain_executions(dev):
    alarm = alarms(dev, "dev")["state-machine-failed"]
    assert (alarm["Namespace"], alarm["MetricName"]) == ("AWS/States", "ExecutionsFailed")
    (state_machine,) = resources(dev, "AWS::StepFunctions::StateMachine")
    assert alarm["Dimensions"] == [{"Name": "StateMachineArn", "Value": {"Ref": state_machine}}]


def test_given_the_dlq_alarms_then_one_message_is_enough(dev):
    for name in ("dlq-async-failures-not-empty", "dlq-undelivered-events-not-empty"):
        alarm = alarms(dev, "dev")[name]
        assert alarm["MetricName"] == "ApproximateNumberOfMessagesVisible"
        assert alarm["Threshold"] == 1


def test_given_the_metric_names_then_workers_gauges_follow_the_status_names():
    assert metrics.workers_metric(metrics.REPORTED_STATUSES[0]).startswith("Workers")
    assert "WorkersRunning" in metrics.ALL_METRICS
    assert "WorkersDraining" in metrics.ALL_METRICS
    assert "WorkersTerminated" not in metrics.ALL_METRICS
    assert len(set(metrics.ALL_METRICS)) == len(metrics.ALL_METRICS)


def test_given_the_orphan_gc_breaker_alarm_then_it_holds_while_discovery_reports_held_back_workers(dev):
    alarm = alarms(dev, "dev")["orphan-gc-breaker-tripped"]
    assert (alarm["Namespace"], alarm["MetricName"]) == (metrics.NAMESPACE, metrics.ORPHAN_GC_HELD_BACK)
    assert (alarm["Statistic"], alarm["Threshold"]) == ("Maximum", 1)
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
    # Between two discovery runs there is no datapoint: the alarm keeps its state instead of clearing.
    assert alarm["TreatMissingData"] == "ignore"
