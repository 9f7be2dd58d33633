"""Cold start of each Lambda handler, as a ratio to the floor every Python Lambda pays.

A cold start runs the handler module's imports and module-level initialisation before the first event.
Each handler is timed as a whole process (`python -c "import functions.<name>.handler"`) against the floor
`import boto3; boto3.client("dynamodb")`, in alternating pairs, so drift of this noisy machine cancels
out: the figure is the median of the per-pair ratios. The environment is the one Lambda sets
(LAMBDA_TASK_ROOT, function name, region, the stack's variables), so Powertools initialises as it would
there, tracing included.

Two configurations are timed: tracing on, as every deployed stage runs (the X-Ray SDK is imported), which
is the figure the goal is judged on, and tracing off (POWERTOOLS_TRACE_DISABLED=true), which shows what
the X-Ray SDK costs.

Goal: every handler at most 1.5x the floor, tracing on.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from infra.shared_layer import shared_layer_dir

ROOT = Path(__file__).resolve().parents[1]
HANDLERS = ("api", "drain_tasks", "ec2_events", "reconcile", "discover")
FLOOR = "import boto3; boto3.client('dynamodb')"
PAIRS = 7
GOAL = 1.5
LAMBDA_ENVIRONMENT = {
    "LAMBDA_TASK_ROOT": str(ROOT),
    "AWS_LAMBDA_FUNCTION_NAME": "fleetkeeper-coldstart",
    "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512",
    "AWS_REGION": "us-east-1",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": "coldstart",
    "AWS_SECRET_ACCESS_KEY": "coldstart",
    "TABLE_NAME": "fleetkeeper-coldstart",
    "POWERTOOLS_SERVICE_NAME": "fleetkeeper",
    "POWERTOOLS_METRICS_NAMESPACE": "fleetkeeper",
}


TRACING_OFF = {"POWERTOOLS_TRACE_DISABLED": "true"}


def _seconds(code: str, extra: dict[str, str]) -> float:
    inherited = {k: v for k, v in os.environ.items() if k != "POWERTOOLS_TRACE_DISABLED"}
    # Our package as the shared layer ships it (with its bytecode), ahead of the editable install.
    path = f"{shared_layer_dir() / 'python'}{os.pathsep}{ROOT}"
    environment = {**inherited, **LAMBDA_ENVIRONMENT, **extra, "PYTHONPATH": path}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=environment)  # noqa: S603
    return time.perf_counter() - started


def measure(
    handler: str, pairs: int = PAIRS, extra: dict[str, str] | None = None
) -> tuple[float, float, float]:
    """(median handler seconds, median floor seconds, median of the per-pair ratios)."""
    code = f"import functions.{handler}.handler"
    extra = extra or {}
    _seconds(code, extra), _seconds(FLOOR, extra)  # warm the page cache and .pyc files
    handler_times, floor_times, ratios = [], [], []
    for _ in range(pairs):
        handler_seconds, floor_seconds = _seconds(code, extra), _seconds(FLOOR, extra)
        handler_times.append(handler_seconds)
        floor_times.append(floor_seconds)
        ratios.append(handler_seconds / floor_seconds)
    return statistics.median(handler_times), statistics.median(floor_times), statistics.median(ratios)


def run() -> str:
    rows = []
    for handler in HANDLERS:
        handler_seconds, floor_seconds, ratio = measure(handler)
        _, _, ratio_off = measure(handler, extra=TRACING_OFF)
        met = "met" if ratio <= GOAL else "not met"
        rows.append(
            f"| {handler} | {handler_seconds * 1000:.0f} ms | {floor_seconds * 1000:.0f} ms | "
            f"{ratio:.2f}x | {met} | {ratio_off:.2f}x |"
        )
        print(f"coldstart {handler}: {ratio:.2f}x the floor (tracing off {ratio_off:.2f}x)", flush=True)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    return "\n".join(
        [
            "## Cold start per handler (bench/coldstart_bench.py)",
            "",
            f"Whole-process import and initialisation of each handler against the floor `{FLOOR}`,",
            f"{PAIRS} alternating pairs, medians; {machine}; {datetime.now(UTC):%Y-%m-%d}. "
            f"Goal: ratio <= {GOAL}x with tracing on (the deployed configuration).",
            "",
            "| handler | handler, tracing on (median) | floor (median) | ratio, tracing on | goal "
            "| ratio, tracing off |",
            "|---|--:|--:|--:|---|--:|",
            *rows,
            "",
            "The api handler's import is mostly pydantic building the request and response models its first",
            "request validates with. It runs with SnapStart (docs/performance.md): a deployed cold start",
            "restores a snapshot taken after this import instead of running it.",
            "",
        ]
    )


if __name__ == "__main__":
    print(run())
