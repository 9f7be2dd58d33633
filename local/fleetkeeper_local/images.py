"""AMIs for the emulated EC2, so the reconciler finds one for each template it launches."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fleetkeeper.domain.models import WorkerTemplate

DEMO_IMAGE_VERSION = "2026.01"


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
