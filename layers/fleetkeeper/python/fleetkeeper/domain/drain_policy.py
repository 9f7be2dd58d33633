"""Drain timing rules (seeds 000 and 004): timeouts, deadlines, completion estimates."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from fleetkeeper.domain.models import (
    DEFAULT_POOL_DRAIN_TIMEOUT_SECONDS,
    MAX_DRAIN_TIMEOUT_SECONDS,
    DrainRecord,
    Instance,
    WorkerTemplate,
)


def worker_drain_timeout(requested_seconds: int | None, template: WorkerTemplate | None) -> int:
    """The request's timeout when positive, else the template's drain_timeout_hours (default 4 h)."""
    if requested_seconds is not None and requested_seconds > 0:
        return min(requested_seconds, MAX_DRAIN_TIMEOUT_SECONDS)
    if template is not None:
        return template.drain_timeout_seconds
    return WorkerTemplate.model_fields["drain_timeout_hours"].default * 3600  # type: ignore[no-any-return]


def pool_drain_timeout(requested_seconds: int | None) -> int:
    """Seed 004: an absent or non-positive timeout means 300 seconds."""
    if requested_seconds is None or requested_seconds <= 0:
        return DEFAULT_POOL_DRAIN_TIMEOUT_SECONDS
    return min(requested_seconds, MAX_DRAIN_TIMEOUT_SECONDS)


# A Standard execution holds at most 25,000 history events. One heartbeat re-check cycle costs 13 of
# them (docs/drains.md counts them), so at most this many re-checks per drain, plus one cycle for each
# move of its deadline (at most MAX_DEADLINE_MOVES) and one for a force, keeps an execution of the
# longest drain under 12,500 events, half the limit, whatever the sweep does.
MAX_RECHECKS_PER_DRAIN = 800
MAX_DEADLINE_MOVES = 100


def recheck_heartbeat(
    configured_seconds: int, span_seconds: float, budget: int = MAX_RECHECKS_PER_DRAIN
) -> int:
    """The await-empty heartbeat: the configured one, stretched so that waiting `span_seconds` re-checks
    at most `budget` times (a drain's whole timeout and MAX_RECHECKS_PER_DRAIN, unless it moved)."""
    return max(configured_seconds, math.ceil(span_seconds / max(budget, 1)))


def drain_heartbeat(configured_seconds: int, record: DrainRecord) -> int:
    """The heartbeat of a worker drain's waits: its re-check budget spread over its timeout, or once its
    deadline moved, what is left of the budget spread over the time from the move to the new deadline.

    Spreading the whole budget again after each move would let a drain extended many times re-check up
    to MAX_RECHECKS_PER_DRAIN times per move, past the history limit.
    """
    if record.deadline_moved_at is None:
        return recheck_heartbeat(configured_seconds, record.timeout_seconds)
    span = (record.deadline - record.deadline_moved_at).total_seconds()
    return recheck_heartbeat(configured_seconds, span, MAX_RECHECKS_PER_DRAIN - record.rechecks_spent)


def rechecks_by(configured_seconds: int, record: DrainRecord, now: datetime) -> int:
    """At most how many heartbeat re-checks the drain's waits have cost by `now`: one per heartbeat
    waited, since the start or the last move, on top of what was spent before it."""
    since = record.deadline_moved_at or record.started_at
    waited = max((min(now, record.deadline) - since).total_seconds(), 0.0)
    spent = record.rechecks_spent + math.ceil(waited / drain_heartbeat(configured_seconds, record))
    return min(spent, MAX_RECHECKS_PER_DRAIN)


def moved_deadline(started_at: datetime, timeout_seconds: int, now: datetime) -> tuple[datetime, int]:
    """The deadline a drain started at `started_at` gets from a new timeout, and the timeout stored with
    it. A deadline that would already be past is now, never earlier: the drain is forced at once."""
    requested = drain_deadline(started_at, timeout_seconds)
    if requested > now:
        return requested, timeout_seconds
    return now, max(math.ceil((now - started_at).total_seconds()), 1)


def moved(
    record: DrainRecord, deadline: datetime, timeout_seconds: int, now: datetime, heartbeat: int
) -> dict[str, Any]:
    """The changes that move a running drain's deadline at `now` (its `heartbeat` is the configured
    one), keeping its re-check budget (drain_heartbeat)."""
    return {
        "deadline": deadline,
        "timeout_seconds": timeout_seconds,
        "deadline_moved_at": now,
        "rechecks_spent": rechecks_by(heartbeat, record, now),
    }


def drain_deadline(started_at: datetime, timeout_seconds: int) -> datetime:
    return started_at + timedelta(seconds=timeout_seconds)


# A deadline less than this far away is due: timers fire on whole seconds and steps take time.
DEADLINE_TOLERANCE = timedelta(seconds=1)


def seconds_left(deadline: datetime, now: datetime) -> int:
    """Whole seconds until the deadline, rounded up so a timer never fires before it; at least 1."""
    return max(math.ceil((deadline - now).total_seconds()), 1)


def deadline_passed(deadline: datetime, now: datetime) -> bool:
    return now >= deadline - DEADLINE_TOLERANCE


def estimated_completion(active: Iterable[Instance], deadline: datetime, now: datetime) -> datetime:
    """The latest timeslot end among active instances, capped at the deadline.

    An instance without a timeslot end gives no promise, so the deadline is the honest estimate.
    With nothing active the drain is about to finish: now.
    """
    latest: datetime | None = None
    for instance in active:
        if instance.timeslot_end is None:
            return deadline
        if latest is None or instance.timeslot_end > latest:
            latest = instance.timeslot_end
    if latest is None:
        return now
    return min(max(latest, now), deadline)
