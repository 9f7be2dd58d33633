"""Drain time of a worker whose only work is SCHEDULED: with rescheduling against without, in one run.

Each drain starts on a RUNNING worker holding two SCHEDULED instances whose timeslot starts in an hour,
next to a RUNNING worker of the same template with room, and is timed from the drain request to the
worker being STOPPING, on the local stack (DynamoDB Local, moto Step Functions running
infra/statemachines/drain.asl.json, drain_tasks in-process).

- With rescheduling (the default) the Begin step moves both instances and the drain finishes at once.
- Without it (`"reschedule": false`) the drain waits for the instances: for their timeslot, or until its
  deadline forces them. To keep the run short the deadline is the API's minimum, 60 s (set through the
  service the API calls); a drain with the template's default deadline (4 h) would wait hours or until
  the timeslot ends. These drains run side by side, since each only waits for its own deadline.

Run: `make bench` (all benchmarks) or `python -m bench reschedule`.
"""

from __future__ import annotations

import os
import platform
import statistics
import threading
import time
from datetime import UTC, datetime, timedelta

from bench.drain_bench import running_worker, wait_for
from bench.stack import bench_stack, drain_plane
from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper.services import drains, placement
from fleetkeeper.services.context import Context

WITH_REPEATS = 10
WITHOUT_REPEATS = 3
INSTANCES_PER_WORKER = 2
# The API's minimum drain timeout (api/schemas.py MIN_DRAIN_TIMEOUT_SECONDS).
SHORT_DEADLINE_SECONDS = 60
# Goal: a drain of only-scheduled work ends within this, instead of waiting for a timeslot or deadline.
GOAL_SECONDS = 2.0


def loaded_worker(ctx: Context) -> tuple[str, list[str]]:
    """A RUNNING worker with SCHEDULED instances an hour away, and a RUNNING worker with room beside it."""
    worker = running_worker(ctx)
    running_worker(ctx)  # the target: same template, empty
    start = datetime.now(UTC) + timedelta(hours=1)
    placed = [
        placement.place_instance(
            ctx.store,
            actor="bench",
            worker_id=worker.id,
            timeslot_start=start,
            timeslot_end=start + timedelta(hours=2),
        )
        for _ in range(INSTANCES_PER_WORKER)
    ]
    return worker.id, [i.id for i in placed]


def drain_seconds(ctx: Context, worker_id: str, *, reschedule: bool, timeout: int | None = None) -> float:
    started = time.perf_counter()
    drains.start_worker_drain(ctx, worker_id, actor="bench", reschedule=reschedule, timeout_seconds=timeout)
    wait_for(
        lambda: ctx.store.get_worker(worker_id).status is WorkerStatus.STOPPING,
        timeout=SHORT_DEADLINE_SECONDS * 3,
        interval=0.01,
    )
    return time.perf_counter() - started


def with_reschedule(ctx: Context) -> tuple[list[float], int]:
    samples, moved = [], 0
    for _ in range(WITH_REPEATS):
        worker_id, instance_ids = loaded_worker(ctx)
        samples.append(drain_seconds(ctx, worker_id, reschedule=True))
        moved += sum(1 for i in instance_ids if ctx.store.get_instance(i).worker_id != worker_id)
    return samples, moved


def without_reschedule(ctx: Context) -> tuple[list[float], int]:
    loaded = [loaded_worker(ctx) for _ in range(WITHOUT_REPEATS)]
    samples: list[float] = []
    lock = threading.Lock()

    def one(worker_id: str) -> None:
        seconds = drain_seconds(ctx, worker_id, reschedule=False, timeout=SHORT_DEADLINE_SECONDS)
        with lock:
            samples.append(seconds)

    threads = [threading.Thread(target=one, args=(worker_id,)) for worker_id, _ in loaded]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    forced = sum(
        1
        for _, instance_ids in loaded
        for i in instance_ids
        if ctx.store.get_instance(i).state is InstanceState.TERMINATED
    )
    return samples, forced


def render(with_samples: list[float], moved: int, without_samples: list[float], forced: int) -> str:
    with_median, without_median = statistics.median(with_samples), statistics.median(without_samples)
    met = with_median <= GOAL_SECONDS and with_median < without_median
    machine = (
        f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}"
    )
    lines = [
        "## Drain of a worker whose only work is scheduled: with reschedule against without",
        "",
        f"Drain request → worker STOPPING, for a worker holding {INSTANCES_PER_WORKER} SCHEDULED instances",
        "whose timeslot starts in an hour, next to an empty RUNNING worker of the same template; local stack",
        "(DynamoDB Local, moto Step Functions running the drain ASL, drain_tasks in-process), one run.",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {machine}, shared with other work.",
        "",
        "| drain | repeats | median | min | max | instances |",
        "|---|---|---|---|---|---|",
        f"| with reschedule (default) | {len(with_samples)} | {with_median:.2f} s | "
        f"{min(with_samples):.2f} s | {max(with_samples):.2f} s | {moved} moved to the other worker |",
        f'| `"reschedule": false`, {SHORT_DEADLINE_SECONDS} s deadline | {len(without_samples)} | '
        f"{without_median:.2f} s | {min(without_samples):.2f} s | {max(without_samples):.2f} s | "
        f"{forced} force-terminated at the deadline |",
        "",
        f"Goal: with reschedule, the drain ends within {GOAL_SECONDS:.0f} s (median) instead of waiting for",
        f"the instances' timeslot or the deadline. **{'Met' if met else 'Not met'}**: "
        f"{with_median:.2f} s against {without_median:.2f} s "
        f"({without_median / with_median:.0f}x shorter).",
        "",
        f"Without reschedule the drain's length is its deadline, set here to {SHORT_DEADLINE_SECONDS} s (the",
        "API's minimum, through the service) to keep the run short: with the template's default (4 h) it",
        "would wait until the timeslot ends or 4 h pass, and then kill the work it waited for. The",
        "without-drains run side by side; each only waits for its own deadline.",
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    with bench_stack(log_level="ERROR") as stack:
        ctx = drain_plane(stack)
        with_samples, moved = with_reschedule(ctx)
        without_samples, forced = without_reschedule(ctx)
    return render(with_samples, moved, without_samples, forced)


if __name__ == "__main__":
    print(run())
