"""AMIs for the emulated EC2, so the reconciler finds one for each template it launches."""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Final

from fleetkeeper.domain.models import WorkerTemplate

DEMO_IMAGE_VERSION = "2026.01"
# moto dates an image to the second; a newer image waits at most this long for a later second.
_NEWER_WAIT_SECONDS: Final = 3.0


# (endpoint, region) -> the id of one of moto's stock Amazon AMIs.
_stock_images: dict[tuple[str, str], str] = {}


def stock_image(ec2: Any) -> str:
    """One of the emulator's stock Amazon AMIs, for a machine launched outside the templates.

    Looked up once per endpoint and region: moto answers DescribeImages with every Amazon image it knows
    (thousands, whatever MaxResults says), which costs seconds a call, and its stock images keep their ids
    across resets.
    """
    key = (str(ec2.meta.endpoint_url), str(ec2.meta.region_name))
    if key not in _stock_images:
        _stock_images[key] = str(ec2.describe_images(Owners=["amazon"], MaxResults=5)["Images"][0]["ImageId"])
    return _stock_images[key]


def register_template_images(ec2: Any, templates: Iterable[WorkerTemplate]) -> dict[str, str]:
    """Register one AMI (owned by the account, as AMI_OWNERS=self expects) per template name filter.

    The name is the filter with its wildcards replaced, e.g. `fleet-lab-*` -> `fleet-lab-2026.01`.
    Returns filter -> image id; a filter that already matches an owned AMI is left as it is.
    """
    images: dict[str, str] = {}
    for name_filter in sorted({t.ami_name_filter for t in templates}):
        existing = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [name_filter]}])
        if existing["Images"]:
            images[name_filter] = str(existing["Images"][0]["ImageId"])
            continue
        name = name_filter.replace("*", DEMO_IMAGE_VERSION).replace("?", "x")
        images[name_filter] = str(ec2.register_image(Name=name, RootDeviceName="/dev/sda1")["ImageId"])
    return images


def _newest_date(ec2: Any, name_filter: str) -> str:
    images = ec2.describe_images(Owners=["self"], Filters=[{"Name": "name", "Values": [name_filter]}])
    return max((str(image.get("CreationDate", "")) for image in images["Images"]), default="")


def publish_newer_image(ec2: Any, name_filter: str) -> tuple[str, str]:
    """Register an AMI (owned by the account) that the filter selects and that is newer than every AMI
    it selected so far, as a new build of a template's image would be; returns (image id, name).

    The reconciler picks the image with the latest CreationDate (cloud/ec2.newest_image), which moto
    sets to the second of the call: this waits for a second later than the newest image's first.
    """
    newest = _newest_date(ec2, name_filter)[:19]
    deadline = time.monotonic() + _NEWER_WAIT_SECONDS
    now = datetime.now(UTC)
    while now.strftime("%Y-%m-%dT%H:%M:%S") <= newest:
        if time.monotonic() > deadline:
            raise RuntimeError(f"an image matching '{name_filter}' is dated {newest}, in the future")
        time.sleep(0.05)
        now = datetime.now(UTC)
    version = now.strftime("%Y.%m.%d-%H%M%S")
    name = name_filter.replace("*", version).replace("?", "x") if "*" in name_filter else name_filter
    image_id = str(ec2.register_image(Name=name, RootDeviceName="/dev/sda1")["ImageId"])
    return image_id, name
