"""The stage the local stack stands for: dev, homed on the local region, serving the regions tests use."""

from __future__ import annotations

from typing import Final

from fleetkeeper_local.stack import LOCAL_REGION

STAGE: Final = "dev"
LOCAL_HOME_REGION: Final = LOCAL_REGION
# The regions the local stack and the tests launch and read machines in (the home region first).
LOCAL_WORKER_REGIONS: Final = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1")
