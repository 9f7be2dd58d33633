"""The local stack a benchmark runs on: started, put into the environment, and taken down again.

Every benchmark that builds its own fleet goes through `bench_stack`, so none of them leaves the
emulators running, the environment changed or stale clients behind when it fails half-way.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.services import catalog
from fleetkeeper.services.context import Context, default_context
from fleetkeeper.settings import get_settings
from fleetkeeper_local.controlplane import activate, provision
from fleetkeeper_local.ec2_time import Delays
from fleetkeeper_local.stack import LocalStack, free_port

# The template the drain benchmarks' workers are of.
BENCH_TEMPLATE = WorkerTemplate(name="bench", instance_type="m5.large", ami_name_filter="bench-*", capacity=4)


@contextmanager
def bench_stack(*, log_level: str = "WARNING", metrics: bool = False) -> Iterator[LocalStack]:
    """DynamoDB Local and moto on free ports, their endpoints in the environment, for the block only.

    Metrics are off unless asked for: the benchmarks count what they measure themselves, and the EMF
    lines would only slow the loops they time.
    """
    # Machines boot at once: the benchmarks time the control plane, not an emulated boot.
    stack = LocalStack(dynamodb_port=free_port(), moto_port=free_port(), ec2_delays=Delays(0.0, 0.0)).start()
    saved = dict(os.environ)
    try:
        os.environ.update(stack.environment())
        if not metrics:
            os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", log_level)
        reset_clients()
        yield stack
    finally:
        stack.stop()
        os.environ.clear()
        os.environ.update(saved)
        reset_clients()
        get_settings.cache_clear()
        default_context.cache_clear()


def use_table(stack: LocalStack, prefix: str = "fk-bench") -> str:
    """A fresh table of the current schema, made the one the settings and the default context use."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    stack.create_table(name)
    os.environ["TABLE_NAME"] = name
    get_settings.cache_clear()
    default_context.cache_clear()
    return name


def drain_plane(stack: LocalStack) -> Context:
    """A provisioned control plane (table, drain state machine and its function, bus, topic) made the
    process's own, with the bench template stored: what a drain benchmark runs its drains on."""
    resources = provision(stack, f"fk-bench-{uuid.uuid4().hex[:8]}")
    activate(resources, heartbeat_seconds=300)
    ctx = default_context()
    catalog.put_template(ctx.store, BENCH_TEMPLATE, actor="bench")
    return ctx
