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
from collections.abc import Mapping
from enum import StrEnum
from functools import cache
from typing import Any, Final

import boto3
import botocore.loaders
import botocore.session
from botocore.config import Config

from fleetkeeper.cloud.retry import CAPACITY_CODES

# The most threads one invocation runs on one shared client: the reconcile cycle's worker steps
# (services/reconcile/cycle.py PARALLELISM); the operations' steps (services/operations.py) run after
# them, on fewer. botocore's default pool of 10 would open and drop a connection per call beyond that.
MAX_POOL_CONNECTIONS: Final = 16


class RetryLayer(StrEnum):
    """Who retries a client's calls: one layer per call, never both (else 5 x 5 = 25 attempts)."""

    # botocore's standard mode: 5 attempts with its own backoff and its client-wide retry quota, for
    # calls no code of ours wraps in a retry (EC2, CloudWatch, EventBridge, SNS, Powertools idempotency).
    SDK = "sdk"
    # One attempt per call: the caller retries what is worth retrying, classified by cloud/retry.py
    # (`with_backoff` for DynamoDB and Step Functions; cloud/ssm.py for Run Command, whose SendCommand
    # must never be repeated blindly).
    CALLER = "caller"


# Services whose every call goes through a retry of ours.
CALLER_RETRIED: Final = frozenset({"dynamodb", "stepfunctions", "ssm"})
_BASE = Config(connect_timeout=5, read_timeout=30, max_pool_connections=MAX_POOL_CONNECTIONS)
# `total_max_attempts` counts every attempt. botocore reads `max_attempts` as retries after the first
# (so `max_attempts: 1` still sent a second SendCommand after a 5xx, the one send that must not repeat).
SDK_ATTEMPTS: Final = 5
_CONFIGS: Final = {
    RetryLayer.SDK: _BASE.merge(Config(retries={"mode": "standard", "total_max_attempts": SDK_ATTEMPTS})),
    RetryLayer.CALLER: _BASE.merge(Config(retries={"mode": "standard", "total_max_attempts": 1})),
}
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


def client(service: str, region: str | None = None, *, retries: RetryLayer | None = None) -> Any:
    """A shared client per (service, region, retry layer); boto3 clients are thread-safe.

    By default a service's calls are retried by the one layer that wraps them (`CALLER_RETRIED`);
    `retries` picks the layer for a caller that is the exception (a library calling DynamoDB itself).
    """
    layer = retries or (RetryLayer.CALLER if service in CALLER_RETRIED else RetryLayer.SDK)
    return _client(service, region, layer)


@cache
def _client(service: str, region: str | None, layer: RetryLayer) -> Any:
    with _SESSION_LOCK:
        created = _session().client(service, region_name=region, config=_CONFIGS[layer])  # type: ignore[call-overload]
    if layer is RetryLayer.SDK:
        created.meta.events.register_first(f"needs-retry.{service}", _capacity_is_final)
    return created


def _capacity_is_final(response: tuple[Any, Mapping[str, Any]] | None = None, **_: Any) -> bool | None:
    """botocore's `needs-retry`: no SDK retry of a capacity error (cloud/retry.CAPACITY_CODES), which its
    standard mode would send four more times for the 500 EC2 answers it with. False, not None: botocore
    takes the first answer that is not None, and False stops the retry whatever later handlers say."""
    if response is None:
        return None
    code = response[1].get("Error", {}).get("Code")
    return False if code in CAPACITY_CODES else None


def reset_clients() -> None:
    """Forget the session and its clients, e.g. after the environment's endpoints, credentials or
    botocore's built-in event handlers changed; the next client is created from a fresh session."""
    with _SESSION_LOCK:
        _client.cache_clear()
        _session.cache_clear()
