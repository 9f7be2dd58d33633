"""The CloudWatch dashboard operators watch and the alarms that page them (through the SNS topic)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from aws_cdk import ArnFormat, Duration, Stack
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra import metrics
from infra.config import StageConfig
from infra.permissions import allow

FIVE_MINUTES: Final = Duration.minutes(5)
# Share of API requests answered 5xx, in percent, that pages someone.
API_5XX_RATE_PERCENT: Final = 5
# Reconcile counts as stopped after this many schedule periods without a heartbeat.
RECONCILE_MISSED_PERIODS: Final = 3


def grant_alarm_reads(role: iam.IRole) -> None:
    """DescribeAlarms on the alarms of the stack's account and region: a rollout's rollback_on_alarms
    names alarms the operator made, which this stack does not know."""
    stack = Stack.of(role)
    allow(
        role,
        actions=["cloudwatch:DescribeAlarms"],
        resources=[
            stack.format_arn(
                service="cloudwatch",
                resource="alarm",
                resource_name="*",
                arn_format=ArnFormat.COLON_RESOURCE_NAME,
            )
        ],
        wildcard_reason=(
            "A rollout's rollback_on_alarms names any alarm of the stage's account and region, chosen when "
            "the rollout starts; the statement reads alarms only, of this account and region."
        ),
    )


def fleet_metric(name: str, *, statistic: str = "Sum", period: Duration = FIVE_MINUTES) -> cw.Metric:
    """One of the handlers' EMF metrics (infra/metrics.py)."""
    return cw.Metric(
        namespace=metrics.NAMESPACE,
        metric_name=name,
        dimensions_map=dict(metrics.DIMENSIONS),
        statistic=statistic,
        period=period,
    )


class Monitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        functions: Mapping[str, lambda_.IFunction],
        state_machine: sfn.IStateMachine,
        api_stage: apigw.Stage,
        dead_letter_queues: Mapping[str, sqs.IQueue],
        topic: sns.ITopic,
        alarm_readers: Sequence[iam.IRole] = (),
    ) -> None:
        super().__init__(scope, construct_id)
        for role in alarm_readers:
            grant_alarm_reads(role)
        self._prefix = f"fleetkeeper-{config.name}"
        self._action = cw_actions.SnsAction(topic)
        self.alarms: dict[str, cw.Alarm] = {}

        reconcile_period = Duration.minutes(config.schedules.reconcile_rate_minutes)
        heartbeat = fleet_metric(metrics.RECONCILE_HEARTBEAT, period=reconcile_period)
        api_errors = api_stage.metric_server_error(statistic="Sum", period=FIVE_MINUTES)
        api_requests = api_stage.metric_count(statistic="Sum", period=FIVE_MINUTES)
        api_5xx_rate = cw.MathExpression(
            expression="IF(requests > 0, 100 * errors / requests, 0)",
            using_metrics={"errors": api_errors, "requests": api_requests},
            label="5xx rate (%)",
            period=FIVE_MINUTES,
        )

        self._any(
            "drain-timed-out",
            fleet_metric(metrics.DRAIN_TIMED_OUT),
            "A drain hit its deadline and was forced.",
        )
        self._any("drain-failed", fleet_metric(metrics.DRAIN_FAILED), "A drain ended in ERROR.")
        self._any(
            "before-stop-operation-failed",
            fleet_metric(metrics.BEFORE_STOP_OPERATION_FAILED),
            "A before_stop operation failed or timed out; the worker was stopped anyway (docs/runbook.md).",
        )
        self._any(
            "drain-execution-lost",
            fleet_metric(metrics.DRAIN_EXECUTION_LOST),
            "The watchdog found an open drain whose execution was gone; it restarted or closed it.",
        )
        # Discovery reports the held-back count on every run, so the alarm stays raised while the breaker
        # holds and clears on the first run that holds nothing back (missing data keeps the state).
        discovery_period = Duration.minutes(max(config.schedules.discovery_rate_minutes, 5))
        self._alarm(
            "orphan-gc-breaker-tripped",
            fleet_metric(metrics.ORPHAN_GC_HELD_BACK, statistic="Maximum", period=discovery_period),
            description=(
                "Orphan GC's circuit breaker held back a suspicious share of a region's workers; "
                "confirm with `fleetkeeper orphans confirm REGION` once the machines are known gone "
                "(docs/operations.md)."
            ),
            threshold=1,
            comparison=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing=cw.TreatMissingData.IGNORE,
        )
        # The reconciler reports it every cycle: raised while a brake holds, cleared when none does.
        self._alarm(
            "repair-blocked",
            fleet_metric(metrics.REPAIR_BLOCKED, statistic="Maximum"),
            description=(
                "A pool's repair brake holds: more of its workers are unhealthy than its "
                "repair.max_unhealthy_percent, and none of them is replaced (docs/runbook.md, RepairBlocked)."
            ),
            threshold=1,
            comparison=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing=cw.TreatMissingData.NOT_BREACHING,
        )
        # Sent only when EC2 refuses a launch for capacity, quota or rate: missing is not breaching.
        self._alarm(
            "capacity-blocked",
            fleet_metric(metrics.CAPACITY_BLOCKED, statistic="Sum"),
            description=(
                "EC2 refused a scale-out launch for capacity, quota or rate: the pool's scale-out backs "
                "off (docs/runbook.md, CapacityBlocked; `fleetkeeper pool capacity NAME`)."
            ),
            threshold=1,
            comparison=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing=cw.TreatMissingData.NOT_BREACHING,
        )
        # A booking due, unplaced, with less than the lead time left: it may miss its timeslot.
        self._alarm(
            "bookings-at-risk",
            fleet_metric(metrics.BOOKINGS_AT_RISK_COUNTER, statistic="Maximum"),
            description=(
                "A booking waits for capacity with less than its pool's lead time left before its "
                "timeslot: it fails at the timeslot's start unless a worker takes it (docs/runbook.md, "
                "BookingsAtRisk; `fleetkeeper pool capacity NAME`)."
            ),
            threshold=1,
            comparison=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing=cw.TreatMissingData.NOT_BREACHING,
        )
        self._any(
            "state-machine-failed",
            state_machine.metric_failed(statistic="Sum", period=FIVE_MINUTES),
            "A drain state machine execution failed.",
        )
        for name, function in sorted(functions.items()):
            slug = name.replace("_", "-")
            self._any(
                f"{slug}-errors",
                function.metric_errors(statistic="Sum", period=FIVE_MINUTES),
                f"The {name} function raised errors.",
            )
            self._any(
                f"{slug}-throttles",
                function.metric_throttles(statistic="Sum", period=FIVE_MINUTES),
                f"The {name} function was throttled.",
            )
        for name, queue in sorted(dead_letter_queues.items()):
            self._any(
                f"dlq-{name}-not-empty",
                queue.metric_approximate_number_of_messages_visible(statistic="Maximum", period=FIVE_MINUTES),
                f"The {name} dead-letter queue holds messages: something was dropped. Inspect and redrive.",
            )
        self._alarm(
            "api-5xx-rate",
            api_5xx_rate,
            description=f"More than {API_5XX_RATE_PERCENT}% of admin API requests failed with 5xx.",
            threshold=API_5XX_RATE_PERCENT,
            comparison=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=3,
            datapoints_to_alarm=2,
            missing=cw.TreatMissingData.NOT_BREACHING,
        )
        # No heartbeat at all is the failure here, so missing data breaches.
        self._alarm(
            "reconcile-not-running",
            heartbeat,
            description=(
                f"A reconcile shard has not completed a cycle for {RECONCILE_MISSED_PERIODS} schedule "
                "periods (each shard sends one heartbeat per period)."
            ),
            threshold=config.schedules.reconcile_shards,
            comparison=cw.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=RECONCILE_MISSED_PERIODS,
            datapoints_to_alarm=RECONCILE_MISSED_PERIODS,
            missing=cw.TreatMissingData.BREACHING,
        )

        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=self._prefix)
        self.dashboard.add_widgets(
            cw.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=24, height=4)
        )
        self.dashboard.add_widgets(
            _graph(
                "Workers by status",
                [
                    fleet_metric(
                        metrics.workers_metric(status), statistic="Maximum", period=Duration.minutes(1)
                    ).with_(label=status.value)
                    for status in metrics.REPORTED_STATUSES
                ],
                stacked=True,
            ),
            _graph("Drains", [fleet_metric(name).with_(label=name) for name in metrics.DRAIN_OUTCOMES]),
            _graph(
                "Drain duration (s)",
                [
                    fleet_metric(metrics.DRAIN_DURATION_SECONDS, statistic=stat).with_(label=stat)
                    for stat in ("p50", "p90", "Maximum")
                ],
            ),
        )
        self.dashboard.add_widgets(
            _graph(
                "Forced terminations and orphans",
                [
                    fleet_metric(metrics.INSTANCE_FORCE_TERMINATED).with_(label="instances force-terminated"),
                    fleet_metric(metrics.DRAIN_EXECUTION_LOST).with_(label="drain executions lost"),
                    fleet_metric(metrics.ORPHANS_TERMINATED).with_(label="orphans terminated"),
                    fleet_metric(metrics.ORPHAN_GC_HELD_BACK, statistic="Maximum").with_(
                        label="orphans held back by the breaker"
                    ),
                    fleet_metric(metrics.REPAIR_BLOCKED, statistic="Maximum").with_(
                        label="pools whose repair brake holds"
                    ),
                    fleet_metric(metrics.CAPACITY_BLOCKED).with_(label="launches refused for capacity"),
                ],
            ),
            cw.GraphWidget(
                title="Reconcile duration (ms) and errors",
                left=[
                    fleet_metric(metrics.RECONCILE_DURATION_MS, statistic=stat).with_(label=stat)
                    for stat in ("Average", "Maximum")
                ],
                right=[fleet_metric(metrics.RECONCILE_ERRORS).with_(label="errors")],
                width=8,
            ),
            cw.SingleValueWidget(
                title="Reconcile: successful runs in the last period",
                metrics=[heartbeat.with_(label="runs")],
                sparkline=True,
                width=8,
            ),
        )
        operation_metrics = [
            cw.Metric(
                namespace=metrics.NAMESPACE,
                metric_name=name,
                dimensions_map={**metrics.DIMENSIONS, "operation": operation},
                statistic="Sum",
                period=FIVE_MINUTES,
            ).with_(label=f"{operation} {label}")
            for operation in sorted(config.operations.catalogue)
            for name, label in (
                (metrics.OPERATION_SUCCEEDED, "succeeded"),
                (metrics.OPERATION_FAILED, "failed"),
                (metrics.OPERATION_RETRIED, "retried"),
            )
        ]
        self.dashboard.add_widgets(
            _graph(
                "Worker operations",
                [
                    *operation_metrics,
                    fleet_metric(metrics.BEFORE_STOP_OPERATION_FAILED).with_(label="before-stop failed"),
                ],
            ),
            _graph(
                "Rollouts",
                [
                    fleet_metric(name).with_(label=label)
                    for name, label in (
                        (metrics.ROLLOUT_STARTED, "started"),
                        (metrics.ROLLOUT_WAVE_STARTED, "waves started"),
                        (metrics.ROLLOUT_CHECKPOINT_REACHED, "checkpoints reached"),
                        (metrics.ROLLOUT_SUCCEEDED, "succeeded"),
                        (metrics.ROLLOUT_FAILED, "failed"),
                        (metrics.ROLLOUT_CANCELLED, "cancelled"),
                        (metrics.ROLLOUT_ROLLBACK_STARTED, "rollbacks started"),
                        (metrics.ROLLOUT_ROLLED_BACK, "rolled back"),
                    )
                ],
            ),
            _graph(
                "Rollout steps (reconciler)",
                [
                    fleet_metric(name).with_(label=label)
                    for name, label in (
                        (metrics.ROLLOUT_STEPS, "steps"),
                        (metrics.ROLLOUT_STEP_CONFLICTS, "steps dropped for a concurrent change"),
                        (metrics.ROLLOUT_ERRORS, "errors"),
                    )
                ],
            ),
        )
        self.dashboard.add_widgets(
            _graph(
                "API 4xx / 5xx",
                [
                    api_stage.metric_client_error(statistic="Sum", period=FIVE_MINUTES).with_(label="4xx"),
                    api_errors.with_(label="5xx"),
                    api_requests.with_(label="requests"),
                ],
            ),
            _graph(
                "API latency (ms)",
                [
                    api_stage.metric_latency(statistic=stat, period=FIVE_MINUTES).with_(label=stat)
                    for stat in ("p50", "p90", "p99")
                ],
            ),
            _graph("API 5xx rate (%)", [api_5xx_rate]),
        )
        self.dashboard.add_widgets(
            _graph(
                "Drain executions",
                [
                    state_machine.metric_started(statistic="Sum", period=FIVE_MINUTES).with_(label="started"),
                    state_machine.metric_succeeded(statistic="Sum", period=FIVE_MINUTES).with_(
                        label="succeeded"
                    ),
                    state_machine.metric_failed(statistic="Sum", period=FIVE_MINUTES).with_(label="failed"),
                    state_machine.metric_timed_out(statistic="Sum", period=FIVE_MINUTES).with_(
                        label="timed out"
                    ),
                    state_machine.metric_aborted(statistic="Sum", period=FIVE_MINUTES).with_(label="aborted"),
                ],
            ),
            _graph(
                "Lambda errors and throttles",
                [
                    metric
                    for name, function in sorted(functions.items())
                    for metric in (
                        function.metric_errors(statistic="Sum", period=FIVE_MINUTES).with_(
                            label=f"{name} errors"
                        ),
                        function.metric_throttles(statistic="Sum", period=FIVE_MINUTES).with_(
                            label=f"{name} throttles"
                        ),
                    )
                ],
            ),
            _graph(
                "Dead-letter queues",
                [
                    queue.metric_approximate_number_of_messages_visible(
                        statistic="Maximum", period=FIVE_MINUTES
                    ).with_(label=name)
                    for name, queue in sorted(dead_letter_queues.items())
                ],
            ),
        )

    def _any(self, slug: str, metric: cw.IMetric, description: str) -> None:
        """Alarm on the first occurrence of a count within five minutes."""
        self._alarm(
            slug,
            metric,
            description=description,
            threshold=1,
            comparison=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            datapoints_to_alarm=1,
            missing=cw.TreatMissingData.NOT_BREACHING,
        )

    def _alarm(
        self,
        slug: str,
        metric: cw.IMetric,
        *,
        description: str,
        threshold: float,
        comparison: cw.ComparisonOperator,
        evaluation_periods: int,
        datapoints_to_alarm: int,
        missing: cw.TreatMissingData,
    ) -> None:
        alarm = cw.Alarm(
            self,
            "".join(part.title() for part in slug.split("-")) + "Alarm",
            alarm_name=f"{self._prefix}-{slug}",
            alarm_description=description,
            metric=metric,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=evaluation_periods,
            datapoints_to_alarm=datapoints_to_alarm,
            treat_missing_data=missing,
        )
        alarm.add_alarm_action(self._action)
        alarm.add_ok_action(self._action)
        self.alarms[slug] = alarm


def _graph(title: str, left: Sequence[cw.IMetric], *, stacked: bool = False) -> cw.GraphWidget:
    return cw.GraphWidget(title=title, left=list(left), stacked=stacked, width=8)
