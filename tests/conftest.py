"""Shared fixtures: the local AWS stack (DynamoDB Local + moto server), one per test process."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from _pytest.nodeid import NodeId

from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.settings import get_settings
from fleetkeeper.store import machine_keys
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.aws_rules import AwsRules
from fleetkeeper_local.ec2_time import Delays
from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.stack import LocalStack, free_port
from tests.clients import forget_shared_clients, shared_client
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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Name each test's xdist_group in its node id, as `--dist loadgroup` schedules by: xdist 3.8 sets
    an attribute pytest 9.2 no longer reads node ids from, so every group was split across workers (two
    CDK syntheses, two e2e control planes). Last, after the suites' conftests have marked their tests."""
    if not getattr(config.option, "loadgroup", False):  # set on xdist's workers under loadgroup only
        return
    for item in items:
        groups = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        if groups and "@" not in item.nodeid.rpartition("]")[2]:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(sorted(groups))}")


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
    # Machines run at once, as moto's do: a test that wants boot time asks for it (ec2_time.delayed).
    stack = LocalStack(dynamodb_port=free_port(), moto_port=free_port(), ec2_delays=Delays(0.0, 0.0))
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


class ProcessTable:
    """The test process's one table, emptied after each test rather than dropped and created again.

    A test that leaves more than EMPTY_AT_MOST items behind gets the next table (a new name): emptying
    it would cost more than a new table, and whatever of that test still writes late writes to the old
    one. Whatever a test starts in the background (drain executions, API instances, threads) is
    stopped by the fixture or test that started it before this table is emptied.
    """

    EMPTY_AT_MOST = 500

    def __init__(self, stack: LocalStack) -> None:
        self._stack = stack
        self._prefix = f"fk-test-{uuid.uuid4().hex[:6]}"
        self._generation = 0
        self.name = self._next()

    def _next(self) -> str:
        self._generation += 1
        name = f"{self._prefix}-{self._generation}"
        self._stack.create_table(name)
        return name

    def reset(self) -> None:
        """As new for the next test: emptied, or replaced by a new table."""
        if not self._stack.empty_table(self.name, most=self.EMPTY_AT_MOST):
            self._stack.delete_table(self.name)
            self.name = self._next()
        # The store remembers per table name what only ever stays true on AWS (a region's machine keys
        # backfilled); an emptied table has lost it.
        with machine_keys._MIGRATED_LOCK:
            machine_keys._MIGRATED.clear()


@pytest.fixture(scope="session")
def process_table(local_stack: LocalStack) -> ProcessTable:
    return ProcessTable(local_stack)


@pytest.fixture
def table_name(process_table: ProcessTable, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An empty table for the test (the process's one), built from the shared definition."""
    monkeypatch.setenv("TABLE_NAME", process_table.name)
    get_settings.cache_clear()
    try:
        yield process_table.name
    finally:
        process_table.reset()
        get_settings.cache_clear()


@pytest.fixture
def dynamodb(local_stack: LocalStack) -> Any:
    return shared_client("dynamodb")


@pytest.fixture
def store(dynamodb: Any, table_name: str) -> FleetStore:
    return FleetStore(dynamodb, table_name)


@pytest.fixture
def ec2(local_stack: LocalStack) -> Iterator[Any]:
    """The tests' own EC2 client. Their set-ups launch machines in bursts beyond RunInstances' request
    bucket (AWS's limits hold on this client too), so it waits the bucket out as a careful caller would:
    adaptive retries, which pace the client to the refill rate."""
    yield shared_client("ec2", adaptive=True)
    local_stack.reset_moto()
    rules = _session_rules[0] if _session_rules else None
    if rules is not None and any(reason.startswith("ec2:") for reason in rules.summary()):
        # Throttled, the client keeps pacing itself slower; the next test starts with full buckets.
        forget_shared_clients()


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
