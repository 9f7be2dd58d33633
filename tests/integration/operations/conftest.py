"""Fixtures for worker operations: a catalogue, a service context that uses it, and API calls."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Final

import boto3
import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import DrainRecord, DrainThen, Worker, WorkerTemplate, utcnow
from fleetkeeper.services import catalog
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.services.drains import DrainInput
from fleetkeeper_local.controlplane import api_event, call_api, refresh_process_caches

pytestmark = pytest.mark.integration

CATALOGUE: Final[dict[str, Any]] = {
    "register-license": {
        "document": "fleetkeeper-dev-RegisterLicense",
        "parameters": {
            "licenseParameter": {
                "pattern": "^/[A-Za-z0-9/_.-]{1,200}$",
                "default": "/fleetkeeper/test/license",
            },
            "licenseServer": {"pattern": "^[a-z0-9.-]{1,100}$", "required": True},
        },
        "max_attempts": 2,
        "timeout_seconds": 60,
    },
    "deregister-license": {
        "document": "fleetkeeper-dev-DeregisterLicense",
        "cleanup": True,
        "max_attempts": 1,
        "timeout_seconds": 60,
    },
    "collect-system-info": {
        "document": "fleetkeeper-dev-CollectSystemInfo",
        "max_attempts": 1,
        "timeout_seconds": 60,
    },
}

BASE_SETTINGS: Final = {
    "OPERATIONS_CATALOGUE": json.dumps(CATALOGUE),
    "OPERATION_RETRY_BASE_SECONDS": "30",
    "SYSTEM_INFO_INTERVAL_SECONDS": "0",
    "BEFORE_STOP_TIMEOUT_SECONDS": "30",
    "METRICS_INTERVAL_SECONDS": "0",
}


@pytest.fixture
def settings_overrides() -> dict[str, str]:
    """Settings a test module changes on top of BASE_SETTINGS (override the fixture)."""
    return {}


@pytest.fixture
def ctx(
    table_name: str, monkeypatch: pytest.MonkeyPatch, settings_overrides: dict[str, str]
) -> Iterator[Context]:
    """The process-wide context (the API's too) on the test's table, with the test catalogue."""
    for key, value in {**BASE_SETTINGS, **settings_overrides}.items():
        monkeypatch.setenv(key, value)
    refresh_process_caches()
    yield default_context()
    refresh_process_caches()


def api(method: str, path: str, body: Any = None, query: dict[str, str] | None = None) -> tuple[int, Any]:
    response = call_api(
        api_event(method, path, body=json.dumps(body) if body is not None else None, query=query)
    )
    payload = json.loads(response["body"]) if response.get("body") else None
    return int(response["statusCode"]), payload


def start_drain(ctx: Context, worker: Worker, *, then: DrainThen = DrainThen.STOP) -> DrainInput:
    """The worker DRAINING under a fresh drain record, as the drain request writes it (no workflow)."""
    started = utcnow()
    record = DrainRecord(
        generation=worker.next_drain_generation,
        started_at=started,
        deadline=started + timedelta(hours=1),
        timeout_seconds=3600,
        requested_by="op",
        then=then,
    )
    ctx.store.transition_worker(
        ctx.store.get_worker(worker.id),
        WorkerStatus.DRAINING,
        cause=Cause.CONTROL,
        actor="op",
        changes={"drain": record},
    )
    return DrainInput(
        kind="worker",
        worker_id=worker.id,
        generation=record.generation,
        timeout_seconds=record.timeout_seconds,
        started_at=record.started_at,
        deadline=record.deadline,
        requested_by=record.requested_by,
        then=record.then.value,
        heartbeat_seconds=300,
    )


LICENSE_PARAMETER: Final = "/fleetkeeper/test/license"


@pytest.fixture(autouse=True)
def license_token(ctx: Context) -> str:
    """The SecureString the catalogue's register-license reads on the machine (its default parameter)."""
    boto3.client("ssm", region_name="us-east-1").put_parameter(
        Name=LICENSE_PARAMETER, Value="test-license-token", Type="SecureString", Overwrite=True
    )
    return LICENSE_PARAMETER


@pytest.fixture
def drained_worker(ctx: Context, machine_worker: Callable[..., Worker]) -> Worker:
    """A RUNNING, empty worker whose template releases its license before its workers stop."""
    catalog.put_template(
        ctx.store,
        WorkerTemplate(
            name="licensed",
            instance_type="m5.large",
            ami_name_filter="lab-*",
            capacity=2,
            before_stop=["deregister-license"],
        ),
        actor="test",
    )
    return machine_worker(template="licensed")
