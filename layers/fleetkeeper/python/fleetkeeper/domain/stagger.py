"""When each reconcile shard starts inside the schedule's period, so the shards do not all hit EC2 (one
DescribeInstances bucket per region: 100 calls, refilled at 20 a second) and DynamoDB in the same second.

EventBridge Scheduler cannot offset a rate() schedule by seconds, and it invokes any schedule somewhere
within the minute it is due (60-second precision). So:

- when the period is whole minutes that divide an hour (2, 3, 4, 5, 6, 10, 12, 15, 20, 30, 60), each
  shard gets its own cron schedule at minute `floor(k * period / shards)` of the period: shards spread
  over whole minutes, at no cost;
- the shards that still share a minute (all of them at a one-minute period) wait inside the function:
  the j-th of n waits `j * STAGGER_WINDOW_SECONDS / n` after the time the schedule was due (which the
  Scheduler passes in), and not at all if it was invoked that late already. The wait is taken from the
  invocation's own time (the cycle's budget shrinks by it) and is billed as Lambda time, so the window
  is kept short: a quarter of a minute.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# The shards that share a minute start within this many seconds of it.
STAGGER_WINDOW_SECONDS = 15.0


@dataclass(frozen=True)
class ShardStart:
    """Where one shard's cycle starts in the period: its minute (cron) and the wait after it."""

    minute: int
    delay_seconds: float


def cron_minutes(period_minutes: int) -> bool:
    """Whether a schedule of this period can be written as a cron expression with a minute offset."""
    return 1 < period_minutes <= 60 and 60 % period_minutes == 0


def shard_starts(shards: int, period_minutes: int) -> list[ShardStart]:
    """The start of each shard's cycle, by shard index."""
    minutes = [k * period_minutes // shards if cron_minutes(period_minutes) else 0 for k in range(shards)]
    starts: list[ShardStart] = []
    for k, minute in enumerate(minutes):
        sharing = minutes.count(minute)
        position = minutes[:k].count(minute)
        starts.append(ShardStart(minute, round(position * STAGGER_WINDOW_SECONDS / sharing, 1)))
    return starts


def start_wait(delay_seconds: float, scheduled_at: datetime | None, now: datetime) -> float:
    """Seconds to wait before this invocation's cycle starts: until `delay_seconds` after the time its
    schedule was due, never longer than the delay itself (a late invocation waits less, or not at all)."""
    if delay_seconds <= 0:
        return 0.0
    if scheduled_at is None:
        return delay_seconds
    late = max((now - scheduled_at).total_seconds(), 0.0)
    return max(0.0, delay_seconds - late)
