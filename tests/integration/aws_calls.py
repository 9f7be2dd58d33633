"""The calls the code under test makes to AWS, counted through botocore's event hooks.

Like a fault plan (fleetkeeper_local.faults), the counter is a built-in botocore handler: every client
created inside the block carries it, and the cached clients and the process-wide context are rebuilt
on the way in and out. A context built before the block keeps its uncounted clients: build it inside.
Open the counter outside any fault plan, so that it also counts the calls the plan answers itself.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from botocore import handlers

from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.services.context import default_context

# The DynamoDB operations that write.
WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"})


class CallCount(Counter[str]):
    """Calls by `<service>:<Operation>`, e.g. `ec2:DescribeInstances`, `sfn:DescribeExecution`, and
    the parameters of each call in order (`requests`)."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def sent(self, service: str, operation: str) -> list[dict[str, Any]]:
        """The parameters of every such call, as the client serialized them."""
        return [params for name, params in self.requests if name == f"{service}:{operation}"]

    def of(self, service: str, *operations: str) -> int:
        return sum(self[f"{service}:{operation}"] for operation in operations)

    @property
    def table_writes(self) -> int:
        return self.of("dynamodb", *WRITES)


def _forget_clients() -> None:
    reset_clients()
    default_context.cache_clear()


@contextmanager
def aws_calls() -> Iterator[CallCount]:
    """Count every AWS call made through clients created inside the block."""
    seen = CallCount()
    lock = threading.Lock()

    def record(event_name: str, params: dict[str, Any] | None = None, **_: Any) -> None:
        parts = event_name.split(".")  # before-call.<service>.<Operation>
        name = f"{parts[1]}:{parts[-1]}"
        body = (params or {}).get("body")
        if isinstance(body, bytes) and body.startswith(b"{"):
            body = json.loads(body)  # the JSON protocols (SSM, DynamoDB) send their parameters as JSON
        with lock:
            seen[name] += 1
            seen.requests.append((name, dict(body) if isinstance(body, dict) else {}))

    spec = ("before-call", record)
    handlers.BUILTIN_HANDLERS.append(spec)
    _forget_clients()
    try:
        yield seen
    finally:
        handlers.BUILTIN_HANDLERS.remove(spec)
        _forget_clients()
