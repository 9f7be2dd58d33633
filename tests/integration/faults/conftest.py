"""Fixtures of the fault-class tests: handlers that build their context afresh, and an image to launch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from fleetkeeper.services.context import default_context
from fleetkeeper.settings import get_settings

LAB_IMAGE_NAME = "lab-2026.03"


@pytest.fixture
def fresh_process(table_name: str) -> Iterator[None]:
    """Handlers build their context once per process: start and end each test with none cached."""
    get_settings.cache_clear()
    default_context.cache_clear()
    yield
    get_settings.cache_clear()
    default_context.cache_clear()


@pytest.fixture
def lab_image(ec2: Any) -> str:
    """An AMI the lab template's ami_name_filter (lab-*) finds, so the reconciler can launch."""
    return str(ec2.register_image(Name=LAB_IMAGE_NAME, RootDeviceName="/dev/sda1")["ImageId"])
