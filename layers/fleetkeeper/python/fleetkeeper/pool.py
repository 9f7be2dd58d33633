"""A thread pool whose tasks run in a copy of the submitting thread's context.

A plain ThreadPoolExecutor runs each task in the worker thread's own, empty context, so context
variables set by the invocation are lost in the pool: Powertools' thread-safe log keys, and the
attribution of AWS requests to the function that makes them (the local stack's IAM evaluation).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")


class ContextThreadPool(ThreadPoolExecutor):
    """ThreadPoolExecutor whose tasks see the submitter's context variables (each task its own copy)."""

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        # One copy per task: a Context can be entered by one thread at a time.
        context = contextvars.copy_context()
        return super().submit(lambda: context.run(fn, *args, **kwargs))
