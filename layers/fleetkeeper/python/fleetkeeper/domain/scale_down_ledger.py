"""The scale-down ledger: the limits of scale-down kept exact when several cycles decide at once.

Each reconcile cycle decides from a view of the fleet read at its start, from the status index. Two
cycles deciding at the same time (the reconcile shards, or an old and a new split during a deploy)
cannot see each other's choices in their views: each could scale the last spare worker of a scope
down, or start the drain that fills the budget. So every scale-down is first written to one ledger
item, under a version condition, with the deadline of the invocation that chose it. Until that
deadline (plus the index's lag) its effect may be missing from a view; after it, the choice has been
acted on or abandoned, and any view read later shows the result. A cycle counts its view and the
entries still in flight together, and the version condition makes the cycles take turns.

No assumption about schedules or periods is needed: an entry lives exactly as long as the invocation
that wrote it could still act on it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from pydantic import ConfigDict, Field

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Record, UtcDatetime, Worker
from fleetkeeper.domain.scale_down import Action, Guard, ScaleDownPolicy, scope_of

# How long a write may take to show in the status index after it landed. DynamoDB's global secondary
# indexes typically follow within a second; this allows for a slow stretch.
INDEX_LAG = timedelta(seconds=30)
# A cycle decides from a view at most this old; past it, it scales nothing down until its next view.
# Entries are kept this much longer than any view could need them, so no writer drops an entry that a
# slower cycle, deciding from an older view, must still count.
MAX_VIEW_AGE = timedelta(seconds=240)
# A ledger that holds this many entries refuses more: beyond any real burst of scale-downs within a
# few minutes, and it keeps the one item small (every entry is rewritten with each change).
MAX_IN_FLIGHT = 200


class InFlight(Record):
    """A scale-down some cycle chose, which other cycles' views may not show until `until`."""

    # Fields a later release adds are ignored rather than refused, so a rollback still reads the item.
    model_config = ConfigDict(extra="ignore")

    worker_id: str
    scope: str
    action: Action
    until: UtcDatetime


class ScaleDownLedger(Record):
    model_config = ConfigDict(extra="ignore")

    version: int = Field(default=0, ge=0)
    entries: list[InFlight] = Field(default_factory=list)


def in_flight(ledger: ScaleDownLedger, view_read_at: datetime) -> list[InFlight]:
    """The entries a view read at `view_read_at` may still miss: written by an invocation that could
    act on them after that view's index had caught up."""
    return [entry for entry in ledger.entries if entry.until + INDEX_LAG >= view_read_at]


def still_needed(ledger: ScaleDownLedger, now: datetime) -> list[InFlight]:
    """The entries a writer at `now` keeps: every one that a view young enough to decide from
    (`MAX_VIEW_AGE`) may still miss. Pruning by the writer's own view instead would drop entries
    that a slower cycle, with an older view, still has to count."""
    return [entry for entry in ledger.entries if entry.until + INDEX_LAG + MAX_VIEW_AGE >= now]


def view_too_old(view_read_at: datetime, now: datetime) -> bool:
    return now - view_read_at > MAX_VIEW_AGE


def admit(
    candidate: Worker,
    action: Action,
    *,
    entries: Sequence[InFlight],
    statuses: Mapping[str, WorkerStatus],
    running_in_scope: Mapping[str, int],
    policy: ScaleDownPolicy,
    fleet_size: int,
) -> Guard | None:
    """None when the limits still hold with this scale-down added to the view and the entries in
    flight; else the guard that refuses it.

    The view is what the cycle read: `statuses` by worker id and `running_in_scope` counted from it
    (not reduced by the cycle's own choices, which are entries too). A worker in flight that the view
    still shows RUNNING is leaving its scope; one the view shows DRAINING is counted once.
    """
    if len(entries) >= MAX_IN_FLIGHT or any(entry.worker_id == candidate.id for entry in entries):
        return Guard.IN_FLIGHT
    scope = scope_of(candidate)
    leaving = sum(
        1 for e in entries if e.scope == scope and statuses.get(e.worker_id) == WorkerStatus.RUNNING
    )
    if running_in_scope.get(scope, 0) - leaving - 1 < policy.min_workers:
        return Guard.MIN_WORKERS
    if action is Action.DRAIN:
        draining = {worker_id for worker_id, status in statuses.items() if status == WorkerStatus.DRAINING}
        draining |= {e.worker_id for e in entries if e.action is Action.DRAIN}
        if len(draining) >= policy.budget.allowed(fleet_size):
            return Guard.DISRUPTION_BUDGET
    return None
