"""The tests' own boto3 clients, one per service and process."""

from __future__ import annotations

import functools
from typing import Any

import boto3
from botocore.config import Config


@functools.cache
def _shared_client(service: str, session: boto3.Session, adaptive: bool) -> Any:
    config = Config(retries={"mode": "adaptive", "max_attempts": 10}) if adaptive else None
    return session.client(service, config=config)  # type: ignore[call-overload]


def shared_client(service: str, *, adaptive: bool = False) -> Any:
    """The tests' own client of a service, one per process: a new client costs more CPU than most tests'
    calls on it. A new default session (the AWS rules make one when installed) gets new clients."""
    return _shared_client(service, boto3._get_default_session(), adaptive)


def forget_shared_clients() -> None:
    _shared_client.cache_clear()
