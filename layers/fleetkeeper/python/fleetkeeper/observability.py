"""The one place Logger, Tracer and Metrics are created."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator, Generator, Mapping, Sequence
from typing import Any

from aws_lambda_powertools import Logger, Metrics, Tracer
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.shared.functions import resolve_truthy_env_var_choice
from aws_lambda_powertools.tracing.base import BaseProvider, BaseSegment

# Each stage sets POWERTOOLS_SERVICE_NAME and POWERTOOLS_METRICS_NAMESPACE; the defaults serve local runs.
SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "fleetkeeper")
NAMESPACE = os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "fleetkeeper")


class _NoSegment(BaseSegment):
    """What a disabled Tracer's decorators annotate: nothing is recorded."""

    def close(self, end_time: int | None = None) -> None:
        return None

    def add_subsegment(self, subsegment: Any) -> None:
        return None

    def remove_subsegment(self, subsegment: Any) -> None:
        return None

    def put_annotation(self, key: str, value: Any) -> None:
        return None

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        return None

    def add_exception(self, exception: BaseException, stack: Any, remote: bool = False) -> None:
        return None


class _DisabledProvider(BaseProvider):
    """Stands in for the X-Ray recorder when tracing is off.

    Powertools resolves its X-Ray provider even for a disabled Tracer, which imports the X-Ray SDK core
    (tens of milliseconds of every cold start). Its handler decorator still opens a subsegment, so this
    provider hands out segments that record nothing. With tracing on (the deployed stages), the real
    recorder is used.
    """

    @contextlib.contextmanager
    def in_subsegment(self, name: str | None = None, **kwargs: Any) -> Generator[BaseSegment, None, None]:
        yield _NoSegment()

    @contextlib.asynccontextmanager
    async def in_subsegment_async(
        self, name: str | None = None, **kwargs: Any
    ) -> AsyncGenerator[BaseSegment, None]:
        yield _NoSegment()

    def put_annotation(self, key: str, value: Any) -> None:
        return None

    def put_metadata(self, key: str, value: Any, namespace: str = "default") -> None:
        return None

    def patch(self, modules: Sequence[str]) -> None:
        return None

    def patch_all(self) -> None:
        return None


def tracing_disabled() -> bool:
    """Powertools' own rule: off when POWERTOOLS_TRACE_DISABLED is true or outside the Lambda runtime."""
    if resolve_truthy_env_var_choice(env=os.environ.get("POWERTOOLS_TRACE_DISABLED", "false")):
        return True
    in_lambda = bool(os.environ.get("LAMBDA_TASK_ROOT"))
    emulated = bool(os.environ.get("AWS_SAM_LOCAL") or os.environ.get("AWS_CHALICE_CLI_MODE"))
    return not in_lambda or emulated


# Every call fleetkeeper makes leaves through botocore, so that is the one library patched. The default,
# patch_all, imports and patches every library X-Ray supports that happens to be installed (requests,
# sqlite3, httplib, ...): import time paid for libraries the functions never call, and for httplib a second
# subsegment under each AWS call.
PATCHED_MODULES = ("botocore",)


def _tracer() -> Tracer:
    if tracing_disabled():
        return Tracer(service=SERVICE, disabled=True, provider=_DisabledProvider())
    return Tracer(service=SERVICE, patch_modules=PATCHED_MODULES)


logger = Logger(service=SERVICE)
tracer = _tracer()
metrics = Metrics(namespace=NAMESPACE, service=SERVICE)


def emit_counters(prefix: str, counters: Mapping[str, int]) -> None:
    """Each non-zero counter as an EMF metric named <prefix>.<counter>."""
    for name, value in counters.items():
        if value:
            metrics.add_metric(name=f"{prefix}.{name}", unit=MetricUnit.Count, value=value)
