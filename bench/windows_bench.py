"""Cron windows: the CPU cost of one answer per budget (domain/windows.py), against a trivial call.

A pool's disruption view and every refused voluntary disruption ask each budget for its window
(`window_at`) and the pool for the first window change that lets one more through (`blocked_until`).
Before windows were reckoned on whole days, the view of a pool with `0 * * * *` for 90m took 12.6 s,
with `* * * * *` for 2m 10.9 s, and with 20 such budgets 67 s. Goal: 1 ms of CPU per budget.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from fleetkeeper.domain.disruption import (
    Budget,
    DisruptionPolicy,
    DisruptionReason,
    _blocked_until,
    blocked_until,
    window_at,
)

CALLS = 200
GOAL_MS = 1.0
AT = datetime(2026, 3, 2, 10, 0, tzinfo=UTC)


def policy(schedule: str, minutes: int, zone: str, count: int = 1, step: int = 1) -> DisruptionPolicy:
    # Budgets of one pool differ in their durations, so that none shares another's answers.
    return DisruptionPolicy(
        budgets=[
            Budget(max=0, schedule=schedule, duration=f"{minutes + n * step}m", timezone=zone)
            for n in range(count)
        ]
    )


CASES: list[tuple[str, DisruptionPolicy]] = [
    ("`* * * * *` for 2m, Europe/Berlin", policy("* * * * *", 2, "Europe/Berlin")),
    ("`0 * * * *` for 90m, Europe/Berlin", policy("0 * * * *", 90, "Europe/Berlin")),
    (
        "20 budgets `* * * * *` for 2m-21m, Australia/Lord_Howe",
        policy("* * * * *", 2, "Australia/Lord_Howe", 20),
    ),
    (
        "20 budgets `0 * * * *` for 90m-109m, America/New_York",
        policy("0 * * * *", 90, "America/New_York", 20),
    ),
    ("`0 9 * * mon-fri` for 8h, Europe/Berlin", policy("0 9 * * mon-fri", 480, "Europe/Berlin")),
    ("`*/20 2 * * *` for 20m, Australia/Lord_Howe", policy("*/20 2 * * *", 20, "Australia/Lord_Howe")),
    (
        "2 freezes taking turns (`*/2` and `1-59/2 * * * *` for 1m): 64 changes",
        DisruptionPolicy(
            budgets=[
                Budget(max=0, schedule="*/2 * * * *", duration="1m", timezone="Europe/Berlin"),
                Budget(max=0, schedule="1-59/2 * * * *", duration="1m", timezone="Europe/Berlin"),
            ]
        ),
    ),
]


def cpu_ms(answer: Callable[[datetime], object], calls: int = CALLS) -> float:
    """CPU milliseconds per call of `answer` at instants 7 minutes and a second apart."""
    answer(AT - timedelta(days=1))  # schedules and zones read once, as a warm Lambda has them
    started = time.process_time()
    for n in range(calls):
        answer(AT + timedelta(minutes=7 * n, seconds=n))
    return (time.process_time() - started) * 1000 / calls


def blocked(pool: DisruptionPolicy) -> Callable[[datetime], object]:
    def answer(at: datetime) -> object:
        _blocked_until.cache_clear()  # each answer computed, not remembered
        return blocked_until(pool, DisruptionReason.SCALE_DOWN, at, members=10, in_use=0)

    return answer


def windows(pool: DisruptionPolicy) -> Callable[[datetime], object]:
    return lambda at: [window_at(b, at) for b in pool.budgets]


def run() -> str:
    load_before = os.getloadavg()[0]
    always = DisruptionPolicy(budgets=[Budget(max=1)])
    baseline = cpu_ms(windows(always), calls=CALLS * 10)
    rows = []
    worst = 0.0
    for name, pool in CASES:
        count = len(pool.budgets)
        window_ms = cpu_ms(windows(pool)) / count
        blocked_ms = cpu_ms(blocked(pool), calls=CALLS // 4) / count
        worst = max(worst, window_ms, blocked_ms)
        rows.append(
            f"| {name} | {count} | {window_ms:.3f} ms | {blocked_ms:.3f} ms | {blocked_ms / baseline:,.0f}x |"
        )
    now = datetime.now(UTC)
    met = "**Met**" if worst <= GOAL_MS else "**Not met**"
    return "\n".join(
        [
            "## Cron windows: CPU per budget (bench/windows_bench.py)",
            "",
            "One answer per budget of a pool, in process (no AWS): `window_at` of each budget, and",
            "`blocked_until` for a freeze (`max: 0`) of the pool, its memo cleared before each call; "
            f"{CALLS} instants 7 minutes apart (a quarter of that for `blocked_until`), CPU time.",
            "Baseline in the same run: `window_at` of a budget without a schedule, "
            f"{baseline * 1000:.1f} us.",
            f"Measured {now:%Y-%m-%d %H:%M} UTC on {platform.system()} {platform.machine()}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}, shared with other work (load "
            f"average {load_before:.0f} at the start, {os.getloadavg()[0]:.0f} at the end).",
            "",
            "| budgets | count | `window_at` per budget | `blocked_until` per budget "
            "| `blocked_until` / baseline |",
            "|---|--:|--:|--:|--:|",
            *rows,
            "",
            f"Goal: at most {GOAL_MS:g} ms of CPU per budget for every answer. {met}: the most is "
            f"{worst:.3f} ms. Before, the view of one `0 * * * *` 90m budget took 12.6 s and of 20 "
            "`* * * * *` 2m budgets 67 s: windows that keep overlapping were walked start by start, "
            "backwards, for each of up to 64 changes; now an answer jumps over whole days of starts and "
            "stops a year ahead.",
        ]
    )


if __name__ == "__main__":
    print(run())
