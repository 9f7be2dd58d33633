"""EC2 events of every worker region reach the home region, where the ec2_events function applies them.

EventBridge delivers an EC2 state change or spot interruption warning only in the region of the instance.
A worker region other than the home region therefore gets one small stack: two rules on its default bus
that forward those events, unchanged, to the home region's default bus, where the main stack's rules
match them as if they had happened there (the event keeps its own `region`). Its only permission is
PutEvents on that one bus. What cannot be delivered lands in a dead-letter queue in the worker region,
watched by an alarm there.
"""

from __future__ import annotations

from typing import Any, Final

from aws_cdk import Duration, Environment, Stack, Tags
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as event_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.config import StageConfig
from infra.operations import WorkerOperations
from infra.permissions import acknowledge
from infra.triggers import (
    EC2_REBALANCE_RECOMMENDATION,
    EC2_SPOT_INTERRUPTION,
    EC2_STATE_CHANGE,
    HEALTH_EVENT,
    health_scheduled_changes,
)

FORWARDED_DETAIL_TYPES: Final = (EC2_STATE_CHANGE, EC2_SPOT_INTERRUPTION)


def forwarded_detail_types(config: StageConfig) -> tuple[str, ...]:
    """What a forwarder sends home: rebalance recommendations too, where the stage acts on them."""
    if config.rebalance.enabled:
        return (*FORWARDED_DETAIL_TYPES, EC2_REBALANCE_RECOMMENDATION)
    return FORWARDED_DETAIL_TYPES


OUTPUT_FORWARDING_DLQ: Final = "ForwardingDeadLetterQueueUrl"


def forwarder_stack_id(stage: str, region: str) -> str:
    return f"Fleetkeeper-{stage}-events-{region}"


def forwarded_regions(config: StageConfig) -> list[str]:
    """The worker regions whose EC2 events must be forwarded: every one but the home region."""
    return sorted(region for region in config.regions if region != config.region)


class EventForwardingStack(Stack):
    """Forwards one worker region's EC2 state changes, spot warnings and AWS Health scheduled changes to
    the home region's bus."""

    def __init__(self, scope: Construct, *, config: StageConfig, region: str, **kwargs: Any) -> None:
        if region == config.region:
            raise ValueError(f"{region} is the home region of stage {config.name}; it needs no forwarder")
        super().__init__(
            scope,
            forwarder_stack_id(config.name, region),
            stack_name=f"fleetkeeper-{config.name}-events-{region}",
            description=f"fleetkeeper {config.name}: forwards EC2 events of {region} to {config.region}",
            env=Environment(account=config.account, region=region),
            termination_protection=config.retain,
            **kwargs,
        )
        Tags.of(self).add("fleetkeeper:stage", config.name)
        # Run Command reads documents from the machine's own region: the catalogue's documents live here
        # too, under the same names (the home stack's roles may send them; infra/operations.py).
        self.worker_operations = WorkerOperations(self, "WorkerOperations", config=config)
        self.home_bus_arn = self.format_arn(
            service="events", region=config.region, resource="event-bus", resource_name="default"
        )
        home_bus = events.EventBus.from_event_bus_arn(self, "HomeBus", self.home_bus_arn)

        self.role = iam.Role(
            self,
            "ForwardRole",
            assumed_by=iam.ServicePrincipal(
                "events.amazonaws.com",
                conditions={"StringEquals": {"aws:SourceAccount": self.account}},
            ),
            description=f"fleetkeeper {config.name}: forward EC2 events of {region} to {config.region}",
        )
        self.dead_letter_queue = sqs.Queue(
            self,
            "Undelivered",
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        acknowledge(
            self.dead_letter_queue,
            "SQS3",
            "This queue is itself the dead-letter queue of the forwarded EC2 events; an alarm watches it.",
        )
        # The bus target's own grant gives the role PutEvents on the home bus, and nothing else.
        target = event_targets.EventBus(home_bus, role=self.role, dead_letter_queue=self.dead_letter_queue)
        self.rules = {
            detail_type: events.Rule(
                self,
                detail_type.replace(" ", "").replace("-", ""),
                description=f"forward '{detail_type}' of {region} to the fleetkeeper bus in {config.region}",
                event_pattern=events.EventPattern(source=["aws.ec2"], detail_type=[detail_type]),
                targets=[target],
            )
            for detail_type in forwarded_detail_types(config)
        }
        # AWS Health publishes a machine's scheduled changes in the machine's region.
        self.rules[HEALTH_EVENT] = events.Rule(
            self,
            "AWSHealthEvent",
            description=f"forward EC2 scheduled changes of {region} to the fleetkeeper bus in "
            f"{config.region}",
            event_pattern=health_scheduled_changes(),
            targets=[target],
        )
        # Alarm actions cannot reach the home region's topic; the alarm shows in this region's console
        # and the runbook says where to look.
        self.undelivered_alarm = cw.Alarm(
            self,
            "UndeliveredAlarm",
            alarm_name=f"fleetkeeper-{config.name}-{region}-forwarding-undelivered",
            alarm_description=(
                f"EC2 events of {region} could not be forwarded to {config.region}: workers there miss "
                "their state changes until the reconciler catches up; spot drains may start late."
            ),
            metric=self.dead_letter_queue.metric_approximate_number_of_messages_visible(
                period=Duration.minutes(5), statistic="Maximum"
            ),
            threshold=0,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
