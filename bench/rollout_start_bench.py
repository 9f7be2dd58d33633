"""The start of the largest rollout, against the 3 s an operator's request should take: a pool of
`ROLLOUT_START_BENCH_WORKERS` RUNNING workers (default MAX_ROLLOUT_WORKERS, 10,000) written straight to the
table, then, through the services the API routes call, each with the calls made and the index items read:

- a dry run (the scope read and the plan), with the size of its JSON body;
- a start: the scope read, the rollout with its member pages and audit in one transaction, and the claim
  of its first 50 workers (CLAIMS_AT_START) as the rollout's own (a hold each: read, then one
  conditional write);
- a second start of the same template and pool while the first is active: its 409;
- the engine's steps, one per reconcile cycle, until the rollout has claimed its whole scope (each step
  claims 200 more), counted and timed, and the workers it owns read back;
- a start that claims none (the scope read, the 409 checks and the rollout's transaction), to show what
  the claims cost;
- a start over the same workers once the first is cancelled (its claims have lapsed with it).

Each time is also given as a ratio to the dry run of the same run: the machine is shared and its pace
changes, and the earlier release's figures are set against theirs the same way.

Each figure is wall time on DynamoDB Local on the bench machine.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, TypeVar

from bench.reconcile_bench import write_fleet
from bench.rollout_step_bench import POOL, Reads, bench_pool, quiet, reads, workers_of
from bench.stack import bench_stack, use_table
from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.rollouts import MAX_ROLLOUT_WORKERS, Rollout, RolloutRequest
from fleetkeeper.services import rollouts
from fleetkeeper.services.context import default_context
from fleetkeeper.services.rollouts.commands import CLAIMS_AT_START
from fleetkeeper.services.rollouts.engine import step
from fleetkeeper.services.rollouts.step import CLAIM_THREADS, CLAIMS_PER_STEP

# What an operator's start should answer within; with rollout locks it took 17.6 s at 10,000 workers,
# in a run whose dry run took 2.1 s.
ANSWER_GOAL_SECONDS: Final = 3.0
EARLIER_START_SECONDS: Final = 17.6
EARLIER_DRY_RUN_SECONDS: Final = 2.1
NO_CLAIMS: Final = "start claiming none (after a cancel)"
T = TypeVar("T")


def workers_wanted() -> int:
    return int(os.environ.get("ROLLOUT_START_BENCH_WORKERS", MAX_ROLLOUT_WORKERS))


@dataclass
class Timed:
    label: str
    seconds: float
    reads: Reads


def _timed(label: str, call: Callable[[], T], rows: list[Timed]) -> T:
    with reads() as seen:
        started = time.perf_counter()
        result = call()
        seconds = time.perf_counter() - started
    rows.append(Timed(label, seconds, seen))
    print(f"{label}: {seconds:.2f} s, {sum(seen.calls.values())} calls", flush=True)
    return result


def _refused(request: RolloutRequest) -> str:
    try:
        rollouts.start(default_context(), request, actor="bench")
    except Conflict as refused:
        return refused.message
    raise RuntimeError("a second start of the same template and pool was not refused")


@dataclass
class Claiming:
    steps: int
    seconds: float
    owned: int
    reads: Reads


def _claim_all(rollout_id: str) -> Claiming:
    """The engine's steps until the rollout has claimed its scope, and the workers it then owns."""
    with reads() as seen:
        ctx = default_context()
        steps = 0
        started = time.perf_counter()
        rollout = ctx.rollouts.get(rollout_id)
        while rollout.claimed < rollout.total:
            rollout = step(ctx, rollout, utcnow())
            steps += 1
            print(
                f"step {steps}: {rollout.claimed} claimed, {time.perf_counter() - started:.0f} s", flush=True
            )
        seconds = time.perf_counter() - started
    ctx = default_context()
    ids = ctx.rollouts.members(rollout, 0, rollout.total)
    owned = sum(
        1 for w in ctx.store.get_workers(ids) if w.owner is not None and w.owner.rollout_id == rollout_id
    )
    print(f"claimed in {steps} steps, {seconds:.1f} s; {owned} workers owned", flush=True)
    return Claiming(steps, seconds, owned, seen)


def _met(ok: bool) -> str:
    return "met" if ok else "**not met**"


def _calls(r: Reads) -> str:
    return ", ".join(f"{name} {n}" for name, n in sorted(r.calls.items()))


def section(size: int, rows: list[Timed], body_bytes: int, refusal: str, claiming: Claiming) -> str:
    timed = {r.label: r for r in rows}
    dry, start, unclaimed = timed["dry run"], timed["start"], timed[NO_CLAIMS]
    expected = -(-(size - min(size, CLAIMS_AT_START)) // CLAIMS_PER_STEP)
    lines = [
        "## Rollout start at the largest scope",
        "",
        f"{size:,} RUNNING workers of one template and pool, `max_unavailable: 500` (surge, 20 waves); the",
        "services the API routes call, on DynamoDB Local. A start claims the first "
        f"{CLAIMS_AT_START} workers of its scope as the rollout's own and answers; the engine claims "
        f"{CLAIMS_PER_STEP} more a step, one step a reconcile cycle.",
        "",
        "| step | seconds | x dry run | index items | AWS calls |",
        "|---|---:|---:|---:|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row.label} | {row.seconds:.2f} | {row.seconds / dry.seconds:.1f} "
            f"| {row.reads.index_items:,} | {_calls(row.reads)} |"
        )
    lines += [
        f"| the engine's steps until the scope is claimed ({claiming.steps}) | {claiming.seconds:.1f} "
        f"| {claiming.seconds / dry.seconds:.1f} | {claiming.reads.index_items:,} "
        f"| {_calls(claiming.reads)} |",
        "",
        "| goal | figure | result |",
        "|---|---|---|",
        f"| the start answers within {ANSWER_GOAL_SECONDS:.0f} s (with rollout locks: "
        f"{EARLIER_START_SECONDS} s) | {start.seconds:.2f} s | {_met(start.seconds < ANSWER_GOAL_SECONDS)} |",
        f"| the start takes less of its dry run than with rollout locks "
        f"({EARLIER_START_SECONDS} / {EARLIER_DRY_RUN_SECONDS} = "
        f"{EARLIER_START_SECONDS / EARLIER_DRY_RUN_SECONDS:.1f} x) | {start.seconds / dry.seconds:.1f} x "
        f"| {_met(start.seconds / dry.seconds < EARLIER_START_SECONDS / EARLIER_DRY_RUN_SECONDS)} |",
        f"| the engine claims the rest in ceil(({size:,} - {CLAIMS_AT_START}) / {CLAIMS_PER_STEP}) = "
        f"{expected} cycles | {claiming.steps} | {_met(claiming.steps == expected)} |",
        f"| every worker of the scope is then the rollout's | {claiming.owned:,} of {size:,} "
        f"| {_met(claiming.owned == size)} |",
        "",
        f"Where the start's time goes: the scope read ({size:,} index items; the dry run is that read and "
        f"the plan: {dry.seconds:.2f} s), then the rollout's transaction and the 409 checks (a start that "
        f"claims none: {unclaimed.seconds:.2f} s), then its {CLAIMS_AT_START} claims (a GetItem and a "
        f"conditional write each, {CLAIM_THREADS} at once: the remaining "
        f"{max(start.seconds - unclaimed.seconds, 0):.2f} s).",
        "",
        f"The dry run's body: {body_bytes:,} bytes (ids of the first waves only). The second start's 409: "
        f'"{refusal}". Times follow the machine\'s load (1, 5 and 15 minute averages at the end of this run: '
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}); the call counts do not.",
        "",
    ]
    return "\n".join(lines)


def run() -> str:
    size = workers_wanted()
    rows: list[Timed] = []
    with quiet(), bench_stack() as stack:
        use_table(stack)
        ctx = default_context()
        bench_pool(ctx, ["bench"], "10%")
        write_fleet(ctx, workers_of("bench", POOL, size))
        request = RolloutRequest(template="bench", pool=POOL, max_unavailable=500)
        plan = _timed("dry run", lambda: rollouts.plan(default_context(), request), rows)
        body_bytes = len(plan.model_dump_json())
        first: Rollout = _timed(
            "start", lambda: rollouts.start(default_context(), request, actor="bench"), rows
        )
        refusal = _timed("second start while the first is active: 409", lambda: _refused(request), rows)
        claiming = _claim_all(first.id)
        rollouts.cancel(default_context(), first.id, actor="bench")
        bare: Rollout = _timed(
            NO_CLAIMS, lambda: rollouts.start(default_context(), request, actor="bench", claim=0), rows
        )
        rollouts.cancel(default_context(), bare.id, actor="bench")
        _timed(
            "start over the claims of a cancelled rollout",
            lambda: rollouts.start(default_context(), request, actor="bench"),
            rows,
        )
    return section(size, rows, body_bytes, refusal, claiming)


if __name__ == "__main__":
    print(run())
