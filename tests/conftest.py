"""Shared fixtures: the local AWS stack (DynamoDB Local + moto server), one per test process."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.settings import get_settings
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.stack import LocalStack, free_port


@pytest.fixture(scope="session")
def local_stack() -> Iterator[LocalStack]:
    """DynamoDB Local and moto on free ports, so parallel test processes and `make run` never collide."""
    stack = LocalStack(dynamodb_port=free_port(), moto_port=free_port())
    stack.start()
    saved = {k: os.environ.get(k) for k in stack.environment()}
    os.environ.update(stack.environment())
    reset_clients()
    try:
        yield stack
    finally:
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
    yield boto3.client("ec2")
    local_stack.reset_moto()
