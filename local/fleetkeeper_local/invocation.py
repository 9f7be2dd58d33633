"""Calling our scheduled and event-driven Lambda handlers in-process, as Lambda would."""

from __future__ import annotations

import importlib
import sys
from typing import Any

from fleetkeeper_local.iam.attribution import acting_as
from fleetkeeper_local.lambdas import Handler, LocalLambdaContext
from fleetkeeper_local.stack import project_root

# The reconcile and discover functions' timeout on AWS; the reconciler plans its cycle by it.
SCHEDULED_TIMEOUT_SECONDS = 300


def load_handler(function: str) -> Handler:
    """The `handler` of functions/<function>/handler.py."""
    root = str(project_root())
    if root not in sys.path:
        sys.path.insert(0, root)
    handler: Handler = importlib.import_module(f"functions.{function}.handler").handler
    return handler


def invoke(function: str, event: dict[str, Any], *, timeout_seconds: int = SCHEDULED_TIMEOUT_SECONDS) -> Any:
    """Invoke one function in-process with a fresh context, as one Lambda invocation."""
    context = LocalLambdaContext(function_name=f"fleetkeeper-{function}", timeout_seconds=timeout_seconds)
    with acting_as(function):
        return load_handler(function)(event, context)
