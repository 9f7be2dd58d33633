"""Where fleetkeeper tells things: the operators' topic, the audit bus and the dead-letter queues."""

from __future__ import annotations

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_events as events
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.config import StageConfig
from infra.permissions import acknowledge, allow

CLOUDWATCH = iam.ServicePrincipal("cloudwatch.amazonaws.com")


class Messaging(Construct):
    """SNS topic (KMS) for drain timeouts and alarms, the audit event bus, and two DLQs.

    `async_failures` receives Lambda asynchronous invocations that failed every attempt;
    `undelivered_events` receives schedule ticks and EC2 events that could not be delivered at all.
    """

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        removal = RemovalPolicy.RETAIN if config.retain else RemovalPolicy.DESTROY

        self.key = kms.Key(
            self,
            "TopicKey",
            description=f"fleetkeeper {config.name}: encrypts the operators' notification topic",
            enable_key_rotation=True,
            removal_policy=removal,
        )
        # CloudWatch alarms publish to an encrypted topic only if the key lets them.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToUseTheKey",
                principals=[CLOUDWATCH],
                actions=["kms:Decrypt", "kms:GenerateDataKey"],
                resources=["*"],
                # Only this account's alarms: the CloudWatch service principal is shared by every account.
                conditions={"StringEquals": {"aws:SourceAccount": stack.account}},
            )
        )
        self.topic = sns.Topic(
            self,
            "Notifications",
            display_name=f"fleetkeeper {config.name}",
            master_key=self.key,
            enforce_ssl=True,
        )
        self.topic.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowThisAccountsAlarms",
                principals=[CLOUDWATCH],
                actions=["sns:Publish"],
                resources=[self.topic.topic_arn],
                conditions={
                    "ArnLike": {
                        "aws:SourceArn": stack.format_arn(
                            service="cloudwatch",
                            resource="alarm",
                            resource_name="*",
                            arn_format=ArnFormat.COLON_RESOURCE_NAME,
                        )
                    },
                    "StringEquals": {"aws:SourceAccount": stack.account},
                },
            )
        )
        if config.alarm_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(config.alarm_email))

        self.audit_bus = events.EventBus(self, "AuditBus", event_bus_name=f"fleetkeeper-{config.name}-audit")

        self.async_failures = self._dead_letter_queue(
            "AsyncFailures", "failed asynchronous Lambda invocations"
        )
        self.undelivered_events = self._dead_letter_queue(
            "UndeliveredEvents", "schedule ticks and EC2 events EventBridge could not deliver"
        )

    def _dead_letter_queue(self, construct_id: str, holds: str) -> sqs.Queue:
        queue = sqs.Queue(
            self,
            construct_id,
            encryption=sqs.QueueEncryption.SQS_MANAGED,
            enforce_ssl=True,
            retention_period=Duration.days(14),
        )
        acknowledge(
            queue,
            "SQS3",
            f"This queue is itself the dead-letter queue for {holds}; an alarm fires on its first message.",
        )
        return queue

    def grant_notify(self, role: iam.IRole) -> None:
        """Publish to the operators' topic, through its KMS key."""
        allow(role, actions=["sns:Publish"], resources=[self.topic.topic_arn])
        allow(role, actions=["kms:GenerateDataKey", "kms:Decrypt"], resources=[self.key.key_arn])

    def grant_audit(self, role: iam.IRole) -> None:
        """Put events on the audit bus, and on no other bus."""
        allow(role, actions=["events:PutEvents"], resources=[self.audit_bus.event_bus_arn])
