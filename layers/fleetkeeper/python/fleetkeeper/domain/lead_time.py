"""A template's lead time: how long its workers really take from a launch, or a start, to RUNNING.

A worker carries what it is coming up from (`lead_kind`) and since when (`lead_since`) while it is
PROVISIONING or STARTING; the move that makes it RUNNING yields one sample. A template keeps the last
`SAMPLES_KEPT` samples of each kind, and its lead time is their 95th percentile, or the stated default
while there are fewer than `MIN_SAMPLES` (a few lucky boots are no promise).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Final, Literal

from fleetkeeper.domain.lifecycle import WorkerStatus

if TYPE_CHECKING:
    from fleetkeeper.domain.models import Worker

SAMPLES_KEPT: Final = 50
MIN_SAMPLES: Final = 5
PERCENTILE: Final = 95
DEFAULT_LAUNCH: Final = timedelta(minutes=10)
DEFAULT_START: Final = timedelta(minutes=2)
# The statuses a worker comes up through; leaving them for any other drops what it was coming up from.
COMING_UP: Final = frozenset({WorkerStatus.PROVISIONING, WorkerStatus.STARTING})


class LeadKind(StrEnum):
    LAUNCH = "launch"  # RunInstances to RUNNING
    START = "start"  # StartInstances of a stopped machine to RUNNING


@dataclass(frozen=True)
class LeadTime:
    """A template's lead times, in seconds, and what they rest on."""

    launch_seconds: float
    start_seconds: float
    samples_launch: int
    samples_start: int
    # measured: both figures come from samples; default: at least one is the stated default.
    source: Literal["measured", "default"]


def percentile(samples: Sequence[float], pct: int = PERCENTILE) -> float:
    """The nearest-rank percentile: the smallest sample at least `pct` % of the samples are at or under."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    return ordered[max(math.ceil(pct / 100 * len(ordered)) - 1, 0)]


def kept(samples: Sequence[float], new: float) -> list[float]:
    """The samples after adding one: the newest `SAMPLES_KEPT`, oldest first."""
    return [*samples, new][-SAMPLES_KEPT:]


def _figure(samples: Sequence[float], default: timedelta) -> tuple[float, bool]:
    recent = samples[-SAMPLES_KEPT:]
    if len(recent) < MIN_SAMPLES:
        return default.total_seconds(), False
    return percentile(recent), True


def lead_time_of(samples: Mapping[LeadKind, Sequence[float]]) -> LeadTime:
    """The p95 of the last samples of each kind, or the default while a kind has too few."""
    launches, starts = samples.get(LeadKind.LAUNCH, ()), samples.get(LeadKind.START, ())
    launch, launch_measured = _figure(launches, DEFAULT_LAUNCH)
    start, start_measured = _figure(starts, DEFAULT_START)
    return LeadTime(
        launch_seconds=launch,
        start_seconds=start,
        samples_launch=min(len(launches), SAMPLES_KEPT),
        samples_start=min(len(starts), SAMPLES_KEPT),
        source="measured" if launch_measured and start_measured else "default",
    )


def coming_up(kind: LeadKind, since: datetime) -> dict[str, Any]:
    """The fields a launch or a start writes with the move that begins it."""
    return {"lead_kind": kind, "lead_since": since}


def settled_lead(worker: Worker, target: WorkerStatus) -> dict[str, Any]:
    """What a move to `target` clears: once the worker leaves the statuses it comes up through, what it
    was coming up from is over (a sample was taken, or the boot never finished)."""
    if target in COMING_UP or (worker.lead_kind is None and worker.lead_since is None):
        return {}
    return {"lead_kind": None, "lead_since": None}


def sample_of(before: Worker, after: Worker) -> tuple[LeadKind, float] | None:
    """The lead-time sample a move yields: a worker coming up that is now RUNNING, timed from when its
    launch or start began to when EC2 was seen running (the move's time if nobody observed it)."""
    if after.status != WorkerStatus.RUNNING or before.status not in COMING_UP:
        return None
    if before.lead_kind is None or before.lead_since is None:
        return None
    observed = after.ec2_observed_at
    until = observed if observed is not None and observed != before.ec2_observed_at else after.updated_at
    return before.lead_kind, max((until - before.lead_since).total_seconds(), 0.0)
