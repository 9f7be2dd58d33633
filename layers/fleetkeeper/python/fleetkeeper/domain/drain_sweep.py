"""When the reconcile cycle's drain sweep calls Step Functions for an open drain, and in what order.

The sweep looks at every open drain of its shard each cycle, but calls Step Functions only for what is
due. It keeps one small mark per open drain (store/drain_marks.py) saying what it last did:

- the execution it last described, and when: the watchdog describes an execution again only after
  `watchdog_interval` (a new execution, after a restart, is described at once);
- the waiting task it last sent a heartbeat to (a digest of its token), and when: a heartbeat resets the
  task's heartbeat clock, so one is due only once half of `heartbeat` has passed since the last one. The
  other half is room for a missed or deferred cycle before the task's own safety-net re-check fires
  (which costs history events, not correctness). A task the sweep has not seen yet gets one at once.

Whatever is due but does not fit the cycle's time budget waits for the next cycle; the sweep takes the
drains that have waited longest first, so none starves (`sweep_order`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from fleetkeeper.domain.models import Record, UtcDatetime

DrainKind = Literal["worker", "pool"]

_NEVER = datetime.min.replace(tzinfo=UTC)


class DrainMark(Record):
    """What the sweep last did for one open drain (of a worker or a pool)."""

    kind: DrainKind
    key: str  # the worker id or the pool name
    execution_arn: str | None = None  # the execution last described
    described_at: UtcDatetime | None = None
    token_digest: str | None = None  # the waiting task last sent a heartbeat
    heartbeat_at: UtcDatetime | None = None


def token_digest(token: str) -> str:
    """A short stand-in for a task token (tokens run to a kilobyte; the mark only compares them)."""
    return hashlib.sha256(token.encode()).hexdigest()[:16]


def describe_due(mark: DrainMark | None, execution_arn: str, now: datetime, interval: timedelta) -> bool:
    """Whether the execution serving a drain is due for a DescribeExecution."""
    if mark is None or mark.execution_arn != execution_arn or mark.described_at is None:
        return True
    return now - mark.described_at >= interval


def heartbeat_due(mark: DrainMark | None, token: str, now: datetime, heartbeat: timedelta) -> bool:
    """Whether the waiting task with this token is due for a SendTaskHeartbeat."""
    if mark is None or mark.token_digest != token_digest(token) or mark.heartbeat_at is None:
        return True
    return now - mark.heartbeat_at >= heartbeat / 2


@dataclass(frozen=True)
class DueWork:
    """What the sweep will do for one open drain this cycle."""

    kind: DrainKind
    key: str
    complete: bool = False  # the drain's target is empty: answer its token (a lost signal)
    heartbeat: bool = False
    describe: bool = False
    # When the oldest of its due calls was last made (never: the beginning of time).
    waiting_since: datetime = _NEVER

    @property
    def calls(self) -> bool:
        return self.complete or self.heartbeat or self.describe


def waiting_since(mark: DrainMark | None, *, heartbeat: bool, describe: bool) -> datetime:
    """The time the longest-waiting of a drain's due calls was last made."""
    if mark is None:
        return _NEVER
    times = []
    if heartbeat:
        times.append(mark.heartbeat_at or _NEVER)
    if describe:
        times.append(mark.described_at or _NEVER)
    return min(times, default=_NEVER)


def sweep_order(work: list[DueWork]) -> list[DueWork]:
    """Lost signals first (each ends a drain), then the drains that have waited longest."""
    return sorted(work, key=lambda w: (not w.complete, w.waiting_since, w.kind, w.key))


def marked(
    mark: DrainMark | None,
    kind: DrainKind,
    key: str,
    *,
    now: datetime,
    heartbeat_token: str | None = None,
    described_arn: str | None = None,
) -> DrainMark:
    """The mark after this cycle's calls: a heartbeat sent to `heartbeat_token`, an execution described."""
    updated = mark or DrainMark(kind=kind, key=key)
    changes: dict[str, object] = {}
    if heartbeat_token is not None:
        changes.update(token_digest=token_digest(heartbeat_token), heartbeat_at=now)
    if described_arn is not None:
        changes.update(execution_arn=described_arn, described_at=now)
    return updated.model_copy(update=changes)
