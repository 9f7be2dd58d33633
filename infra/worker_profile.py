"""The identity worker machines launch with: an instance role and profile, and who may pass it to EC2.

Without an instance profile the SSM agent on a worker cannot register with Systems Manager, so Run
Command (license registration, system information, before-stop operations) reaches none of them. The
role holds the agent's AWS managed policy and reads only the stage's operation parameters
(`/fleetkeeper/<stage>/*`, e.g. the license token register-license reads on the machine).

A stage may name a profile it manages itself (`worker_instance_profile` in cdk.json); the stage then
creates none, and PassRole covers that profile's role.
"""

from __future__ import annotations

from typing import Final

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.config import StageConfig
from infra.permissions import acknowledge_aws_managed_policy, allow

SSM_AGENT_POLICY: Final = "AmazonSSMManagedInstanceCore"
# The reconciler's setting (fleetkeeper.settings): the profile name RunInstances passes.
PROFILE_ENVIRONMENT: Final = "WORKER_INSTANCE_PROFILE"
EC2_SERVICE: Final = "ec2.amazonaws.com"
PARAMETER_READS: Final = ("ssm:GetParameter", "ssm:GetParameters")
# Every way to read a parameter's value; denied outside the stage's prefix (see _confine_parameter_reads).
ALL_PARAMETER_READS: Final = (*PARAMETER_READS, "ssm:GetParametersByPath", "ssm:GetParameterHistory")
# The CloudWatch agent's default namespace: the memory and disk readings the reconciler reads.
AGENT_METRICS_NAMESPACE: Final = "CWAgent"


class WorkerProfile(Construct):
    """The workers' instance profile (created, or named by the stage) and the grant to launch with it."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        stack = Stack.of(self)
        self.role: iam.Role | None = None
        named = config.worker_instance_profile
        if named is not None:
            self.profile_name = named.name
            self.role_arn = stack.format_arn(
                service="iam", region="", resource="role", resource_name=named.role
            )
            return
        role = iam.Role(
            self,
            "Role",
            role_name=f"fleetkeeper-{config.name}-worker",
            assumed_by=iam.ServicePrincipal(EC2_SERVICE),
            description=f"fleetkeeper {config.name} workers: SSM agent, the stage's operation parameters",
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name(SSM_AGENT_POLICY)],
        )
        acknowledge_aws_managed_policy(
            role,
            SSM_AGENT_POLICY,
            "The SSM agent's permissions (registration, Run Command channels) as AWS maintains them for "
            "each agent release; its parameter reads outside the stage's prefix are explicitly denied.",
        )
        self._grant_parameter_reads(role)
        allow(
            role,
            actions=["cloudwatch:PutMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"cloudwatch:namespace": AGENT_METRICS_NAMESPACE}},
            wildcard_reason=(
                "cloudwatch:PutMetricData supports no resource-level permissions; the statement is limited "
                f"to the {AGENT_METRICS_NAMESPACE} namespace the reconciler reads memory and disk from."
            ),
        )
        profile = iam.InstanceProfile(
            self, "Profile", instance_profile_name=f"fleetkeeper-{config.name}-worker", role=role
        )
        self.role = role
        self.role_arn = role.role_arn
        self.profile_name = profile.instance_profile_name

    def _parameters_arn(self, region: str) -> str:
        return Stack.of(self).format_arn(
            service="ssm",
            region=region,
            resource="parameter",
            # format_arn adds the "/" between resource and name; the prefix starts with one.
            resource_name=f"{self._config.parameter_prefix.strip('/')}/*",
        )

    def _grant_parameter_reads(self, role: iam.Role) -> None:
        """Read, and decrypt through SSM, the stage's operation parameters; no other parameter."""
        regions = sorted(self._config.regions)
        parameters = [self._parameters_arn(region) for region in regions]
        allow(
            role,
            actions=list(PARAMETER_READS),
            resources=parameters,
            wildcard_reason=(
                "Operation parameters (the license token) are named at run time under the stage's prefix; "
                "the grant covers that prefix in the worker regions and nothing else."
            ),
        )
        # A SecureString is decrypted by SSM on the caller's behalf: only through SSM, and only for
        # parameters under the stage's prefix (SSM puts the parameter's ARN in the encryption context).
        stack = Stack.of(self)
        allow(
            role,
            actions=["kms:Decrypt"],
            resources=[
                stack.format_arn(service="kms", region=region, resource="key", resource_name="*")
                for region in regions
            ],
            conditions={
                "StringEquals": {"kms:ViaService": [f"ssm.{region}.amazonaws.com" for region in regions]},
                "StringLike": {"kms:EncryptionContext:PARAMETER_ARN": parameters},
            },
            wildcard_reason=(
                "The key of a SecureString is the deployer's choice; decryption is allowed only through "
                "SSM and only for parameters under the stage's prefix (the encryption context)."
            ),
        )
        # The agent's managed policy allows GetParameter(s) on every parameter of the account: an
        # explicit Deny keeps a worker from reading anything but its stage's parameters.
        role.add_to_principal_policy(
            iam.PolicyStatement(
                effect=iam.Effect.DENY,
                actions=list(ALL_PARAMETER_READS),
                not_resources=[self._parameters_arn("*")],
            )
        )

    def grant_launch_with(self, function: lambda_.Function, role: iam.IRole) -> None:
        """The function launches workers with the profile: its name in WORKER_INSTANCE_PROFILE, and
        iam:PassRole of the profile's role, to EC2 only (RunInstances passes it)."""
        function.add_environment(PROFILE_ENVIRONMENT, self.profile_name)
        allow(
            role,
            actions=["iam:PassRole"],
            resources=[self.role_arn],
            conditions={"StringEquals": {"iam:PassedToService": EC2_SERVICE}},
        )
