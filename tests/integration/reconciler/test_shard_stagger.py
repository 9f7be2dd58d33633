"""A shard whose schedule shares its minute with others starts its cycle a few seconds after it was due."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.models import utcnow
from fleetkeeper.settings import get_settings
from fleetkeeper_local.invocation import invoke

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("handler_context")]

# Longer than an invocation's own overhead on a slow machine (loading the handler, building clients).
DELAY = 4.0


def tick(*, late: float) -> tuple[dict[str, Any], float]:
    """The second of two shards' schedule input, as EventBridge Scheduler fills it in, `late` seconds
    after the time it was due; with how long the invocation waited before its cycle."""
    event = {
        "source": "fleetkeeper.schedule",
        "task": "reconcile",
        "shard": 1,
        "shards": 2,
        "start_delay_seconds": DELAY,
        "scheduled_time": (utcnow() - timedelta(seconds=late)).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
    }
    started = time.monotonic()
    report: dict[str, Any] = invoke("reconcile", event)
    return report, time.monotonic() - started - report["duration_seconds"]


def test_given_a_shard_due_now_then_its_cycle_waits_its_delay_and_a_late_one_does_not(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("RECONCILE_SHARDS", "2")
    get_settings.cache_clear()

    on_time, waited = tick(late=0)
    on_time_log = caplog.text
    caplog.clear()
    late, no_wait = tick(late=DELAY + 5)
    late_log = caplog.text

    assert (on_time["shard"], on_time["lease_acquired"]) == (1, True)
    assert waited >= DELAY - 0.1
    assert "waits for its slot" in on_time_log
    assert late["lease_acquired"] is True
    assert "waits for its slot" not in late_log
    assert no_wait < DELAY - 1
