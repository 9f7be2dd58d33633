"""The start of the largest rollout, against API Gateway's 29 s: a pool of `ROLLOUT_START_BENCH_WORKERS`
RUNNING workers (default MAX_ROLLOUT_WORKERS, 10,000) written straight to the table, then, through the
services the API routes call:

- a dry run (the scope read and the plan), with the size of its JSON body;
- a start on free locks (the scope read, a lock per worker in transactions of 99, a few at once, and the
  rollout with its member pages and audit in one transaction);
- a second start over the same workers once the first is cancelled (every lock taken over from a
  finished rollout: each transaction refused once, its holders read, then taken);
- the rollback of that rollout from its last wave (the member pages read, a lock per replacement).

Each figure is wall time on DynamoDB Local on the bench machine, with the AWS calls made.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from typing import Any

from bench.reconcile_bench import write_fleet
from bench.rollout_bench import POOL, counting
from bench.stack import bench_stack, use_table
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.rollouts import MAX_ROLLOUT_WORKERS, RolloutRequest
from fleetkeeper.services import catalog, rollouts
from fleetkeeper.services.context import Context, default_context
from fleetkeeper_local.stack import LOCAL_REGION

# API Gateway's integration timeout: a start must answer well inside it.
API_TIMEOUT_SECONDS = 29


def workers_wanted() -> int:
    return int(os.environ.get("ROLLOUT_START_BENCH_WORKERS", MAX_ROLLOUT_WORKERS))


def _fleet(ctx: Context, size: int) -> None:
    catalog.put_template(
        ctx.store,
        WorkerTemplate(name="bench", instance_type="m5.large", ami_name_filter="bench-*", capacity=4),
        actor="bench",
    )
    catalog.put_pool(
        ctx.store,
        POOL,
        actor="bench",
        disruption=DisruptionPolicy(budgets=[Budget(max="10%", reasons=[DisruptionReason.ROLLOUT])]),
    )
    now = utcnow()
    write_fleet(
        ctx,
        [
            Worker(
                id=f"w-{n:016x}",
                template="bench",
                pool=POOL,
                region=LOCAL_REGION,
                status=WorkerStatus.RUNNING,
                capacity=4,
                image_id="ami-bench",
                instance_type="m5.large",
                launched_at=now,
                version=3,
            )
            for n in range(size)
        ],
    )


def _timed(label: str, call: Any, rows: list[tuple[str, float, Counter[str]]]) -> Any:
    with counting() as calls:
        started = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - started
    rows.append((label, seconds, Counter(calls)))
    print(f"{label}: {seconds:.1f} s, {sum(calls.values())} calls")
    return result


def run() -> str:
    size = workers_wanted()
    rows: list[tuple[str, float, Counter[str]]] = []
    body_bytes = 0
    with bench_stack() as stack:
        use_table(stack)
        ctx = default_context()
        _fleet(ctx, size)
        request = RolloutRequest(template="bench", pool=POOL, max_unavailable=500)
        plan = _timed("dry run", lambda: rollouts.plan(default_context(), request), rows)
        body_bytes = len(plan.model_dump_json())
        first = _timed(
            "start, free locks", lambda: rollouts.start(default_context(), request, actor="bench"), rows
        )
        rollouts.cancel(default_context(), first.id, actor="bench")
        second = _timed(
            "start, locks taken over from a finished rollout",
            lambda: rollouts.start(default_context(), request, actor="bench"),
            rows,
        )
        current = ctx.rollouts.get(second.id)
        last = ctx.rollouts.save(current, {"wave": current.wave_count - 1}, actor="bench")
        _timed(
            "rollback from the last wave",
            lambda: rollouts.begin_rollback(default_context(), last, actor="bench", reason="bench"),
            rows,
        )
    lines = [
        "## Rollout start at the largest scope",
        "",
        f"{size} RUNNING workers of one template and pool, `max_unavailable: 500` (20 waves); the services",
        f"the API routes call, on DynamoDB Local. API Gateway gives a request {API_TIMEOUT_SECONDS} s.",
        "",
        "| step | seconds | AWS calls |",
        "|---|---:|---|",
    ]
    for label, seconds, calls in rows:
        shown = ", ".join(f"{name} {n}" for name, n in sorted(calls.items()))
        lines.append(f"| {label} | {seconds:.1f} | {shown} |")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    lines += [
        "",
        f"The dry run's body: {body_bytes:,} bytes (ids of the first waves only). DynamoDB Local spends CPU",
        "on each transaction, so the times follow the machine's load (1, 5 and 15 minute averages at the",
        f"end of this run: {load}); the call counts do not.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(run())
