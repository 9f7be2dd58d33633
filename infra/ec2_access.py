"""EC2 permissions, confined to fleetkeeper's machines by the managed-by tag and to the stage's regions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

from fleetkeeper.domain.tags import BATCH_TAG, MANAGED_BY_TAG, MANAGED_BY_VALUE, WORKER_ID_TAG
from infra.config import StageConfig
from infra.permissions import allow

MANAGED_RESOURCE: Final = {"StringEquals": {f"aws:ResourceTag/{MANAGED_BY_TAG}": MANAGED_BY_VALUE}}
MANAGED_REQUEST: Final = {"StringEquals": {f"aws:RequestTag/{MANAGED_BY_TAG}": MANAGED_BY_VALUE}}
TAG_ON_LAUNCH_ONLY: Final = {"StringEquals": {"ec2:CreateAction": "RunInstances"}}
# What the reconciler tags a paired machine with (services/reconcile/provisioning.own_tags).
PAIRING_TAG_KEYS: Final = ("Name", WORKER_ID_TAG)

LIFECYCLE_ACTIONS: Final = frozenset({"ec2:StartInstances", "ec2:StopInstances", "ec2:TerminateInstances"})
DESCRIBE_ACTIONS: Final = frozenset(
    {"ec2:DescribeInstances", "ec2:DescribeImages", "ec2:DescribeInstanceStatus"}
)

_TAGGED_INSTANCES: Final = (
    "Instance ids are not known before launch; the statement is limited to instances carrying the "
    f"{MANAGED_BY_TAG}={MANAGED_BY_VALUE} tag in the stage's worker regions."
)


class Ec2Access(Construct):
    """Grants on the EC2 APIs the reconciler, discovery and drains call, in the worker regions."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self.regions = sorted(config.regions)

    def _arn(self, region: str, resource: str, name: str, *, account: bool = True) -> str:
        return Stack.of(self).format_arn(
            service="ec2",
            region=region,
            account=None if account else "",
            resource=resource,
            resource_name=name,
        )

    def image_owners(self) -> list[str]:
        """The ami_owners as IAM compares ec2:Owner: account ids or `amazon`.

        `self` means "this account" only to DescribeImages' Owners parameter; IAM sees the owner's
        account id, so `self` becomes the stack's account (a deploy-time reference when the stage
        names no account).
        """
        account = Stack.of(self).account
        return list(dict.fromkeys(account if owner == "self" else owner for owner in self._config.ami_owners))

    def instance_arns(self) -> list[str]:
        return [self._arn(region, "instance", "*") for region in self.regions]

    def grant_describe(self, role: iam.IRole, actions: Sequence[str]) -> None:
        """Read-only Describe calls, which IAM only grants on '*': limited to the worker regions."""
        unknown = set(actions) - DESCRIBE_ACTIONS
        if unknown:
            raise ValueError(f"not a describe action fleetkeeper uses: {sorted(unknown)}")
        allow(
            role,
            actions=sorted(actions),
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": self.regions}},
            wildcard_reason=(
                "EC2 Describe calls support no resource-level permissions; the statement is limited to "
                "the stage's worker regions."
            ),
        )

    def grant_lifecycle(self, role: iam.IRole, actions: Sequence[str]) -> None:
        """Start/stop/terminate, only on instances tagged as fleetkeeper's."""
        unknown = set(actions) - LIFECYCLE_ACTIONS
        if unknown:
            raise ValueError(f"not a lifecycle action: {sorted(unknown)}")
        allow(
            role,
            actions=sorted(actions),
            resources=self.instance_arns(),
            conditions=MANAGED_RESOURCE,
            wildcard_reason=_TAGGED_INSTANCES,
        )

    def grant_launch(self, role: iam.IRole) -> None:
        """RunInstances only of a machine tagged as fleetkeeper's, requiring IMDSv2, of one of the
        stage's instance types; the tagging of that launch, and of a batch's machine once paired."""
        allow(
            role,
            actions=["ec2:RunInstances"],
            resources=self.instance_arns(),
            conditions={
                "StringEquals": {
                    **MANAGED_REQUEST["StringEquals"],
                    # A launch without MetadataOptions.HttpTokens=required (IMDSv1 allowed) is denied.
                    "ec2:MetadataHttpTokens": "required",
                    "ec2:InstanceType": list(self._config.instance_types),
                }
            },
            wildcard_reason=_TAGGED_INSTANCES,
        )
        # The other resources a launch reads or creates. Volumes and network interfaces get their ids from
        # the launch itself; AMIs are picked at run time by the template's name filter, so the grant on
        # images is bounded by owner instead; subnet and security groups are pinned when cdk.json names
        # them (a stage with require_pinned_network refuses to synthesize otherwise).
        created: list[str] = []
        network: list[str] = []
        images: list[str] = []
        for region in self.regions:
            settings = self._config.regions[region]
            images.append(self._arn(region, "image", "*", account=False))
            created += [self._arn(region, "volume", "*"), self._arn(region, "network-interface", "*")]
            network.append(self._arn(region, "subnet", settings.subnet_id or "*"))
            network += [
                self._arn(region, "security-group", group) for group in settings.security_group_ids or ("*",)
            ]
            if settings.key_name:
                network.append(self._arn(region, "key-pair", settings.key_name))
        allow(
            role,
            actions=["ec2:RunInstances"],
            resources=images,
            conditions={"StringEquals": {"ec2:Owner": self.image_owners()}},
            wildcard_reason=(
                "The AMI is picked at run time by the template's name filter, so its id is unknown here; "
                "the grant covers only images owned by the stage's ami_owners."
            ),
        )
        allow(
            role,
            actions=["ec2:RunInstances"],
            resources=created + network,
            wildcard_reason=(
                "A launch creates its volume and network interface, so their ids are unknown here; subnet "
                "and security groups are pinned whenever cdk.json names them."
            ),
        )
        allow(
            role,
            actions=["ec2:CreateTags"],
            resources=self.instance_arns(),
            conditions=TAG_ON_LAUNCH_ONLY,
            wildcard_reason=(
                "Tagging is allowed only as part of RunInstances, on the instance that launch creates."
            ),
        )
        # A batch's launch carries only the tags its machines share: each worker's own are written on
        # its machine once paired, only those keys, only on a batch's machine that names no worker yet
        # (so a machine is never pointed at another worker).
        allow(
            role,
            actions=["ec2:CreateTags"],
            resources=self.instance_arns(),
            conditions={
                **MANAGED_RESOURCE,
                "ForAllValues:StringEquals": {"aws:TagKeys": list(PAIRING_TAG_KEYS)},
                "Null": {
                    f"aws:ResourceTag/{BATCH_TAG}": "false",
                    f"aws:ResourceTag/{WORKER_ID_TAG}": "true",
                },
            },
            wildcard_reason=(
                "A batch's machines get their ids from the launch, so they are unknown here; the statement "
                f"is limited to instances carrying the {MANAGED_BY_TAG}={MANAGED_BY_VALUE} tag and a "
                "launch batch's tag but no worker's id yet, and to the name and worker-id tag keys."
            ),
        )

    def grant_import_tagging(self, role: iam.IRole) -> None:
        """Discovery tags an imported machine as fleetkeeper's: only fleetkeeper's own tag keys."""
        allow(
            role,
            actions=["ec2:CreateTags"],
            resources=self.instance_arns(),
            conditions={
                **MANAGED_REQUEST,
                "ForAllValues:StringLike": {"aws:TagKeys": ["fleetkeeper:*"]},
            },
            wildcard_reason=(
                "Discovery imports machines it did not launch, so their ids are unknown here; it may only "
                "write fleetkeeper's own tag keys, and only while marking the machine as fleetkeeper's."
            ),
        )

    def grant_metric_reads(self, role: iam.IRole) -> None:
        """CloudWatch metric reads (instance CPU for idle detection) in the worker regions."""
        allow(
            role,
            actions=["cloudwatch:GetMetricData"],
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": self.regions}},
            wildcard_reason=(
                "cloudwatch:GetMetricData supports no resource-level permissions; the statement is limited "
                "to the stage's worker regions."
            ),
        )
