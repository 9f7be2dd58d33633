"""One cached factory for boto3 clients.

Endpoints come from the standard AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE> variables, which boto3
reads itself; nothing here knows whether it runs on AWS or on a laptop.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import boto3
from botocore.config import Config

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=30)


@cache
def client(service: str, region: str | None = None) -> Any:
    """A shared client per (service, region); boto3 clients are thread-safe."""
    return boto3.session.Session().client(service, region_name=region, config=_CONFIG)  # type: ignore[call-overload]


def reset_clients() -> None:
    """Forget cached clients, e.g. after the environment's endpoints changed."""
    client.cache_clear()
