"""One cached factory for boto3 clients.

Endpoints come from the standard AWS_ENDPOINT_URL and AWS_ENDPOINT_URL_<SERVICE> variables, which boto3
reads itself; nothing here knows whether it runs on AWS or on a laptop.

Every client comes from one process-wide session whose loader keeps the parsed service models. Each
session otherwise parses them again: about 100 ms per client, which is cold-start time on Lambda (the
reconciler makes an EC2 client per region). Sessions are not thread-safe, so clients are created under
a lock; the clients themselves are.
"""

from __future__ import annotations

import threading
from functools import cache
from typing import Any

import boto3
import botocore.loaders
import botocore.session
from botocore.config import Config

_CONFIG = Config(retries={"mode": "standard", "max_attempts": 5}, connect_timeout=5, read_timeout=30)
# SSM's SendCommand is not idempotent: an SDK retry after a 5xx or a dropped connection may run the
# command twice. The SDK does not retry SSM calls; cloud/ssm.py retries what is safe to repeat and looks
# up a send whose outcome is unknown instead of sending it again.
_SERVICE_CONFIGS = {"ssm": _CONFIG.merge(Config(retries={"mode": "standard", "max_attempts": 1}))}
_SESSION_LOCK = threading.Lock()


@cache
def _models() -> botocore.loaders.Loader:
    """The service models do not depend on the environment, so they outlive every session."""
    return botocore.loaders.create_loader()


@cache
def _session() -> boto3.session.Session:
    core = botocore.session.get_session()
    core.register_component("data_loader", _models())
    session = boto3.session.Session(botocore_session=core)
    # boto3 appends its own data directory to the loader's search path once per session.
    search_paths = _models().search_paths
    search_paths[:] = list(dict.fromkeys(search_paths))
    return session


@cache
def client(service: str, region: str | None = None) -> Any:
    """A shared client per (service, region); boto3 clients are thread-safe."""
    with _SESSION_LOCK:
        config = _SERVICE_CONFIGS.get(service, _CONFIG)
        return _session().client(service, region_name=region, config=config)  # type: ignore[call-overload]


def reset_clients() -> None:
    """Forget the session and its clients, e.g. after the environment's endpoints, credentials or
    botocore's built-in event handlers changed; the next client is created from a fresh session."""
    with _SESSION_LOCK:
        client.cache_clear()
        _session.cache_clear()
