"""Shared fixtures: the local AWS stack (DynamoDB Local + moto server), one per test process."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.settings import get_settings
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.aws_rules import AwsRules
from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.stack import LocalStack, free_port
from tests.iam_plugin import (
    pytest_addoption,
    pytest_collection_finish,
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
    pytest_testnodedown,
)

__all__ = [
    "pytest_addoption",
    "pytest_collection_finish",
    "pytest_sessionfinish",
    "pytest_sessionstart",
    "pytest_terminal_summary",
    "pytest_testnodedown",
]

# The AWS rules of the test process (None with FLEETKEEPER_AWS_RULES=off), once the local stack is up.
_session_rules: list[AwsRules] = []


@pytest.fixture(scope="session")
def local_stack() -> Iterator[LocalStack]:
    """DynamoDB Local and moto on free ports, so parallel test processes and `make run` never collide.

    AWS's limits (fleetkeeper_local.aws_rules) hold on every client the tests and the code under test
    create from here on, as they would on AWS.
    Every AWS request a function makes on it is evaluated against the policies that function deploys
    with (fleetkeeper_local.iam); a request its role would not allow fails as on AWS.
    """
    stack = LocalStack(dynamodb_port=free_port(), moto_port=free_port())
    stack.start()
    saved = {k: os.environ.get(k) for k in stack.environment()}
    os.environ.update(stack.environment())
    reset_clients()
    rules = AwsRules.from_environ()
    try:
        with contextlib.ExitStack() as active:
            active.enter_context(iam_session.recording())
            if rules is not None:
                _session_rules.append(active.enter_context(rules.installed()))
            yield stack
    finally:
        _session_rules.clear()
        stack.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        reset_clients()


@pytest.fixture
def table_name(local_stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh table per test, built from the shared definition, dropped afterwards."""
    name = f"fk-test-{uuid.uuid4().hex[:10]}"
    local_stack.create_table(name)
    monkeypatch.setenv("TABLE_NAME", name)
    get_settings.cache_clear()
    try:
        yield name
    finally:
        local_stack.delete_table(name)
        get_settings.cache_clear()


@pytest.fixture
def dynamodb(local_stack: LocalStack) -> Any:
    return boto3.client("dynamodb")


@pytest.fixture
def store(dynamodb: Any, table_name: str) -> FleetStore:
    return FleetStore(dynamodb, table_name)


@pytest.fixture
def ec2(local_stack: LocalStack) -> Iterator[Any]:
    """The tests' own EC2 client. Their set-ups launch machines in bursts beyond RunInstances' request
    bucket (AWS's limits hold on this client too), so it waits the bucket out as a careful caller would:
    adaptive retries, which pace the client to the refill rate."""
    yield boto3.client("ec2", config=Config(retries={"mode": "adaptive", "max_attempts": 10}))
    local_stack.reset_moto()


@pytest.fixture(autouse=True)
def aws_rules(request: pytest.FixtureRequest) -> Iterator[AwsRules | None]:
    """The process's AWS rules, with full buckets for each test (None before the local stack starts).

    A test marked `without_aws_rules(reason=...)` runs with the rules suspended: only for what a
    laptop cannot show at AWS's figures, and the reason says which.
    """
    rules = _session_rules[0] if _session_rules else None
    if rules is None:
        yield None
        return
    rules.reset()
    marker = request.node.get_closest_marker("without_aws_rules")
    if marker is None:
        yield rules
        return
    if not marker.kwargs.get("reason"):
        raise pytest.UsageError(f"{request.node.nodeid}: without_aws_rules needs a reason")
    with rules.suspended():
        yield rules
