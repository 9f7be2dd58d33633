"""The scale-down ledger: the limits of scale-down kept exact when several cycles decide at once.

Each reconcile cycle decides from a view of the fleet. While a table is migrated (store/layout.py) the
view is a read of the whole status index at the cycle's start; once it is migrated, it is the exact
counters and the statuses of the workers in flight, both read afresh for each entry into the ledger
(statuses first). Two cycles deciding at the same time (the reconcile shards, or an old and a new split
during a deploy) cannot see each other's choices in their views: each could scale the last spare worker
of a scope down, or start the drain that fills the budget. So every scale-down is first written to one
ledger item, under a version condition, with the deadline of the invocation that chose it. Until that
deadline (plus the index's lag) its effect may be missing from a view; after it, the choice has been
acted on or abandoned, and any view read later shows the result. A cycle counts its view and the
entries still in flight together, and the version condition makes the cycles take turns.

No assumption about schedules or periods is needed: an entry lives exactly as long as the invocation
that wrote it could still act on it.

The ledger holds every voluntary disruption, whatever its reason (domain/disruption.py), so that a
pool's budgets count scale-down and, later, rollouts and expiry together: `check` admits one disruption
of a reason or names what refuses it, the pool's budget and until when included.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pydantic import ConfigDict, Field

from fleetkeeper.domain.disruption import (
    DISRUPTED,
    DISRUPTING,
    BudgetBlock,
    DisruptionPolicy,
    DisruptionReason,
    PoolLoad,
    assess,
    blocked_until,
    pool_of_scope,
)
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Record, UtcDatetime, Worker, utcnow
from fleetkeeper.domain.scale_down import Action, DisruptionBudget, Guard, ScaleDownPolicy, scope_of

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
    """A voluntary disruption some cycle chose, which other cycles' views may not show until `until`."""

    # Fields a later release adds are ignored rather than refused, so a rollback still reads the item.
    model_config = ConfigDict(extra="ignore")

    worker_id: str
    scope: str
    action: Action
    until: UtcDatetime
    # Entries written before reasons existed were all scale-downs.
    reason: DisruptionReason = DisruptionReason.SCALE_DOWN

    @property
    def pool(self) -> str | None:
        return pool_of_scope(self.scope)


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


def pool_in_flight(
    pool: str, entries: Sequence[InFlight], statuses: Mapping[str, WorkerStatus]
) -> list[InFlight]:
    """The pool's entries whose disruption the view does not count yet: the view shows their worker
    neither being disrupted (counted there) nor done with it (over), or does not show it at all."""
    return [e for e in entries if e.pool == pool and statuses.get(e.worker_id) not in DISRUPTING | DISRUPTED]


def _crowded(candidate: Worker, entries: Sequence[InFlight]) -> bool:
    """The candidate is in flight already, or the ledger is full."""
    return len(entries) >= MAX_IN_FLIGHT or any(entry.worker_id == candidate.id for entry in entries)


@dataclass(frozen=True)
class Limits:
    """What bounds voluntary disruptions at `at`, as the view shows the fleet: the stage default over
    the fleet's drains (MAX_CONCURRENT_DRAINS), and each pool's budgets over its disruptions."""

    at: datetime
    default: DisruptionBudget
    fleet_size: int
    draining: int
    policies: Mapping[str, DisruptionPolicy] = field(default_factory=dict)
    loads: Mapping[str, PoolLoad] = field(default_factory=dict)


@dataclass(frozen=True)
class Refusal:
    guard: Guard
    block: BudgetBlock | None = None


def check(
    candidate: Worker,
    action: Action,
    reason: DisruptionReason,
    *,
    entries: Sequence[InFlight],
    statuses: Mapping[str, WorkerStatus],
    limits: Limits,
) -> Refusal | None:
    """None when one more voluntary disruption of `reason` fits the budgets with the view and the
    entries in flight counted; else what refuses it.

    The pool's budgets that apply to the reason at `limits.at` count every disruption of the pool (the
    view's, and the entries the view does not show yet). When none applies, the stage default bounds
    drains fleet-wide (a stop needs no drain: it is bounded by the pool's budgets alone).
    """
    if _crowded(candidate, entries):
        return Refusal(Guard.IN_FLIGHT)
    pool = candidate.pool
    policy = limits.policies.get(pool) if pool else None
    if pool is not None and policy is not None and policy.budgets:
        load = limits.loads.get(pool, PoolLoad())
        in_use = load.disrupting + len(pool_in_flight(pool, entries, statuses))
        found = assess(policy, reason, limits.at, members=load.members, in_use=in_use)
        if found.allowed is not None:
            if found.admits:
                return None
            until = blocked_until(policy, reason, limits.at, members=load.members, in_use=in_use)
            return Refusal(
                Guard.POOL_BUDGET, BudgetBlock(pool, reason, found.limiting, found.allowed, in_use, until)
            )
    if action is Action.DRAIN:
        drains_in_flight = {
            e.worker_id
            for e in entries
            if e.action is Action.DRAIN and statuses.get(e.worker_id) != WorkerStatus.DRAINING
        }
        in_use = limits.draining + len(drains_in_flight)
        allowed = limits.default.allowed(limits.fleet_size)
        if in_use >= allowed:
            return Refusal(Guard.DISRUPTION_BUDGET, BudgetBlock(pool, reason, None, allowed, in_use))
    return None


def admit(
    candidate: Worker,
    action: Action,
    *,
    entries: Sequence[InFlight],
    statuses: Mapping[str, WorkerStatus],
    running_in_scope: Mapping[str, int],
    draining: int,
    policy: ScaleDownPolicy,
    fleet_size: int,
    limits: Limits | None = None,
) -> Guard | None:
    """None when the limits still hold with this scale-down added to the view and the entries in
    flight; else the guard that refuses it (`admit_scale_down` also says which budget).

    The view is the counts (`running_in_scope`, `draining`, `fleet_size`, not reduced by the cycle's
    own choices, which are entries too) and the statuses of at least the entries' workers, read no
    later than the counts. A worker in flight that the view still shows RUNNING is leaving its scope;
    one the view shows DRAINING is counted once. Statuses read before the counts can only make a
    worker count twice (it changed in between), never not at all: the limits hold either way.
    """
    refusal = admit_scale_down(
        candidate,
        action,
        entries=entries,
        statuses=statuses,
        running_in_scope=running_in_scope,
        policy=policy,
        limits=limits or Limits(at=utcnow(), default=policy.budget, fleet_size=fleet_size, draining=draining),
    )
    return refusal.guard if refusal else None


def admit_scale_down(
    candidate: Worker,
    action: Action,
    *,
    entries: Sequence[InFlight],
    statuses: Mapping[str, WorkerStatus],
    running_in_scope: Mapping[str, int],
    policy: ScaleDownPolicy,
    limits: Limits,
) -> Refusal | None:
    """The scale-down's own limit (the minimum per scope), then the budgets (`check`)."""
    if _crowded(candidate, entries):
        return Refusal(Guard.IN_FLIGHT)
    scope = scope_of(candidate)
    leaving = sum(
        1 for e in entries if e.scope == scope and statuses.get(e.worker_id) == WorkerStatus.RUNNING
    )
    if running_in_scope.get(scope, 0) - leaving - 1 < policy.min_workers:
        return Refusal(Guard.MIN_WORKERS)
    return check(
        candidate, action, DisruptionReason.SCALE_DOWN, entries=entries, statuses=statuses, limits=limits
    )
