"""Drain timing rules (seeds 000 and 004): timeouts, deadlines, completion estimates."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta

from fleetkeeper.domain.models import (
    DEFAULT_POOL_DRAIN_TIMEOUT_SECONDS,
    MAX_DRAIN_TIMEOUT_SECONDS,
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
# them (docs/drains.md counts them), so at most this many re-checks per drain keeps an execution of the
# longest drain under 12,500 events, half the limit, whatever the sweep does.
MAX_RECHECKS_PER_DRAIN = 800


def recheck_heartbeat(configured_seconds: int, timeout_seconds: int) -> int:
    """The await-empty heartbeat: the configured one, stretched so a drain re-checks at most
    MAX_RECHECKS_PER_DRAIN times over its whole timeout."""
    return max(configured_seconds, math.ceil(timeout_seconds / MAX_RECHECKS_PER_DRAIN))


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
