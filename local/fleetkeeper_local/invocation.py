"""Calling our Lambda handlers in-process, with a Lambda context that behaves like the real one."""

from __future__ import annotations

import importlib
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fleetkeeper_local.event_shapes import LOCAL_ACCOUNT
from fleetkeeper_local.stack import LOCAL_REGION, project_root

Handler = Callable[[dict[str, Any], Any], Any]


@dataclass
class LocalLambdaContext:
    """The attributes Powertools and our handlers read from a Lambda context."""

    function_name: str
    timeout_seconds: float = 900.0
    memory_limit_in_mb: int = 512
    function_version: str = "$LATEST"
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    _started: float = field(default_factory=time.monotonic, repr=False)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:{LOCAL_REGION}:{LOCAL_ACCOUNT}:function:{self.function_name}"

    @property
    def log_group_name(self) -> str:
        return f"/aws/lambda/{self.function_name}"

    @property
    def log_stream_name(self) -> str:
        return f"local/{self.aws_request_id}"

    def get_remaining_time_in_millis(self) -> int:
        return max(int((self.timeout_seconds - (time.monotonic() - self._started)) * 1000), 0)


def load_handler(function: str) -> Handler:
    """The `handler` of functions/<function>/handler.py, imported as Lambda would run it."""
    root = str(project_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    module = importlib.import_module(f"functions.{function}.handler")
    handler: Handler = module.handler
    return handler


def invoke(function: str, event: dict[str, Any], *, timeout_seconds: float = 900.0) -> Any:
    """Invoke one function in-process, the way Lambda would: a fresh context per invocation."""
    context = LocalLambdaContext(function_name=f"fleetkeeper-{function}", timeout_seconds=timeout_seconds)
    return load_handler(function)(event, context)
