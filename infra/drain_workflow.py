"""The drain state machine: the ASL file beside this module, deployed as one Standard state machine."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from infra.config import StageConfig
from infra.permissions import acknowledge, allow

ASL_FILE: Final = Path(__file__).resolve().parent / "statemachines" / "drain.asl.json"
# The one substitution of the ASL contract (docs/architecture.md).
TASK_FUNCTION_ARN: Final = "DrainTaskFunctionArn"
_PLACEHOLDER: Final = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


def asl_placeholders(definition: str) -> set[str]:
    """The ${Name} placeholders a definition expects CloudFormation to substitute."""
    return set(_PLACEHOLDER.findall(definition))


class DrainWorkflowRef:
    """The drain state machine's ARNs, known from its fixed name before the state machine exists.

    The state machine needs the drain_tasks ARN and drain_tasks needs the state machine ARN; naming the
    state machine up front lets every function hold its ARN without a dependency cycle.
    """

    def __init__(self, scope: Construct, stage: str) -> None:
        stack = Stack.of(scope)
        self.state_machine_name = f"fleetkeeper-{stage}-drain"
        self.state_machine_arn = stack.format_arn(
            service="states",
            resource="stateMachine",
            resource_name=self.state_machine_name,
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        self.executions_arn = stack.format_arn(
            service="states",
            resource="execution",
            resource_name=f"{self.state_machine_name}:*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    def grant_describe_executions(self, role: iam.IRole) -> None:
        """The watchdog's DescribeExecution on the drain executions (services/drains/watchdog.py)."""
        allow(
            role,
            actions=["states:DescribeExecution"],
            resources=[self.executions_arn],
            wildcard_reason=(
                "execution names are per worker, generation and restart; the pattern is scoped to the "
                "drain state machine's own executions"
            ),
        )

    def grant_start(self, role: iam.IRole) -> None:
        allow(role, actions=["states:StartExecution"], resources=[self.state_machine_arn])

    def grant_task_response(self, role: iam.IRole, *, success: bool = True, heartbeat: bool = False) -> None:
        """Answer drain callback tokens; `success=False` for callers that only ever fail a task,
        `heartbeat=True` for the reconciler's sweep, which keeps waiting drains alive."""
        actions = (
            ["states:SendTaskSuccess", "states:SendTaskFailure"] if success else ["states:SendTaskFailure"]
        )
        if heartbeat:
            actions.append("states:SendTaskHeartbeat")
        allow(
            role,
            actions=actions,
            resources=["*"],
            wildcard_reason=(
                "SendTaskSuccess, SendTaskFailure and SendTaskHeartbeat are authorised by the task token, "
                "which only a drain execution hands out; IAM has no state machine resource to scope them to."
            ),
        )


class DrainWorkflow(Construct):
    """Standard state machine from infra/statemachines/drain.asl.json: every event logged, never its
    execution data; X-Ray tracing."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        ref: DrainWorkflowRef,
        task_function: lambda_.IFunction,
        config: StageConfig,
    ) -> None:
        super().__init__(scope, construct_id)
        self.substitutions = {TASK_FUNCTION_ARN: task_function.function_arn}
        missing = asl_placeholders(ASL_FILE.read_text(encoding="utf-8")) - set(self.substitutions)
        if missing:
            raise ValueError(f"{ASL_FILE.name} uses placeholders with no substitution: {sorted(missing)}")

        # A /aws/vendedlogs/ name keeps Step Functions from growing the account's log resource policy.
        self.log_group = logs.LogGroup(
            self,
            "Logs",
            log_group_name=f"/aws/vendedlogs/states/{ref.state_machine_name}",
            retention=config.log_retention,
            removal_policy=RemovalPolicy.RETAIN if config.retain else RemovalPolicy.DESTROY,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            state_machine_name=ref.state_machine_name,
            state_machine_type=sfn.StateMachineType.STANDARD,
            definition_body=sfn.DefinitionBody.from_file(str(ASL_FILE)),
            definition_substitutions=self.substitutions,
            # Every event, but never execution data: inputs, outputs and task parameters carry the live
            # callback token ($$.Task.Token is in the task payload), and a log must not hold a credential.
            logs=sfn.LogOptions(
                destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=False
            ),
            tracing_enabled=True,
        )
        # The definition is a file, so CDK cannot see which function it calls: grant exactly that one,
        # unqualified, which is how the ASL names it.
        allow(
            self.state_machine.role, actions=["lambda:InvokeFunction"], resources=[task_function.function_arn]
        )
        acknowledge(
            self.state_machine.role,
            "IAM5[Resource::*]",
            "X-Ray trace writes and the CloudWatch Logs log-delivery calls Step Functions makes to set up "
            "execution logging support no resource-level permissions.",
        )
