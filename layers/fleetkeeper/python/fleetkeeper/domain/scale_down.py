"""Scale-down rules: when an idle worker may be stopped or drained, and which guard refuses otherwise."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from fleetkeeper.domain.bookings import due_until
from fleetkeeper.domain.capacity import Target, shortfall
from fleetkeeper.domain.disruption import DisruptionReason
from fleetkeeper.domain.drift import current_drift
from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.models import DrainThen, Worker, WorkerSummary


class Guard(StrEnum):
    """A reason not to scale a worker down; each refusal is logged and counted under its name."""

    DISABLED = "disabled"
    MIN_WORKERS = "min_workers"
    COOLDOWN = "cooldown"
    UPCOMING_TIMESLOT = "upcoming_timeslot"
    DO_NOT_DISRUPT = "do_not_disrupt"
    # The stage default, MAX_CONCURRENT_DRAINS, for drains of pools none of whose budgets applies.
    DISRUPTION_BUDGET = "disruption_budget"
    # A budget of the worker's pool (domain/disruption.py).
    POOL_BUDGET = "pool_budget"
    # Someone else holds the worker (domain/admission.py), or it changed status since the cycle read it:
    # it is looked at again next cycle.
    IN_FLIGHT = "in_flight"
    # Its pool is draining or inactive: no voluntary disruption of it until the pool is active again.
    POOL_NOT_ACTIVE = "pool_not_active"


class Action(StrEnum):
    NONE = "none"
    STOP = "stop"  # idle and empty: nothing to wait for
    DRAIN = "drain"  # idle but still holding instances: let them finish
    TERMINATE = "terminate"  # STOPPED beyond its pool's warm set: nothing runs on it


_BUDGET = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(%?)\s*$")


@dataclass(frozen=True)
class DisruptionBudget:
    """How many drains may run at once: a count, or a percentage of the fleet (rounded up)."""

    count: int | None = None
    percent: float | None = None

    @classmethod
    def parse(cls, text: str) -> DisruptionBudget:
        match = _BUDGET.match(text)
        if match is None:
            raise InvalidInput("MAX_CONCURRENT_DRAINS", f"'{text}' is neither a count nor a percentage")
        number, percent = match.groups()
        if percent:
            return cls(percent=float(number))
        if "." in number:
            raise InvalidInput("MAX_CONCURRENT_DRAINS", "a count must be a whole number")
        return cls(count=int(number))

    def allowed(self, fleet_size: int) -> int:
        if self.count is not None:
            return self.count
        # Rounded up so a small fleet with a non-zero percentage can still scale down one at a time.
        return math.ceil((self.percent or 0.0) * fleet_size / 100)


@dataclass(frozen=True)
class ScaleDownPolicy:
    enabled: bool
    min_workers: int
    cooldown: timedelta
    idle_window: timedelta
    cpu_threshold: float
    lookahead: timedelta
    budget: DisruptionBudget


@dataclass(frozen=True)
class Verdict:
    """What scale-down proposes for one worker. Idle scale-down stops (`scale_down`, the stage's
    minimum); scale-in (`underutilized`) stops or terminates, its floor the serving workers of the
    worker's template its pool keeps."""

    action: Action
    reason: str
    refused_by: Guard | None = None
    cause: DisruptionReason = DisruptionReason.SCALE_DOWN
    then: DrainThen = DrainThen.STOP
    floor: int | None = None


def protected_from_disruption(worker: Worker, now: datetime) -> bool:
    """`do_not_disrupt`, or a `do_not_disrupt_until` still in the future (it lapses by itself)."""
    until = worker.do_not_disrupt_until
    return worker.do_not_disrupt or (until is not None and now < until)


def scope_of(worker: WorkerSummary) -> str:
    """Workers that can stand in for each other: same template in the same pool."""
    return f"{worker.template}#{worker.pool or '-'}"


def next_idle_since(
    current: datetime | None, cpu: float | None, threshold: float, now: datetime
) -> datetime | None:
    """Track since when the worker has looked idle; a busy reading resets it, no reading keeps it."""
    if cpu is None:
        return current
    if cpu < threshold:
        return current or now
    return None


def evaluate(
    worker: Worker,
    *,
    now: datetime,
    policy: ScaleDownPolicy,
    last_scale_down_at: datetime | None,
    timeslot_starts: Callable[[], Iterable[datetime]],
) -> Verdict:
    """Whether scale-down proposes this RUNNING worker now, by its own guards in order: idle for the
    window, enabled, the scope's cooldown, no timeslot coming. Whether it may go (its protection, the
    scope's minimum, the budgets) is the door's to say (domain/admission.py)."""
    if worker.idle_since is None or now - worker.idle_since < policy.idle_window:
        return Verdict(Action.NONE, "not idle for the idle window")
    action = Action.STOP if worker.active_instances == 0 else Action.DRAIN
    if not policy.enabled:
        return Verdict(Action.NONE, "scale-down is disabled", Guard.DISABLED)
    if last_scale_down_at is not None and now - last_scale_down_at < policy.cooldown:
        return Verdict(Action.NONE, f"last scale-down at {last_scale_down_at.isoformat()}", Guard.COOLDOWN)
    horizon = now + policy.lookahead
    if action is Action.DRAIN:
        upcoming = [start for start in timeslot_starts() if now <= start <= horizon]
        if upcoming:
            return Verdict(
                Action.NONE, f"a timeslot starts at {min(upcoming).isoformat()}", Guard.UPCOMING_TIMESLOT
            )
    idle_for = int((now - worker.idle_since).total_seconds())
    return Verdict(action, f"idle for {idle_for}s")


def booked_within(starts: Iterable[datetime], now: datetime, lead: timedelta) -> datetime | None:
    """The first timeslot that starts by the due horizon (domain/bookings.due_until, two lead times),
    if any: the cycle places a due booking that early, on the worker it brought up, which must stay."""
    due = [start for start in starts if now <= start <= due_until(now, lead)]
    return min(due) if due else None


def scale_in(
    target: Target,
    running: Sequence[WorkerSummary],
    *,
    cap: int | None,
    kept: Callable[[WorkerSummary], Guard | None],
) -> list[WorkerSummary]:
    """The RUNNING workers of a pool with a capacity policy that scale-in proposes, in order: empty
    ones first, then the least loaded. One goes only while the pool keeps `target.floor` workers and
    the free slots of the rest hold `target.headroom_slots` and a slot for each of `target.bookings`
    due (unless the pool is above `cap`). A full worker is never proposed: it holds no headroom, and
    draining it only delays its reuse. `kept` says why a worker must stay (booked, protected, held),
    asked only of a worker that could go."""
    free = sum(w.free_slots for w in running)
    # Due bookings not placed yet take free slots this very cycle (services/bookings.serve_bookings).
    keep_free = target.headroom_slots + target.bookings
    left = len(running)
    taken: list[WorkerSummary] = []
    for worker in sorted(running, key=lambda w: (w.active_instances, -w.free_slots, w.id)):
        if left - 1 < target.floor:
            break
        over_cap = cap is not None and left > cap
        if worker.free_slots == 0 or (not over_cap and free - worker.free_slots < keep_free):
            continue
        if kept(worker) is not None:
            continue
        taken.append(worker)
        left -= 1
        free -= worker.free_slots
    return taken


def warm_surplus(
    target: Target,
    warm: Sequence[Worker],
    *,
    running: int,
    launching: int,
    stopping: int,
    refilling: int,
    template: str | None,
    now: datetime,
    limit: int,
) -> list[Worker]:
    """The STOPPED workers scale-in terminates from a pool's warm set, at most `limit`: as many as the
    set holds beyond `target.warm` once scale-out has woken what the RUNNING target lacks (counted as
    `capacity.shortfall` counts them: `warm` the STOPPED workers staying so, `stopping`, `refilling`
    those launching to refill the set), never a protected one. The newest are kept: first to go are
    those of another template than the policy's, then the drifted, then the oldest."""
    need = shortfall(
        target,
        running=running,
        launching=launching,
        refilling=refilling,
        stopping=stopping,
        stopped=len(warm),
    )
    # Only a STOPPED worker scale-out leaves asleep can go, however many stopping or refilling are over.
    asleep = len(warm) - need.start
    surplus = min(asleep, asleep + stopping + refilling - target.warm)
    if surplus <= 0:
        return []
    ranked = sorted(
        (w for w in warm if not protected_from_disruption(w, now)),
        key=lambda w: (
            w.template == template,
            current_drift(w) is None,
            w.launched_at or w.created_at,
            w.id,
        ),
    )
    return ranked[: min(surplus, limit)]
