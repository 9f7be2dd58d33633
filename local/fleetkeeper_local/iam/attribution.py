"""Which Lambda function is making the current AWS request.

The local invocation paths (invocation.invoke, the in-process Lambda dispatcher, the API adapter) run
each handler inside `acting_as(function)`; tests that call a service directly, as a function's handler
would, use `as_function`. The value is a context variable, so it follows the call into threads that copy
the context (services run their thread pools that way) and never leaks into the emulators' own threads.
A request made outside any function (test setup, the local stack's own bookkeeping) is not recorded.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Final, ParamSpec, TypeVar

# The stage's five functions, as their names end: fleetkeeper-<stage>-<function>.
FUNCTIONS: Final = ("api", "drain-tasks", "reconcile", "discover", "ec2-events")

P = ParamSpec("P")
T = TypeVar("T")

_current: ContextVar[str | None] = ContextVar("fleetkeeper_function", default=None)


def function_of(name: str) -> str:
    """`ec2_events`, `fleetkeeper-drain-tasks-1a2b3c4d` or `reconcile` -> the function it names."""
    short = name.replace("_", "-").removeprefix("fleetkeeper-")
    for function in sorted(FUNCTIONS, key=len, reverse=True):
        if short == function or short.startswith(f"{function}-"):
            return function
    raise ValueError(f"{name!r} names none of fleetkeeper's functions {FUNCTIONS}")


def current_function() -> str | None:
    return _current.get()


@contextmanager
def acting_as(function: str | None) -> Iterator[None]:
    """Attribute the AWS requests made inside the block to `function` (None: to no function)."""
    token = _current.set(function_of(function) if function is not None else None)
    try:
        yield
    finally:
        _current.reset(token)


def as_function(function: str, call: Callable[P, T]) -> Callable[P, T]:
    """`call`, attributing its AWS requests to `function`, as the function's handler would run it."""
    name = function_of(function)

    @functools.wraps(call)
    def attributed(*args: P.args, **kwargs: P.kwargs) -> T:
        with acting_as(name):
            return call(*args, **kwargs)

    return attributed
