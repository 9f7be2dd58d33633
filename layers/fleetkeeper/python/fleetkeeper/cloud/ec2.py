"""EC2 adapter: batched reads and the lifecycle calls fleetkeeper makes on its machines."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from botocore.exceptions import ClientError

from fleetkeeper.cloud.retry import CAPACITY_CODES, error_code
from fleetkeeper.domain.repair import EventReading, StatusReading
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE

T = TypeVar("T")


class CapacityError(ClientError):
    """EC2 had no capacity for the instance type, or the account no quota, for a launch or a start
    (cloud/retry.CAPACITY_CODES): final for this attempt. It is the AWS error itself, typed, so whoever
    meets it can say why capacity is blocked with EC2's own code and message."""

    def __init__(self, cause: ClientError, operation: str, instance_type: str | None = None) -> None:
        super().__init__(cause.response, operation)
        self.instance_type = instance_type

    @property
    def code(self) -> str:
        return str(self.response.get("Error", {}).get("Code", ""))

    @property
    def aws_message(self) -> str:
        return str(self.response.get("Error", {}).get("Message", ""))


def capacity_refused(call: Callable[[], T], operation: str, instance_type: str | None = None) -> T:
    """Run an EC2 launch or start; a capacity refusal comes out as a CapacityError."""
    try:
        return call()
    except ClientError as exc:
        if error_code(exc) in CAPACITY_CODES:
            raise CapacityError(exc, operation, instance_type) from exc
        raise


def short_launch(instance_type: str, launched: int, asked: int) -> CapacityError:
    """What a machine of a batch EC2 did not launch met: asked for MinCount 1 and MaxCount `asked`, EC2
    launched as many as it had room for, so the rest were refused as a call of their own would be."""
    message = f"RunInstances launched {launched} of the {asked} machines asked for"
    cause = ClientError(
        {"Error": {"Code": "InsufficientInstanceCapacity", "Message": message}}, "RunInstances"
    )
    return CapacityError(cause, "RunInstances", instance_type)


# DescribeInstances returns at most 1000 instances a page.
DESCRIBE_PAGE_SIZE = 1000
# A single filter takes at most 200 values.
FILTER_VALUES_LIMIT = 200
# The instance ids EC2 takes in one call (its API reference states it for TerminateInstances; the
# instance-state calls share it).
INSTANCE_IDS_LIMIT = 1000


@dataclass(frozen=True)
class Ec2Instance:
    instance_id: str
    state: str
    private_ip: str | None = None
    public_ip: str | None = None
    image_id: str | None = None
    instance_type: str | None = None
    launch_time: datetime | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    # Its place among the machines of the RunInstances that launched it, from 0.
    launch_index: int | None = None

    @classmethod
    def from_api(cls, raw: Mapping[str, Any]) -> Ec2Instance:
        return cls(
            instance_id=raw["InstanceId"],
            state=raw.get("State", {}).get("Name", "unknown"),
            private_ip=raw.get("PrivateIpAddress"),
            public_ip=raw.get("PublicIpAddress"),
            image_id=raw.get("ImageId"),
            instance_type=raw.get("InstanceType"),
            launch_time=raw.get("LaunchTime"),
            tags={t["Key"]: t["Value"] for t in raw.get("Tags", [])},
            launch_index=raw.get("AmiLaunchIndex"),
        )


def status_reading(raw: Mapping[str, Any]) -> StatusReading:
    """One entry of DescribeInstanceStatus's InstanceStatuses."""
    return StatusReading(
        instance_id=raw["InstanceId"],
        state=raw.get("InstanceState", {}).get("Name", "unknown"),
        system_status=raw.get("SystemStatus", {}).get("Status"),
        instance_status=raw.get("InstanceStatus", {}).get("Status"),
        events=tuple(
            EventReading(
                code=str(event.get("Code", "unknown")),
                not_before=event.get("NotBefore"),
                description=event.get("Description"),
                event_id=event.get("InstanceEventId"),
            )
            for event in raw.get("Events", [])
        ),
    )


def _chunks(values: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


class Ec2Gateway:
    """One region's EC2, as fleetkeeper uses it."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def _describe(self, filters: list[dict[str, Any]]) -> Iterator[Ec2Instance]:
        paginator = self._client.get_paginator("describe_instances")
        for page in paginator.paginate(Filters=filters, PaginationConfig={"PageSize": DESCRIBE_PAGE_SIZE}):
            for reservation in page.get("Reservations", []):
                for raw in reservation.get("Instances", []):
                    yield Ec2Instance.from_api(raw)

    def describe_managed(self, extra_filters: Iterable[Mapping[str, Any]] = ()) -> Iterator[Ec2Instance]:
        """Every instance carrying fleetkeeper's managed-by tag, 1000 per call."""
        filters = [{"Name": f"tag:{MANAGED_BY_TAG}", "Values": [MANAGED_BY_VALUE]}, *map(dict, extra_filters)]
        return self._describe(filters)

    def describe(self, instance_ids: Iterable[str]) -> dict[str, Ec2Instance]:
        """The instances among these ids that EC2 still knows; a missing id is simply absent.

        A filter on instance-id is used instead of InstanceIds, which fails the whole call when one id
        is unknown.
        """
        found: dict[str, Ec2Instance] = {}
        for chunk in _chunks(sorted(set(instance_ids)), FILTER_VALUES_LIMIT):
            for instance in self._describe([{"Name": "instance-id", "Values": chunk}]):
                found[instance.instance_id] = instance
        return found

    def describe_status(self) -> Iterator[StatusReading]:
        """Every machine of the region's status checks and scheduled events, 1000 per call (the most
        DescribeInstanceStatus returns; it filters on no tag, so it lists the account's machines)."""
        paginator = self._client.get_paginator("describe_instance_status")
        for page in paginator.paginate(
            IncludeAllInstances=True, PaginationConfig={"PageSize": DESCRIBE_PAGE_SIZE}
        ):
            for raw in page.get("InstanceStatuses", []):
                yield status_reading(raw)

    def newest_image(self, name_filter: str, *, owners: Iterable[str] = ()) -> str | None:
        """The id of the newest AMI whose name matches the pattern, or None.

        `owners` (e.g. "self" or account ids) keeps a look-alike public AMI from ever being picked.
        """
        request: dict[str, Any] = {"Filters": [{"Name": "name", "Values": [name_filter]}]}
        if owners:
            request["Owners"] = list(owners)
        images = self._client.describe_images(**request).get("Images", [])
        if not images:
            return None
        return str(max(images, key=lambda image: image.get("CreationDate", ""))["ImageId"])

    def image_ids(self, name_filter: str, *, owners: Iterable[str] = ()) -> list[str]:
        """Ids of every AMI whose name matches the pattern."""
        request: dict[str, Any] = {"Filters": [{"Name": "name", "Values": [name_filter]}]}
        if owners:
            request["Owners"] = list(owners)
        return sorted(str(image["ImageId"]) for image in self._client.describe_images(**request)["Images"])

    def image_names(self, image_ids: Iterable[str]) -> dict[str, str]:
        """AMI id -> name, for the ids EC2 still knows."""
        ids = sorted(set(image_ids))
        if not ids:
            return {}
        images = self._client.describe_images(Filters=[{"Name": "image-id", "Values": ids}]).get("Images", [])
        return {str(i["ImageId"]): str(i.get("Name", "")) for i in images}

    def describe_by_images(self, image_ids: Iterable[str]) -> Iterator[Ec2Instance]:
        """Every instance launched from one of these AMIs, 1000 per call."""
        for chunk in _chunks(sorted(set(image_ids)), FILTER_VALUES_LIMIT):
            yield from self._describe([{"Name": "image-id", "Values": chunk}])

    def tag(self, instance_id: str, tags: Mapping[str, str]) -> None:
        self._client.create_tags(
            Resources=[instance_id], Tags=[{"Key": k, "Value": v} for k, v in tags.items()]
        )

    def run_instances(
        self,
        *,
        image_id: str,
        instance_type: str,
        count: int,
        tags: Mapping[str, str],
        client_token: str,
        subnet_id: str | None = None,
        security_group_ids: Iterable[str] = (),
        key_name: str | None = None,
        instance_profile: str | None = None,
    ) -> list[Ec2Instance]:
        """Launch up to `count` instances alike in one call: EC2 launches as many as it has room for,
        at least one (else a CapacityError), numbered by their `launch_index`. The client token makes a
        retried call return the same instances.

        `instance_profile` (a name) gives the machines the role their SSM agent registers with.
        """
        request: dict[str, Any] = {
            "ImageId": image_id,
            "InstanceType": instance_type,
            "MinCount": 1,
            "MaxCount": count,
            "ClientToken": client_token,
            # IMDSv2 only: a token-less metadata request (SSRF through a workload) gets no credentials.
            # The RunInstances grant requires it too (ec2:MetadataHttpTokens).
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
            ],
        }
        if subnet_id:
            request["SubnetId"] = subnet_id
        if security_group_ids:
            request["SecurityGroupIds"] = list(security_group_ids)
        if key_name:
            request["KeyName"] = key_name
        if instance_profile:
            request["IamInstanceProfile"] = {"Name": instance_profile}
        response = capacity_refused(
            lambda: self._client.run_instances(**request), "RunInstances", instance_type
        )
        return [Ec2Instance.from_api(raw) for raw in response["Instances"]]

    def stop(self, instance_id: str) -> None:
        self._client.stop_instances(InstanceIds=[instance_id])

    def start(self, instance_ids: Sequence[str]) -> None:
        """Start these instances in one call (INSTANCE_IDS_LIMIT at most); EC2 starts all or none."""
        if len(instance_ids) > INSTANCE_IDS_LIMIT:
            raise ValueError(
                f"at most {INSTANCE_IDS_LIMIT} instances a StartInstances, not {len(instance_ids)}"
            )
        capacity_refused(
            lambda: self._client.start_instances(InstanceIds=list(instance_ids)), "StartInstances"
        )

    def terminate(self, instance_id: str) -> None:
        self._client.terminate_instances(InstanceIds=[instance_id])


def is_missing_instance(error: ClientError) -> bool:
    return error.response.get("Error", {}).get("Code", "").startswith("InvalidInstanceID")
