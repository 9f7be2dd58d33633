"""One fleetkeeper stage: the constructs, the grants where they meet, and the stable outputs."""

from __future__ import annotations

from typing import Any, Final

from aws_cdk import CfnOutput, Environment, Stack, Tags
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.api import AdminApi
from infra.config import StageConfig
from infra.drain_workflow import DrainWorkflow, DrainWorkflowRef
from infra.ec2_access import Ec2Access
from infra.functions import Functions
from infra.messaging import Messaging
from infra.monitoring import Monitoring
from infra.operations import WorkerOperations
from infra.table import FleetTable
from infra.triggers import Triggers
from infra.worker_profile import WorkerProfile

# Logical ids of the outputs: tests, scripts and operators find them by these names.
OUTPUT_API_URL: Final = "ApiUrl"
OUTPUT_TABLE_NAME: Final = "TableName"
OUTPUT_STATE_MACHINE_ARN: Final = "DrainStateMachineArn"
OUTPUT_AUDIT_BUS_NAME: Final = "AuditBusName"
OUTPUT_TOPIC_ARN: Final = "NotificationTopicArn"
OUTPUT_OPERATOR_POLICY_ARN: Final = "OperatorPolicyArn"
OUTPUT_READ_ONLY_POLICY_ARN: Final = "ReadOnlyPolicyArn"
OUTPUT_DASHBOARD_NAME: Final = "DashboardName"
OUTPUT_WORKER_PROFILE: Final = "WorkerInstanceProfile"


def stack_id(stage: str) -> str:
    return f"Fleetkeeper-{stage}"


class FleetkeeperStack(Stack):
    # The stage's event forwarders in its other worker regions (infra/forwarding.py), set by the app.
    forwarders: dict[str, Stack]

    def __init__(self, scope: Construct, *, config: StageConfig, **kwargs: Any) -> None:
        super().__init__(
            scope,
            stack_id(config.name),
            stack_name=f"fleetkeeper-{config.name}",
            description=f"fleetkeeper control plane, stage {config.name}",
            # Without an account in cdk.json the stack stays account-agnostic: synth never asks AWS.
            env=Environment(account=config.account, region=config.region),
            termination_protection=config.retain,
            **kwargs,
        )
        Tags.of(self).add("fleetkeeper:stage", config.name)
        self.forwarders = {}

        messaging = Messaging(self, "Messaging", config=config)
        table = FleetTable(
            self, "Store", retain=config.retain, deferred_indexes=frozenset(config.deferred_indexes)
        )
        drain = DrainWorkflowRef(self, config.name)
        functions = Functions(
            self,
            "Functions",
            config=config,
            environment={
                "TABLE_NAME": table.table_name,
                "DRAIN_STATE_MACHINE_ARN": drain.state_machine_arn,
                "AUDIT_BUS_NAME": messaging.audit_bus.event_bus_name,
                "NOTIFICATION_TOPIC_ARN": messaging.topic.topic_arn,
                "DRAIN_HEARTBEAT_SECONDS": str(config.drain_heartbeat_seconds),
                "IDEMPOTENCY_TTL_SECONDS": str(config.idempotency_ttl_seconds),
                "AUDIT_RETENTION_DAYS": str(config.audit_retention_days),
                # The internal routes answer only these principals (the gateway's resource policy, too).
                "TOOLING_PRINCIPALS": ",".join(config.api.tooling_principals),
                # The health route answers these and the tooling principals only (docs/repair.md).
                "WORKER_AGENT_PRINCIPALS": ",".join(config.api.worker_agent_principals),
                # The API refuses templates of other types; the reconciler fails their workers.
                "INSTANCE_TYPES": ",".join(config.instance_types),
                # The API gives an operator's confirmation of held-back orphans its expiry.
                "ORPHAN_GC_CONFIRMATION_TTL_SECONDS": str(config.orphan_gc.confirmation_ttl_seconds),
                # The API checks requests against the catalogue; the reconciler and drains run them.
                **config.operations.environment(),
            },
            async_failures=messaging.async_failures,
        )
        workflow = DrainWorkflow(
            self, "DrainWorkflow", ref=drain, task_function=functions.drain_tasks, config=config
        )
        ec2 = Ec2Access(self, "Ec2Access", config=config)
        worker_operations = WorkerOperations(self, "WorkerOperations", config=config)
        worker_profile = WorkerProfile(self, "WorkerProfile", config=config)

        # Each function gets what it calls, and nothing else.
        roles = functions.roles
        table.grant_data(roles["api"])
        drain.grant_start(roles["api"])
        drain.grant_task_response(roles["api"])
        messaging.grant_audit(roles["api"])

        table.grant_data(roles["drain_tasks"])
        ec2.grant_lifecycle(roles["drain_tasks"], ["ec2:StopInstances", "ec2:TerminateInstances"])
        messaging.grant_notify(roles["drain_tasks"])
        messaging.grant_audit(roles["drain_tasks"])
        drain.grant_task_response(roles["drain_tasks"])
        drain.grant_start(roles["drain_tasks"])  # a pool drain starts one drain per worker
        worker_operations.grant_run(roles["drain_tasks"])  # before_stop operations

        table.grant_data(roles["reconcile"])
        ec2.grant_describe(roles["reconcile"], ["ec2:DescribeInstances", "ec2:DescribeImages"])
        ec2.grant_launch(roles["reconcile"])
        worker_profile.grant_launch_with(functions.reconcile, roles["reconcile"])
        ec2.grant_lifecycle(
            roles["reconcile"], ["ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances"]
        )
        ec2.grant_metric_reads(roles["reconcile"])
        drain.grant_start(roles["reconcile"])
        drain.grant_describe_executions(roles["reconcile"])  # the drain watchdog
        drain.grant_task_response(roles["reconcile"], heartbeat=True)  # the sweep of waiting drains
        messaging.grant_audit(roles["reconcile"])
        messaging.grant_notify(roles["reconcile"])
        worker_operations.grant_run(roles["reconcile"])

        _grant_discovery(
            roles["discover"],
            table=table,
            ec2=ec2,
            worker_operations=worker_operations,
            messaging=messaging,
            drain=drain,
        )

        table.grant_data(roles["ec2_events"])
        ec2.grant_describe(roles["ec2_events"], ["ec2:DescribeInstances"])  # addresses of a running machine
        drain.grant_start(roles["ec2_events"])  # a spot warning starts a drain
        drain.grant_task_response(roles["ec2_events"])
        messaging.grant_audit(roles["ec2_events"])

        Triggers(
            self,
            "Triggers",
            config=config,
            reconcile=functions.reconcile,
            discover=functions.discover,
            ec2_events=functions.ec2_events,
            dead_letter_queue=messaging.undelivered_events,
        )
        api = AdminApi(self, "Api", config=config, handler=functions.api_entry_point)
        monitoring = Monitoring(
            self,
            "Monitoring",
            config=config,
            functions=functions.by_name,
            state_machine=workflow.state_machine,
            api_stage=api.rest_api.deployment_stage,
            dead_letter_queues={
                "async-failures": messaging.async_failures,
                "undelivered-events": messaging.undelivered_events,
            },
            topic=messaging.topic,
            alarm_readers=[roles["reconcile"]],  # rollouts' rollback_on_alarms
        )

        self._add_outputs(
            {
                OUTPUT_API_URL: (api.rest_api.url, "Admin API base URL (SigV4)"),
                OUTPUT_TABLE_NAME: (table.table_name, "DynamoDB table"),
                OUTPUT_STATE_MACHINE_ARN: (workflow.state_machine.state_machine_arn, "Drain state machine"),
                OUTPUT_AUDIT_BUS_NAME: (
                    messaging.audit_bus.event_bus_name,
                    "EventBridge bus of audit events",
                ),
                OUTPUT_TOPIC_ARN: (messaging.topic.topic_arn, "SNS topic of drain timeouts and alarms"),
                OUTPUT_OPERATOR_POLICY_ARN: (
                    api.operator_policy.managed_policy_arn,
                    "Attach to call the API",
                ),
                OUTPUT_READ_ONLY_POLICY_ARN: (
                    api.read_only_policy.managed_policy_arn,
                    "Attach to read the API",
                ),
                OUTPUT_DASHBOARD_NAME: (monitoring.dashboard.dashboard_name, "CloudWatch dashboard"),
                OUTPUT_WORKER_PROFILE: (worker_profile.profile_name, "Instance profile workers launch with"),
            }
        )

    def _add_outputs(self, outputs: dict[str, tuple[str, str]]) -> None:
        for logical_id, (value, description) in outputs.items():
            output = CfnOutput(self, logical_id, value=value, description=description)
            output.override_logical_id(logical_id)


def _grant_discovery(
    role: iam.IRole,
    *,
    table: FleetTable,
    ec2: Ec2Access,
    worker_operations: WorkerOperations,
    messaging: Messaging,
    drain: DrainWorkflowRef,
) -> None:
    """What the discovery function calls, and nothing else."""
    table.grant_data(role, batch_write=True)  # the orphan breaker's pages of ids
    # DescribeInstanceStatus: the sweep of scheduled events and failed status checks (docs/repair.md).
    ec2.grant_describe(role, ["ec2:DescribeInstances", "ec2:DescribeImages", "ec2:DescribeInstanceStatus"])
    ec2.grant_import_tagging(role)
    # DescribeInstanceInformation: the SSM agents of the workers that use operations (docs/repair.md).
    worker_operations.grant_agent_reads(role)
    # A managed machine without a live worker (retired on purpose, a second launch of one worker, a
    # failed launch's late machine) is terminated by discovery: only machines tagged as fleetkeeper's.
    ec2.grant_lifecycle(role, ["ec2:TerminateInstances"])
    messaging.grant_audit(role)
    # An orphan's drain is failed; its lost instances may complete a waiting pool drain.
    drain.grant_task_response(role)
