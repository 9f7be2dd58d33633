"""The one door for disruption: every actor that would disrupt a worker asks `Door.admit` with the
worker, the reason and itself, and gets the worker as its admitting write left it, or what holds it
back (docs/disruption.md, "Who may disrupt a worker").

The rule is domain/admission.judge; this module reads what it decides from (each pool's state once per
door, shared by every candidate), runs the write the actor gives under the claim the rule names, and
decides again on a fresh read when that write loses a race. What it holds back is kept as the pool's
waiting list (GET /api/v1/pools/{name}/disruption) when the door closes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Final

from fleetkeeper.cloud.clients import client
from fleetkeeper.cloud.retry import CONFLICT_ATTEMPTS, pause_after_conflict, retry_conflicts
from fleetkeeper.domain.admission import (
    Admitted,
    Ask,
    Claim,
    Held,
    PoolState,
    counted,
    holds,
    judge,
    same_owner,
    unsettled,
)
from fleetkeeper.domain.disruption import MEMBERS, DisruptionReason, Waiting, pool_of_scope
from fleetkeeper.domain.errors import NoLongerDue, StaleWrite
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.models import Owner, Worker, utcnow
from fleetkeeper.domain.rollouts import ACTIVE
from fleetkeeper.domain.scale_down import DisruptionBudget
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context
from fleetkeeper.store.disruption import BudgetTaken, read_counts

# What the actor's write does with the owner the door admitted: it writes it, with the claim, in the
# same conditional write that starts the disruption (or, admitted ahead, alone).
Start = Callable[[Worker, Owner, Claim | None], Worker]
# What the worker read afresh must still be for a disruption decided earlier: None when it is, else why
# it is not.
Expect = Callable[[Worker], str | None]


def expecting(start: Start, expect: Expect | None) -> Start:
    """`start`, refused with NoLongerDue when the worker read afresh fails `expect`. The write `start`
    makes is conditional on that read's version, so the check holds up to the write itself."""
    if expect is None:
        return start

    def checked(current: Worker, owner: Owner, claim: Claim | None) -> Worker:
        why = expect(current)
        if why is not None:
            raise NoLongerDue(current.id, current.status, why)
        return start(current, owner, claim)

    return checked


ATTEMPTS: Final = CONFLICT_ATTEMPTS


def stage_default(ctx: Context) -> DisruptionBudget:
    return DisruptionBudget.parse(ctx.settings.max_concurrent_drains)


class Door:
    """One step's (or one cycle's) way through the door: `state` reads a pool's once and shares it; an
    admission counts itself into it for the next candidate; a write that lost a race reads afresh."""

    def __init__(self, ctx: Context, now: datetime | None = None) -> None:
        self.ctx = ctx
        self.now = now or utcnow()
        self._states: dict[str | None, PoolState] = {}
        self._fleet: FleetCounts | None = None
        self._rollouts: dict[str, bool] = {}
        self.held: dict[str, list[Waiting]] = {}

    # ---- what the door decides from ----------------------------------------------------------------

    def state(self, pool: str | None) -> PoolState:
        if pool not in self._states:
            self._states[pool] = self._read(pool)
        return self._states[pool]

    @property
    def unread(self) -> PoolState:
        """No pool's state: what a hold or an imposed disruption is decided with (they read none)."""
        return PoolState(
            at=self.now,
            pool=None,
            in_use=0,
            owned_by_template={},
            members=0,
            members_by_template={},
            fleet_in_use=0,
            fleet_size=0,
            default=stage_default(self.ctx),
        )

    def forget(self, pool: str | None) -> None:
        """Read the pool's state (and the fleet's counts) afresh next time."""
        self._states.pop(pool, None)
        self._fleet = None

    def _read(self, pool_name: str | None) -> PoolState:
        store = self.ctx.store
        pool = store.find_pool(pool_name) if pool_name else None
        counts = read_counts(client("dynamodb"), self.ctx.settings.table_name, pool_name)
        if self._fleet is None:
            self._fleet = store.fleet_counts()
        members: dict[str, int] = {}
        for (scope, status), count in self._fleet.cells.items():
            if pool_of_scope(scope) == pool_name and status in MEMBERS:
                template = scope.partition("#")[0]
                members[template] = members.get(template, 0) + count
        return PoolState(
            at=self.now,
            pool=pool,
            in_use=counts.in_use,
            owned_by_template=counts.by_template,
            members=sum(members.values()),
            members_by_template=members,
            fleet_in_use=counts.fleet,
            fleet_size=self._fleet.fleet_size,
            default=stage_default(self.ctx),
        )

    def active(self, rollout_id: str) -> bool:
        """Whether the rollout is active (its ownership holds), read once per door."""
        if rollout_id not in self._rollouts:
            found = self.ctx.rollouts.find(rollout_id)
            self._rollouts[rollout_id] = found is not None and found.status in ACTIVE
        return self._rollouts[rollout_id]

    def holder(self, worker: Worker) -> Owner | None:
        """Who holds the worker now, if anyone (an owner whose ownership lapsed holds nothing)."""
        owner = worker.owner
        if owner is not None and holds(owner, worker.status, self.now, self.active):
            return owner
        return None

    # ---- the door --------------------------------------------------------------------------------------

    def admit(
        self,
        worker: Worker | str,
        ask: Ask,
        start: Start,
        *,
        action: str = "drain",
        read: Worker | None = None,
    ) -> Worker | Held:
        """Decide on the worker (read afresh, from the base table) and, admitted, run `start`: the
        worker as it wrote it, or what holds the disruption back (recorded as waiting for its pool).
        `read`: the worker as a strongly consistent read of the base table just gave it (one batch read
        for many admissions), taken for the first attempt; the write's condition on its version refuses
        it if it changed since.

        A write that finds the budget taken, the pool changed or the worker changed since the read is
        decided again on fresh reads; after ATTEMPTS such races the last StaleWrite propagates."""
        worker_id = worker if isinstance(worker, str) else worker.id
        for attempt in range(ATTEMPTS):
            current = read if attempt == 0 and read is not None else self.ctx.store.get_worker(worker_id)
            # Only a voluntary disruption is decided on its pool's budgets.
            state = self.state(current.pool) if ask.voluntary and not ask.hold else self.unread
            verdict = judge(ask, current, state, self.now, active=self.active)
            if isinstance(verdict, Held):
                self.record_held(current, ask, verdict, action)
                return verdict
            try:
                written = start(current, verdict.owner, verdict.claim)
            except StaleWrite as lost:
                if attempt + 1 == ATTEMPTS:
                    raise
                if isinstance(lost, BudgetTaken) or lost.entity == "pool":
                    self.forget(current.pool)
                pause_after_conflict(lost, attempt)
                continue
            self._counted(current, verdict)
            return written
        raise AssertionError("unreachable")

    def release(self, worker: Worker | str, ask: Ask) -> None:
        """Give back an admission this actor made ahead and will not start after all (its count goes in
        the same write); nothing when someone else owns the worker by now."""
        worker_id = worker if isinstance(worker, str) else worker.id

        def give_back() -> None:
            current = self.ctx.store.get_worker(worker_id)
            if current.owner is None or not same_owner(current.owner, ask):
                return
            self.ctx.store.update_worker(
                current,
                {"owner": None},
                actor=ask.actor,
                action="WorkerDisruptionReleased",
                reason=str(ask.reason),
            )
            self.forget(current.pool)

        retry_conflicts(give_back)

    def _counted(self, before: Worker, verdict: Admitted) -> None:
        if counted(verdict.owner) and not counted(before.owner) and before.pool in self._states:
            self._states[before.pool] = self._states[before.pool].admitted(before.template)

    def record_held(self, worker: Worker, ask: Ask, held: Held, action: str) -> None:
        """Keep a voluntary disruption held back as waiting in its pool's list (written on close)."""
        logger.info(
            "disruption held back",
            worker_id=worker.id,
            reason=str(ask.reason),
            why=str(held.why),
            detail=held.detail,
        )
        if worker.pool is None or not isinstance(ask.reason, DisruptionReason):
            return
        self.held.setdefault(worker.pool, []).append(
            Waiting(
                worker_id=worker.id,
                reason=ask.reason,
                action=action,
                why=str(held.why),
                detail=held.detail[:500],
                budget=held.budget,
                allowed=held.allowed,
                in_use=held.in_use,
                refused_at=self.now,
                until=held.until,
            )
        )

    def close(self) -> int:
        """Record what the door held back as each pool's waiting list; how many pools could not be
        written (logged: the next door records them again)."""
        missed = 0
        for pool, entries in sorted(self.held.items()):
            if entries and not self.ctx.waiting.add(pool, entries, self.now):
                missed += 1
                logger.info("disruptions held back not recorded: the pool's list stayed busy", pool=pool)
        self.held.clear()
        return missed


def settle_owners(
    ctx: Context,
    workers: Iterable[Worker],
    counters: Counter[str],
    now: datetime | None = None,
    *,
    time_left: Callable[[], float] = lambda: float("inf"),
    margin_seconds: float = 0.0,
) -> None:
    """Release the counted owners whose disruption never started (a lapsed admission, an ended
    rollout's) and adopt the disruptions no owner counts (domain/admission.unsettled): each worker read
    afresh and written on its version, each on its own; what the time left does not reach waits for
    the next cycle (`owners_deferred`)."""
    opened = Door(ctx, now)
    for seen in workers:
        if not unsettled(seen, opened.now, opened.active)[0]:
            continue
        if time_left() < margin_seconds:
            counters["owners_deferred"] += 1
            continue

        def settle(worker_id: str = seen.id) -> None:
            current = ctx.store.get_worker(worker_id)
            wrong, owner = unsettled(current, opened.now, opened.active)
            if not wrong:
                return
            adopted = owner is not None and owner.counted
            action = "WorkerDisruptionAdopted" if adopted else "WorkerDisruptionReleased"
            ctx.store.update_worker(current, {"owner": owner}, actor="reconciler", action=action)
            counters["owners_adopted" if adopted else "owners_released"] += 1

        try:
            retry_conflicts(settle)
        except Exception:  # one worker's, never the cycle's: looked at again next cycle
            logger.exception("owner not settled", worker_id=seen.id)
            counters["owner_errors"] += 1


@contextmanager
def door(ctx: Context, now: datetime | None = None) -> Iterator[Door]:
    """A door for one step or one cycle, its waiting list recorded when it closes."""
    opened = Door(ctx, now)
    try:
        yield opened
    finally:
        try:
            opened.close()
        except Exception:  # a diagnosis; never the step's failure
            logger.exception("disruptions held back not recorded")


def hold_ahead(
    ctx: Context,
    door_: Door,
    worker: Worker | str,
    ask: Ask,
    *,
    action: str = "drain",
    expect: Expect | None = None,
) -> Worker | Held:
    """Admit a disruption whose start comes later (a surge's drain once its replacement runs): the owner
    alone is written now, counted in the budgets from now (NoLongerDue when the worker fails `expect`)."""

    def own(current: Worker, owner: Owner, claim: Claim | None) -> Worker:
        if current.owner == owner:
            return current
        return ctx.store.update_worker(
            current,
            {"owner": owner},
            actor=ask.actor,
            action="WorkerDisruptionAdmitted",
            reason=str(ask.reason),
            claim=claim,
        )

    return door_.admit(worker, ask, expecting(own, expect), action=action)
