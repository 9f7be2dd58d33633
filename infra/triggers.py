"""What starts the background functions: EventBridge Scheduler schedules and EC2 event rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aws_cdk import Duration, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as event_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_scheduler_targets as scheduler_targets
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from fleetkeeper.domain.stagger import cron_minutes, shard_starts
from infra.config import StageConfig
from infra.permissions import acknowledge_wildcards

EC2_STATE_CHANGE: Final = "EC2 Instance State-change Notification"
EC2_SPOT_INTERRUPTION: Final = "EC2 Spot Instance Interruption Warning"
EC2_REBALANCE_RECOMMENDATION: Final = "EC2 Instance Rebalance Recommendation"
HEALTH_EVENT: Final = "AWS Health Event"


def health_scheduled_changes() -> events.EventPattern:
    """AWS Health's scheduled changes of EC2 (retirements, stops, reboots, maintenance); nothing else of
    Health reaches the function (docs/repair.md)."""
    return events.EventPattern(
        source=["aws.health"],
        detail_type=[HEALTH_EVENT],
        detail={"service": ["EC2"], "eventTypeCategory": ["scheduledChange"]},
    )


SCHEDULE_SOURCE: Final = "fleetkeeper.schedule"


class Triggers(Construct):
    """Reconcile every minute, discovery every five (per region), EC2 events within seconds.

    A schedule tick that cannot be delivered is retried briefly, then dropped into the DLQ: a late
    reconcile tick is worth less than the next one, so its event age is capped at one period.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        reconcile: lambda_.IFunction,
        discover: lambda_.IFunction,
        ec2_events: lambda_.IFunction,
        dead_letter_queue: sqs.IQueue,
    ) -> None:
        super().__init__(scope, construct_id)
        self.group = scheduler.ScheduleGroup(self, "Group", schedule_group_name=f"fleetkeeper-{config.name}")
        # One role for every schedule of this stage, trusted only by this account's Scheduler.
        self.role = iam.Role(
            self,
            "SchedulerRole",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": Stack.of(self).account}},
            ),
            description=f"fleetkeeper {config.name}: EventBridge Scheduler invokes reconcile and discover",
        )
        acknowledge_wildcards(
            self.role,
            [f"{function.function_arn}:*" for function in (reconcile, discover)],
            "CDK's Lambda invoke grant also covers the function's versions and aliases (':*'); the "
            "schedules invoke only the unqualified functions named here.",
        )
        reconcile_minutes = config.schedules.reconcile_rate_minutes
        shards = config.schedules.reconcile_shards
        # One schedule per shard, all at the same period: the shards run in parallel, each under its own
        # lease, staggered inside the period (fleetkeeper/domain/stagger.py): their own minute where the
        # period allows a cron offset, and a short wait after the due time, which the Scheduler passes
        # in, for shards that share a minute. An unsharded stage keeps the schedule and payload it had.
        self.reconcile_shards: list[scheduler.Schedule] = []
        for shard, start in enumerate(shard_starts(shards, reconcile_minutes)):
            sharding: dict[str, str | int | float] = {}
            if shards > 1:
                sharding = {"shard": shard, "shards": shards}
                if start.delay_seconds:
                    sharding["start_delay_seconds"] = start.delay_seconds
                    sharding["scheduled_time"] = scheduler.ContextAttribute.scheduled_time
            self.reconcile_shards.append(
                self._schedule(
                    "Reconcile" if shard == 0 else f"Reconcile-{shard + 1}of{shards}",
                    function=reconcile,
                    minutes=reconcile_minutes,
                    payload={"source": SCHEDULE_SOURCE, "task": "reconcile", **sharding},
                    description="fleetkeeper reconcile tick"
                    + (f", shard {shard + 1} of {shards}" if shards > 1 else ""),
                    dead_letter_queue=dead_letter_queue,
                    at_minute=start.minute if shards > 1 and cron_minutes(reconcile_minutes) else None,
                )
            )
        self.reconcile = self.reconcile_shards[0]
        # One discovery schedule per worker region: a slow or failing region never delays another.
        self.discovery: dict[str, scheduler.Schedule] = {}
        for region in sorted(config.regions):
            self.discovery[region] = self._schedule(
                f"Discover-{region}",
                function=discover,
                minutes=config.schedules.discovery_rate_minutes,
                payload={"source": SCHEDULE_SOURCE, "task": "discover", "region": region},
                description=f"fleetkeeper discovery and orphan GC in {region}",
                dead_letter_queue=dead_letter_queue,
            )

        # EC2 does not resend its events: retry delivery for a while before the DLQ.
        target = event_targets.LambdaFunction(
            ec2_events,
            dead_letter_queue=dead_letter_queue,
            retry_attempts=8,
            max_event_age=Duration.hours(2),
        )
        self.state_change_rule = events.Rule(
            self,
            "Ec2StateChange",
            description="EC2 instance state changes, applied to workers within seconds",
            event_pattern=events.EventPattern(source=["aws.ec2"], detail_type=[EC2_STATE_CHANGE]),
            targets=[target],
        )
        self.spot_interruption_rule = events.Rule(
            self,
            "Ec2SpotInterruption",
            description="EC2 spot interruption warnings: drain the worker within its two minutes",
            event_pattern=events.EventPattern(source=["aws.ec2"], detail_type=[EC2_SPOT_INTERRUPTION]),
            targets=[target],
        )
        self.health_rule = events.Rule(
            self,
            "HealthScheduledChange",
            description="AWS Health scheduled changes of EC2: replace the worker before AWS acts",
            event_pattern=health_scheduled_changes(),
            targets=[target],
        )
        # Only where the stage turns rebalance drains on: they are far more frequent than interruptions,
        # and an event the function would ignore is an invocation for nothing.
        self.rebalance_rule: events.Rule | None = None
        if config.rebalance.enabled:
            self.rebalance_rule = events.Rule(
                self,
                "Ec2RebalanceRecommendation",
                description="EC2 rebalance recommendations: drain the worker before its spot capacity goes",
                event_pattern=events.EventPattern(
                    source=["aws.ec2"], detail_type=[EC2_REBALANCE_RECOMMENDATION]
                ),
                targets=[target],
            )

    def _schedule(
        self,
        construct_id: str,
        *,
        function: lambda_.IFunction,
        minutes: int,
        payload: Mapping[str, str | int | float],
        description: str,
        dead_letter_queue: sqs.IQueue,
        at_minute: int | None = None,
    ) -> scheduler.Schedule:
        """Every `minutes`; with `at_minute`, as a cron at that minute of each period (`minutes` must
        divide an hour)."""
        period = Duration.minutes(minutes)
        expression = (
            scheduler.ScheduleExpression.rate(period)
            if at_minute is None
            else scheduler.ScheduleExpression.cron(
                minute=f"{at_minute}/{minutes}" if minutes < 60 else str(at_minute)
            )
        )
        return scheduler.Schedule(
            self,
            construct_id,
            schedule=expression,
            schedule_group=self.group,
            description=description,
            target=scheduler_targets.LambdaInvoke(
                function,
                input=scheduler.ScheduleTargetInput.from_object(payload),
                dead_letter_queue=dead_letter_queue,
                role=self.role,
                retry_attempts=2,
                max_event_age=Duration.seconds(max(60, period.to_seconds())),
            ),
        )
