"""What AWS knows when it authorizes a request, read from the emulator out-of-band.

EC2 and SSM authorize with facts of the resources involved: an image's owner (`ec2:Owner`), an
instance's tags (`aws:ResourceTag/*`, `ssm:resourceTag/*`), the default subnet and security group a
launch without them uses, the role inside an instance profile. These lookups go to the emulator through
clients of their own session, created with botocore's own handlers only: they are neither recorded nor
evaluated, and no injected fault reaches them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import botocore.session
from botocore import handlers
from botocore.exceptions import ClientError

from fleetkeeper_local.stack import LOCAL_CREDENTIALS, moto_generation

# botocore's own handlers, before any fault plan or recorder added to them.
_PRISTINE = tuple(handlers.BUILTIN_HANDLERS)


@dataclass(frozen=True)
class Instance:
    instance_type: str
    tags: Mapping[str, str] = field(default_factory=dict)


class Lookups(Protocol):
    """The facts of the resources a request names; None when the resource does not exist."""

    def image_owner(self, region: str, image_id: str) -> str | None: ...

    def instance(self, region: str, instance_id: str) -> Instance | None: ...

    def default_network(self, region: str) -> tuple[str | None, tuple[str, ...]]: ...

    def instance_profile_roles(self, profile: str) -> tuple[str, ...] | None: ...


@dataclass(frozen=True)
class KnownFacts:
    """Lookups answered from given facts (the least-privilege table states them outright)."""

    images: Mapping[str, str] = field(default_factory=dict)  # image id -> owner
    instances: Mapping[str, Instance] = field(default_factory=dict)
    subnet: str | None = "subnet-0default"
    security_groups: tuple[str, ...] = ("sg-0default",)
    profiles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # name or ARN -> role ARNs

    def image_owner(self, region: str, image_id: str) -> str | None:
        return self.images.get(image_id)

    def instance(self, region: str, instance_id: str) -> Instance | None:
        return self.instances.get(instance_id)

    def default_network(self, region: str) -> tuple[str | None, tuple[str, ...]]:
        return self.subnet, self.security_groups

    def instance_profile_roles(self, profile: str) -> tuple[str, ...] | None:
        return self.profiles.get(profile)


class Emulator:
    """Lookups on the emulated AWS (moto), through clients no hook reaches."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._session = botocore.session.get_session()
        for spec in handlers.BUILTIN_HANDLERS:
            if spec not in _PRISTINE:
                self._session.unregister(spec[0], spec[1])
        self._clients: dict[tuple[str, str, str | None], Any] = {}
        self._owners: dict[tuple[str, str], str] = {}
        self._networks: dict[tuple[str, int], tuple[str | None, tuple[str, ...]]] = {}

    def _client(self, service: str, region: str) -> Any:
        endpoint = os.environ.get("AWS_ENDPOINT_URL")
        key = (service, region, endpoint)
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                found = self._session.create_client(
                    service,
                    region_name=region,
                    endpoint_url=endpoint,
                    aws_access_key_id=os.environ.get(
                        "AWS_ACCESS_KEY_ID", LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"]
                    ),
                    aws_secret_access_key=os.environ.get(
                        "AWS_SECRET_ACCESS_KEY", LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
                    ),
                )
                self._clients[key] = found
            return found

    def image_owner(self, region: str, image_id: str) -> str | None:
        """`amazon` for Amazon's images, else the owner's account id (what `ec2:Owner` holds)."""
        key = (region, image_id)
        if key not in self._owners:
            try:
                images = self._client("ec2", region).describe_images(ImageIds=[image_id])["Images"]
            except ClientError:
                return None
            if not images:
                return None
            image = images[0]
            self._owners[key] = (
                "amazon" if image.get("ImageOwnerAlias") == "amazon" else str(image["OwnerId"])
            )
        return self._owners[key]

    def instance(self, region: str, instance_id: str) -> Instance | None:
        reservations = self._client("ec2", region).describe_instances(
            Filters=[{"Name": "instance-id", "Values": [instance_id]}]
        )["Reservations"]
        for reservation in reservations:
            for raw in reservation["Instances"]:
                tags = {tag["Key"]: tag["Value"] for tag in raw.get("Tags", [])}
                return Instance(instance_type=str(raw.get("InstanceType", "")), tags=tags)
        return None

    def default_network(self, region: str) -> tuple[str | None, tuple[str, ...]]:
        """The default VPC's subnet and security group, which a launch naming neither uses."""
        key = (region, moto_generation())
        if key not in self._networks:
            ec2 = self._client("ec2", region)
            vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
            if not vpcs:
                return None, ()
            vpc = vpcs[0]["VpcId"]
            subnets = ec2.describe_subnets(
                Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "default-for-az", "Values": ["true"]}]
            )["Subnets"]
            groups = ec2.describe_security_groups(
                Filters=[{"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": ["default"]}]
            )["SecurityGroups"]
            subnet = min((s["SubnetId"] for s in subnets), default=None)
            self._networks[key] = (subnet, tuple(g["GroupId"] for g in groups))
        return self._networks[key]

    def instance_profile_roles(self, profile: str) -> tuple[str, ...] | None:
        name = profile.rsplit("/", 1)[-1]
        try:
            found = self._client("iam", "us-east-1").get_instance_profile(InstanceProfileName=name)
        except ClientError:
            return None
        return tuple(str(role["Arn"]) for role in found["InstanceProfile"].get("Roles", []))
