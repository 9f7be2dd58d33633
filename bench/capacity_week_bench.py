"""A simulated week on a lab platform: three ways to have capacity for it, side by side in one run.

The strategies:
- (a) always on: each pool runs its peak size all week, the peak computed from the timetable;
- (b) reactive: a worker launches when a placement finds no room (as a cluster autoscaler does), and a
  worker idle for IDLE_MINUTES terminates;
- (c) fleetkeeper: each pool's CapacityPolicy (min 0, headroom, warm workers, schedules before its local
  09:00 peak, bookings), decided by main's pure domain rules wherever main has one (below).

This is a discrete-event simulation with a simulated clock, not the local stack: a week is 10,080
one-minute cycles per strategy and runs in seconds. What is the simulation's own:
- Workload: POOLS in three time zones; BOOKINGS booked sessions drawn from a class timetable (Monday to
  Friday, starts on the hour at local times weighted by HOUR_WEIGHTS, 09:00 the peak, Mondays weighted
  DAY_WEIGHTS heavier, sessions of 1 to 3 h), each booked 1 to 14 days ahead; walk-ins, WALK_IN_SHARE of
  the bookings' number, arrive with no notice at a random second of 08:00-18:00 local on a weekday. A
  session holds one slot; a worker has SLOTS. The same workload (seed SEED) feeds every strategy.
- EC2: a launch takes 4-8 min to running and a start of a stopped machine 60-90 s, each drawn uniformly
  from the strategy's own seeded RNG; a stop takes STOP_SECONDS; a terminate frees the machine at once.
  EC2 never refuses a launch here (capacity errors are tested elsewhere). A new worker is RUNNING when
  EC2 says running (the ec2-events path applies that in seconds).
- Placement takes a free slot on a RUNNING worker, fullest first (PlacementStrategy.PACK). A walk-in
  that finds none waits, first come first served, for the next slot that frees or comes up (a client
  retrying its 409), and keeps its slot for its duration from when it got one. In (a) and (b) a booked
  session is placed the same way at its timeslot_start, late ones waiting as walk-ins do.
- Cost: worker-hours are hours RUNNING, at the instance's list price (bench/prices.py); every worker
  that exists (launching, running, stopped) keeps a VOLUME_GB gp3 volume; warm workers cost that only.
- (a) launched its workers before the week: they are running from its first minute.
- (b) decides in the same one-minute cycle: it launches enough workers for the sessions waiting beyond
  the slots already launching, up to MAX_WORKERS.
- (c)'s cycle per pool, in main's order (services/reconcile): each worker's own step (a refill that came
  up RUNNING stops), scale-in, the due bookings placed, scale-out. The services' glue is modelled: the
  counts by status and what each launch is for (services/capacity.assess_pool), the drain (a drained
  worker takes no placement and stops or terminates once empty; its deadline is never reached, sessions
  being shorter than the 4 h default), and of the door only the stage default budget
  (MAX_CONCURRENT_DRAINS of the RUNNING and DRAINING workers at once; the pools have no budgets).
- (c)'s rules that are main's own functions: the target (`capacity_target`, the schedules' cron windows
  in each zone), scale-out (`shortfall`, MAX_NEW_PER_CYCLE, the last `warm` of the new workers refills),
  the lead time (`lead_time_of`: the p95 of the pool's last 50 launches, 10 minutes until it has 5),
  the booking clock (`due_until` and `phase`: a booking is due from two lead times before its timeslot,
  placed by the cycle on a RUNNING worker with room, counted into the target while unplaced, FAILED
  `no_capacity_by_timeslot` if its timeslot starts unplaced), and scale-in (`scale_in` with
  `booked_within` as its booked guard, `warm_short` for the warm set's room, the budget's `allowed`,
  `warm_surplus` for the STOPPED workers beyond the warm target, terminated without a budget's room).
  Every booking waits for capacity from when it is made: it is assumed to find no room that far ahead
  (main would place it at once on a RUNNING worker with room; see the section).
- A booked session counts as on time when its slot is on a RUNNING worker at its timeslot_start: a
  booking left on a worker that scale-in has begun to drain is late (it still runs there).
- The section also runs (c) with each policy of TUNING (the first is (c)'s), and (c)'s policy on
  ten other seeds.
- AWS calls, counted per simulated hour: RunInstances, StartInstances, StopInstances and
  TerminateInstances, one batch per pool and cycle (as issue 32 asks; main batches its launches and
  starts so, and stops and terminates one worker a call: the instance actions are counted too); the
  fixed reads: the reconcile cycle's DescribeInstances of the fleet's live machines (1000 a page) every
  minute, and discovery's DescribeInstances and DescribeInstanceStatus every 5 minutes, the same for
  every strategy.

Run: `python -m bench capacity_week`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import time as clock
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from functools import partial
from typing import Final
from zoneinfo import ZoneInfo

from bench import prices
from fleetkeeper.domain.bookings import Phase, due_until, phase
from fleetkeeper.domain.capacity import (
    CapacityPolicy,
    CapacitySchedule,
    Target,
    capacity_target,
    shortfall,
    warm_short,
)
from fleetkeeper.domain.lead_time import LeadKind, kept, lead_time_of, percentile
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerSummary
from fleetkeeper.domain.scale_down import DisruptionBudget, Guard, booked_within, scale_in, warm_surplus
from fleetkeeper.services.reconcile.capacity import MAX_NEW_PER_CYCLE
from fleetkeeper.services.reconcile.scale_down import MAX_WARM_TRIM_PER_CYCLE
from fleetkeeper.settings import Settings

SEED: Final = 32
# Sunday 18:00 UTC: 03:00 on Monday in Tokyo, so every pool's week of classes lies inside the run.
WEEK_START: Final = datetime(2026, 2, 1, 18, tzinfo=UTC)
MONDAY: Final = date(2026, 2, 2)
WEEK: Final = timedelta(days=7)
CYCLE_SECONDS: Final = 60
POOLS: Final = {"berlin": "Europe/Berlin", "new-york": "America/New_York", "tokyo": "Asia/Tokyo"}
BOOKINGS: Final = 2000
WALK_IN_SHARE: Final = 0.10
DAY_WEIGHTS: Final = (1.6, 1.0, 1.0, 1.0, 1.0)  # Monday to Friday
HOUR_WEIGHTS: Final = {9: 8, 10: 2, 11: 2, 13: 3, 14: 3, 15: 2, 16: 1}
DURATIONS: Final = {60: 3, 90: 2, 120: 3, 180: 2}  # minutes: weight
BOOKED_AHEAD_DAYS: Final = (1.0, 14.0)
WALK_IN_HOURS: Final = (8, 18)
SLOTS: Final = 4
INSTANCE_TYPE: Final = "m6i.xlarge"
VOLUME_GB: Final = 50
LAUNCH_SECONDS: Final = (240.0, 480.0)
START_SECONDS: Final = (60.0, 90.0)
STOP_SECONDS: Final = 60.0
IDLE_MINUTES: Final = 10
MAX_WORKERS: Final = 60
DESCRIBE_PAGE: Final = 1000
DISCOVERY_EVERY: Final = 5  # cycles
# Goal of issue 32: (c) costs at most this share of (a).
COST_GOAL: Final = 0.45


class Strategy(StrEnum):
    ALWAYS_ON = "(a) always on at peak"
    REACTIVE = "(b) reactive"
    FLEETKEEPER = "(c) fleetkeeper policy"


class State(StrEnum):
    LAUNCHING = "launching"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"
    TERMINATED = "terminated"


MUTATING: Final = ("RunInstances", "StartInstances", "StopInstances", "TerminateInstances")


@dataclass(frozen=True)
class Session:
    id: int
    pool: str
    start: float  # seconds from WEEK_START: the timeslot's start, or a walk-in's arrival
    minutes: int
    booked_at: float | None  # None: a walk-in

    @property
    def end(self) -> float:
        return self.start + 60 * self.minutes


def _at(pool: str, day: int, seconds: float) -> float:
    local = datetime.combine(MONDAY + timedelta(days=day), time(), tzinfo=ZoneInfo(POOLS[pool]))
    return (local + timedelta(seconds=seconds) - WEEK_START).total_seconds()


def workload(bookings: int = BOOKINGS, seed: int = SEED) -> list[Session]:
    """The week's booked sessions on the timetable and its walk-ins, ordered by start."""
    rng = random.Random(seed)
    pools, days = list(POOLS), range(len(DAY_WEIGHTS))
    sessions: list[Session] = []
    for n in range(bookings + round(bookings * WALK_IN_SHARE)):
        pool = rng.choice(pools)
        day = rng.choices(days, DAY_WEIGHTS)[0]
        minutes = rng.choices(list(DURATIONS), list(DURATIONS.values()))[0]
        if n < bookings:
            start = _at(pool, day, 3600 * rng.choices(list(HOUR_WEIGHTS), list(HOUR_WEIGHTS.values()))[0])
            ahead = 86400 * rng.uniform(*BOOKED_AHEAD_DAYS)
            sessions.append(Session(n, pool, start, minutes, booked_at=start - ahead))
        else:
            start = _at(pool, day, rng.uniform(3600 * WALK_IN_HOURS[0], 3600 * WALK_IN_HOURS[1]))
            sessions.append(Session(n, pool, start, minutes, booked_at=None))
    return sorted(sessions, key=lambda s: (s.start, s.id))


def peak_workers(sessions: Iterable[Session], pool: str) -> int:
    """Workers the pool's busiest moment of booked sessions needs, with room for its walk-in share."""
    edges = sorted(
        (t, d)
        for s in sessions
        if s.pool == pool and s.booked_at is not None
        for t, d in ((s.start, 1), (s.end, -1))
    )
    peak = max(itertools.accumulate(d for _, d in edges), default=0)
    return math.ceil(peak * (1 + WALK_IN_SHARE) / SLOTS)


def morning_workers(sessions: Iterable[Session], pool: str, weekdays: Iterable[int]) -> int:
    """Workers the pool's largest 09:00 start of booked sessions on these weekdays needs."""
    days = set(weekdays)
    starts = Counter(
        s.start
        for s in sessions
        if s.pool == pool and s.booked_at is not None and s.start in {_at(pool, d, 9 * 3600) for d in days}
    )
    return math.ceil(max(starts.values(), default=0) / SLOTS)


# Policies an operator might set for (c), each adding to the one before; the first is (c)'s.
TUNING: Final = (
    "headroom 4 slots, warm 2, bookings: no schedules",
    "+ warm sets from 08:00 local sized for the 09:00 classes (Monday apart)",
    "RUNNING workers from 08:30 local for the 09:00 classes instead, and warm 4 from 09:00 for 8 h",
)
# The policy (c) runs: bookings and a small headroom alone book every session in time, at the least cost.
FINAL: Final = 0


def policy(sessions: list[Session], pool: str, step: int = FINAL) -> CapacityPolicy:
    """Pool `pool`'s capacity policy at tuning step `step` (TUNING), sized from the timetable."""
    zone = POOLS[pool]
    mornings = (("mon", [0]), ("tue-fri", range(1, 5)))
    schedules: list[CapacitySchedule] = []
    if step == 1:
        schedules = [
            CapacitySchedule(
                schedule=f"0 8 * * {days}",
                duration="2h",
                timezone=zone,
                warm_workers=morning_workers(sessions, pool, weekdays),
            )
            for days, weekdays in mornings
        ]
    if step == 2:
        schedules = [
            CapacitySchedule(
                schedule=f"30 8 * * {days}",
                duration="1h",
                timezone=zone,
                min_workers=morning_workers(sessions, pool, weekdays),
            )
            for days, weekdays in mornings
        ]
        schedules.append(
            CapacitySchedule(schedule="0 9 * * mon-fri", duration="8h", timezone=zone, warm_workers=4)
        )
    return CapacityPolicy(
        template=f"lab-{pool}",
        min_workers=0,
        max_workers=MAX_WORKERS,
        headroom_slots=4,
        warm_workers=2,
        schedules=schedules,
        bookings=True,
    )


@dataclass
class Machine:
    id: int
    pool: str
    state: State
    since: float
    used: int = 0  # slots held by sessions, and by bookings placed ahead of their timeslot
    to_warm: bool = False  # launched to refill the warm set: stopped once running
    empty_since: float = 0.0
    booked: list[float] = field(default_factory=list)  # timeslot starts of the bookings placed on it
    draining: bool = False  # scale-in drains it: no placement, stopped or terminated once empty
    then_stop: bool = False  # what follows its drain: back to the warm set, or terminated
    disrupted: bool = False  # scale-in's disruption under way (draining or stopping): a budget place
    launched: float = field(init=False)

    def __post_init__(self) -> None:
        self.launched = self.since


@dataclass
class Result:
    strategy: Strategy
    booked: int = 0
    on_time: int = 0
    failed: int = 0  # bookings FAILED no_capacity_by_timeslot: never placed by their timeslot's start
    scaled_in: int = 0  # workers scale-in took (stopped, terminated or drained)
    warm_trimmed: int = 0  # STOPPED workers scale-in terminated beyond the warm target
    walk_in_waits: list[float] = field(default_factory=list)
    running_seconds: float = 0.0
    stopped_seconds: float = 0.0
    volume_seconds: float = 0.0
    calls: dict[int, Counter[str]] = field(default_factory=dict)
    actions: Counter[str] = field(default_factory=Counter)
    hours: float = 0.0

    @property
    def on_time_share(self) -> float:
        return self.on_time / self.booked if self.booked else 1.0

    @property
    def dollars(self) -> float:
        ebs = VOLUME_GB * prices.EBS_GP3_GB_MONTH / prices.SECONDS_PER_MONTH * self.volume_seconds
        return self.running_seconds / 3600 * prices.EC2_HOUR[INSTANCE_TYPE] + ebs

    def per_hour(self, names: Iterable[str]) -> tuple[float, int]:
        """Calls of these names per simulated hour: the mean and the busiest hour's."""
        wanted = tuple(names)
        counts = [sum(c[n] for n in wanted) for c in self.calls.values()]
        return sum(counts) / self.hours, max(counts, default=0)


def serving(m: Machine) -> bool:
    """A RUNNING worker placement may use: not a refill on its way to stop, not draining."""
    return m.state is State.RUNNING and not m.to_warm and not m.draining


# The door's stage default for disruptions of pools without budgets of their own (MAX_CONCURRENT_DRAINS).
STAGE_BUDGET: Final = DisruptionBudget.parse(str(Settings.model_fields["max_concurrent_drains"].default))

# Within one instant: EC2 settles, sessions end, sessions begin, then the cycle runs.
SETTLE, END, ARRIVE, CYCLE = range(4)


class Simulation:
    """One strategy's week over one workload."""

    def __init__(
        self,
        strategy: Strategy,
        sessions: list[Session],
        horizon: timedelta,
        seed: int,
        step: int = FINAL,
    ) -> None:
        self.strategy = strategy
        self.horizon = horizon.total_seconds()
        self.rng = random.Random(f"{seed}/{strategy.name}")
        self.result = Result(strategy, hours=self.horizon / 3600)
        self.now = 0.0
        self.events: list[tuple[float, int, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.ids = itertools.count()
        self.machines: dict[str, list[Machine]] = {pool: [] for pool in POOLS}
        self.waiting: dict[str, list[Session]] = {pool: [] for pool in POOLS}
        self.reserved: dict[int, Machine] = {}
        # (c)'s bookings waiting for capacity whose timeslot is within the cycle's query bound, by start.
        self.unplaced: dict[str, list[Session]] = {pool: [] for pool in POOLS}
        self.samples: dict[str, dict[LeadKind, list[float]]] = {
            pool: {LeadKind.LAUNCH: [], LeadKind.START: []} for pool in POOLS
        }
        self.policies = {pool: policy(sessions, pool, step) for pool in POOLS}
        inside = [s for s in sessions if s.start < self.horizon]
        self.bookings = {
            pool: [s for s in inside if s.pool == pool and s.booked_at is not None] for pool in POOLS
        }
        self.next_due = dict.fromkeys(POOLS, 0)
        for s in inside:
            self.at(s.start, ARRIVE, partial(self.arrive, s))
        for k in range(int(self.horizon // CYCLE_SECONDS)):
            self.at(k * CYCLE_SECONDS, CYCLE, partial(self.cycle, k))
        if strategy is Strategy.ALWAYS_ON:
            for pool in POOLS:
                for _ in range(peak_workers(sessions, pool)):
                    self.machines[pool].append(Machine(next(self.ids), pool, State.RUNNING, 0.0))

    def at(self, when: float, order: int, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, order, next(self.seq), action))

    def run(self) -> Result:
        while self.events and self.events[0][0] < self.horizon:
            when, _, _, action = heapq.heappop(self.events)
            self.now = when
            action()
        self.now = self.horizon
        for machines in self.machines.values():
            for m in machines:
                self.move(m, m.state)
        return self.result

    # ---- EC2 model -----------------------------------------------------------------------------

    def move(self, m: Machine, state: State) -> None:
        """`m` to `state` now, charging the time it spent in the state it leaves."""
        spent = self.now - m.since
        if m.state is State.RUNNING:
            self.result.running_seconds += spent
        if m.state is State.STOPPED:
            self.result.stopped_seconds += spent
        if m.state is not State.TERMINATED:
            self.result.volume_seconds += spent
        m.state, m.since = state, self.now
        if state is State.RUNNING:
            m.empty_since = self.now

    def call(self, name: str, machines: list[Machine]) -> None:
        """One batched EC2 call for `machines` (none: a read)."""
        self.result.calls.setdefault(int(self.now // 3600), Counter())[name] += 1
        self.result.actions[name] += len(machines)

    def launch(self, pool: str, count: int, warm: int = 0) -> None:
        if count <= 0:
            return
        batch = [Machine(next(self.ids), pool, State.LAUNCHING, self.now) for _ in range(count)]
        for n, m in enumerate(batch):
            m.to_warm = n >= count - warm
            self.machines[pool].append(m)
            self.settle_after(m, LeadKind.LAUNCH, self.rng.uniform(*LAUNCH_SECONDS))
        self.call("RunInstances", batch)

    def start(self, batch: list[Machine]) -> None:
        if batch:
            for m in batch:
                self.move(m, State.STARTING)
                self.settle_after(m, LeadKind.START, self.rng.uniform(*START_SECONDS))
            self.call("StartInstances", batch)

    def settle_after(self, m: Machine, kind: LeadKind, seconds: float) -> None:
        def running() -> None:
            samples = self.samples[m.pool]
            samples[kind] = kept(samples[kind], seconds)
            self.move(m, State.RUNNING)
            if not m.to_warm:
                self.serve(m.pool)

        self.at(self.now + seconds, SETTLE, running)

    def stop(self, batch: list[Machine]) -> None:
        if batch:
            for m in batch:
                m.to_warm = False
                self.move(m, State.STOPPING)
                self.at(self.now + STOP_SECONDS, SETTLE, partial(self.stopped, m))
            self.call("StopInstances", batch)

    def stopped(self, m: Machine) -> None:
        self.move(m, State.STOPPED)
        m.disrupted = False

    def terminate(self, batch: list[Machine]) -> None:
        if batch:
            for m in batch:
                self.move(m, State.TERMINATED)
                self.machines[m.pool].remove(m)
            self.call("TerminateInstances", batch)

    # ---- sessions ----------------------------------------------------------------------------------

    def place(self, pool: str) -> Machine | None:
        """A slot on a RUNNING worker, the fullest with room first (PlacementStrategy.PACK)."""
        room = [m for m in self.machines[pool] if serving(m) and m.used < SLOTS]
        if not room:
            return None
        m = min(room, key=lambda m: (SLOTS - m.used, m.id))
        m.used += 1
        return m

    def hold(self, s: Session, m: Machine, placed: float) -> None:
        """Session `s` runs on `m` from `placed` to its end."""
        if s.booked_at is None:
            self.result.walk_in_waits.append(placed - s.start)
            end = placed + 60 * s.minutes
        else:
            end = s.end
        self.at(max(end, self.now), END, lambda: self.release(m))

    def release(self, m: Machine) -> None:
        m.used -= 1
        if m.used == 0:
            m.empty_since = self.now
            if m.draining:
                self.drained(m)
                return
        self.serve(m.pool)

    def drained(self, m: Machine) -> None:
        """A drain's end: the empty worker stops into the warm set or terminates, as its drain said."""
        m.draining = False
        if m.then_stop:
            self.stop([m])
        else:
            m.disrupted = False
            self.terminate([m])

    def arrive(self, s: Session) -> None:
        booked = s.booked_at is not None
        if booked:
            self.result.booked += 1
        if booked and self.strategy is Strategy.FLEETKEEPER:
            # The booking clock decided ahead: placed by a cycle, or FAILED at its timeslot's start.
            m = self.reserved.pop(s.id, None)
            if m is None:
                if s in self.unplaced[s.pool]:
                    self.unplaced[s.pool].remove(s)
                self.result.failed += 1
                return
            m.booked.remove(s.start)
            self.result.on_time += m.state is State.RUNNING and not m.draining
            self.hold(s, m, self.now)
            return
        m = self.place(s.pool)
        if m is not None:
            self.result.on_time += booked
            self.hold(s, m, self.now)
            return
        self.waiting[s.pool].append(s)

    def serve(self, pool: str) -> None:
        """Waiting sessions take the slots there are, first come first served."""
        queue = self.waiting[pool]
        while queue:
            m = self.place(pool)
            if m is None:
                return
            self.hold(queue.pop(0), m, self.now)

    # ---- the cycle -------------------------------------------------------------------------------

    def cycle(self, k: int) -> None:
        live = sum(len(ms) for ms in self.machines.values())
        for _ in range(math.ceil(live / DESCRIBE_PAGE)):
            self.call("DescribeInstances", [])
        if k % DISCOVERY_EVERY == 0:
            for _ in range(max(math.ceil(live / DESCRIBE_PAGE), 1)):
                self.call("DescribeInstances", [])
                self.call("DescribeInstanceStatus", [])
        for pool in POOLS:
            if self.strategy is Strategy.REACTIVE:
                self.react(pool)
            elif self.strategy is Strategy.FLEETKEEPER:
                self.keep(pool)

    def react(self, pool: str) -> None:
        machines = self.machines[pool]
        coming = SLOTS * sum(1 for m in machines if m.state is State.LAUNCHING)
        wanted = math.ceil(max(len(self.waiting[pool]) - coming, 0) / SLOTS)
        self.launch(pool, min(wanted, MAX_WORKERS - len(machines)))
        idle_since = self.now - 60 * IDLE_MINUTES
        self.terminate(
            [m for m in machines if m.state is State.RUNNING and m.used == 0 and m.empty_since <= idle_since]
        )

    def keep(self, pool: str) -> None:
        """(c)'s cycle for one pool, in main's order: the workers' own steps, scale-in, the bookings
        due placed, then scale-out."""
        at = WEEK_START + timedelta(seconds=self.now)
        lead = timedelta(seconds=lead_time_of(self.samples[pool]).launch_seconds)
        machines = self.machines[pool]
        # A refill that came up RUNNING is stopped by its own step (desired STOPPED).
        self.stop([m for m in machines if m.state is State.RUNNING and m.to_warm])
        # The bookings the cycle's query bound reaches; none is OVERDUE here (those fail at arrival).
        due, n = self.bookings[pool], self.next_due[pool]
        bound = (due_until(at, lead) - WEEK_START).total_seconds()
        while n < len(due) and due[n].start <= bound:
            if due[n].start > self.now:
                self.unplaced[pool].append(due[n])
            n += 1
        self.next_due[pool] = n
        waiting = [
            s
            for s in self.unplaced[pool]
            if phase(WEEK_START + timedelta(seconds=s.start), lead, at) != Phase.WAITING
        ]
        self.scale_in(pool, at, lead, due=len(waiting))
        left = 0
        for s in waiting:
            m = self.place(pool)
            if m is None:
                left += 1
                continue
            self.reserved[s.id] = m
            m.booked.append(s.start)
            self.unplaced[pool].remove(s)
        self.scale_out(pool, at, due=left)

    def assess(self, pool: str, at: datetime, due: int) -> tuple[list[Machine], Target, Counter[str]]:
        """services/capacity.assess_pool over the model: the serving workers, the target, and the rest
        by what they will become (launching to run, refilling, stopping, stopped)."""
        machines = self.machines[pool]
        running = [m for m in machines if serving(m)]
        target = capacity_target(
            self.policies[pool],
            at,
            running=len(running),
            free_slots=sum(SLOTS - m.used for m in running),
            slots_per_worker=SLOTS,
            bookings=due,
        )
        counted: Counter[str] = Counter()
        for m in machines:
            if m.to_warm:
                counted["refilling"] += 1
            elif m.state in (State.LAUNCHING, State.STARTING):
                counted["launching"] += 1
            elif m.state in (State.STOPPING, State.STOPPED):
                counted[m.state] += 1
        return running, target, counted

    def scale_in(self, pool: str, at: datetime, lead: timedelta, *, due: int) -> None:
        """services/reconcile/scale_down.py's plan: `scale_in` proposes, the stage default budget of the
        door admits, the warm set's room says stop or terminate, a worker with sessions drains first."""
        running, target, counted = self.assess(pool, at, due)
        by_id = {str(m.id): m for m in running}

        def kept(worker: WorkerSummary) -> Guard | None:
            starts = (WEEK_START + timedelta(seconds=t) for t in by_id[worker.id].booked)
            return Guard.UPCOMING_TIMESLOT if booked_within(starts, at, lead) is not None else None

        summaries = [
            WorkerSummary.model_construct(
                id=str(m.id),
                template=f"lab-{pool}",
                region="us-east-1",
                pool=pool,
                status=WorkerStatus.RUNNING,
                capacity=SLOTS,
                active_instances=m.used,
            )
            for m in running
        ]
        taken = scale_in(target, summaries, cap=self.policies[pool].max_workers, kept=kept)
        # The warm set beyond its target terminates, oldest first, needing no budget's room.
        asleep = {str(m.id): m for m in self.machines[pool] if m.state is State.STOPPED}
        trimmed = warm_surplus(
            target,
            [
                Worker.model_construct(
                    id=key,
                    template=f"lab-{pool}",
                    region="us-east-1",
                    capacity=SLOTS,
                    status=WorkerStatus.STOPPED,
                    launched_at=WEEK_START + timedelta(seconds=m.launched),
                )
                for key, m in asleep.items()
            ],
            running=len(running),
            launching=counted["launching"],
            stopping=counted[State.STOPPING],
            refilling=counted["refilling"],
            template=f"lab-{pool}",
            now=at,
            limit=MAX_WARM_TRIM_PER_CYCLE,
        )
        self.result.warm_trimmed += len(trimmed)
        self.terminate([asleep[w.id] for w in trimmed])
        if not taken:
            return
        room = warm_short(
            target,
            stopped=counted[State.STOPPED],
            stopping=counted[State.STOPPING],
            refilling=counted["refilling"],
        )
        every = [m for ms in self.machines.values() for m in ms]
        allowed = STAGE_BUDGET.allowed(sum(1 for m in every if m.state is State.RUNNING and not m.to_warm))
        in_use = sum(1 for m in every if m.disrupted)
        to_stop: list[Machine] = []
        to_end: list[Machine] = []
        for n, worker in enumerate(taken):
            if in_use >= allowed:
                break
            m = by_id[worker.id]
            m.disrupted, m.then_stop = True, n < room
            in_use += 1
            self.result.scaled_in += 1
            if m.used:
                m.draining = True
            elif m.then_stop:
                to_stop.append(m)
            else:
                m.disrupted = False
                to_end.append(m)
        self.stop(to_stop)
        self.terminate(to_end)

    def scale_out(self, pool: str, at: datetime, *, due: int) -> None:
        """services/reconcile/capacity.py: `shortfall` starts warm workers first, then creates workers,
        at most MAX_NEW_PER_CYCLE, the last `warm` of them refills, none beyond max_workers."""
        running, target, counted = self.assess(pool, at, due)
        stopped = [m for m in self.machines[pool] if m.state is State.STOPPED]
        need = shortfall(
            target,
            running=len(running),
            launching=counted["launching"],
            refilling=counted["refilling"],
            stopping=counted[State.STOPPING],
            stopped=len(stopped),
        )
        self.start(stopped[: need.start])
        room = MAX_WORKERS - len(self.machines[pool])
        create = min(need.create, MAX_NEW_PER_CYCLE, room)
        self.launch(pool, create, warm=sum(1 for n in range(create) if n >= need.create - need.warm))


def simulate(bookings: int = BOOKINGS, horizon: timedelta = WEEK, seed: int = SEED) -> dict[Strategy, Result]:
    """Each strategy's figures over the same workload."""
    sessions = workload(bookings, seed)
    return {s: Simulation(s, sessions, horizon, seed).run() for s in Strategy}


def _wait(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _late(r: Result) -> str:
    """The booked sessions not on a RUNNING worker at their timeslot_start, and why."""
    late = r.booked - r.on_time
    if not late:
        return "0 late"
    return f"{late} late: {r.failed} failed unplaced, {late - r.failed} on a draining worker"


def _schedules(p: CapacityPolicy) -> str:
    return "; ".join(
        f"`{s.schedule}` {s.duration} "
        + ", ".join(
            f"{name} {getattr(s, name)}" for name in ("min_workers", "warm_workers") if getattr(s, name)
        )
        for s in p.schedules
    )


SEEDS: Final = range(1, 11)


def run() -> str:
    started = clock.perf_counter()
    sessions = workload()
    results = simulate()
    a, c = results[Strategy.ALWAYS_ON], results[Strategy.FLEETKEEPER]
    walk_ins = sum(1 for s in sessions if s.booked_at is None)
    lines = [
        "## Capacity for a simulated week (issue 32)",
        "",
        f"A discrete-event simulation with a simulated clock (bench/capacity_week_bench.py, whose docstring "
        f"states every assumption): {len(POOLS)} pools in {', '.join(POOLS.values())}, {BOOKINGS:,} "
        f"sessions booked 1-14 days ahead on a class timetable (Monday to Friday, peak at 09:00 local, "
        f"Mondays x{DAY_WEIGHTS[0]}, 1-3 h) and {walk_ins} walk-ins with no notice, in the week of Monday "
        f"{MONDAY.isoformat()}; {int(WEEK / timedelta(seconds=CYCLE_SECONDS)):,} one-minute cycles per "
        f"strategy, seed {SEED}. Workers are {INSTANCE_TYPE} with {SLOTS} slots (one session each), "
        f"${prices.EC2_HOUR[INSTANCE_TYPE]}/h running, and a {VOLUME_GB} GB gp3 volume at "
        f"${prices.EBS_GP3_GB_MONTH}/GB-month while they exist ({prices.PRICES_AS_OF}). EC2 is a model: "
        f"launch {LAUNCH_SECONDS[0] / 60:.0f}-{LAUNCH_SECONDS[1] / 60:.0f} min, start of a stopped worker "
        f"{START_SECONDS[0]:.0f}-{START_SECONDS[1]:.0f} s, stop {STOP_SECONDS:.0f} s, drawn from a seeded "
        "RNG.",
        "",
        "| strategy | booked sessions on a RUNNING worker at timeslot_start | walk-in wait p50 | p95 | "
        "worker-hours | warm (stopped) hours | dollars | of (a) | EC2 changes/h mean (busiest hour) | "
        "reads/h |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results.values():
        waits = r.walk_in_waits or [0.0]
        changes, busiest = r.per_hour(MUTATING)
        reads, _ = r.per_hour(("DescribeInstances", "DescribeInstanceStatus"))
        lines.append(
            f"| {r.strategy} | {r.on_time_share:.2%} ({r.on_time:,}/{r.booked:,}) | "
            f"{_wait(percentile(waits, 50))} | {_wait(percentile(waits, 95))} | "
            f"{r.running_seconds / 3600:,.0f} | "
            f"{r.stopped_seconds / 3600:,.0f} | ${r.dollars:,.2f} | {r.dollars / a.dollars:.1%} | "
            f"{changes:.1f} ({busiest}) | {reads:.0f} |"
        )
    lines += [
        "",
        f"Goals for (c): every booked session on a RUNNING worker at its timeslot_start: "
        f"{_met(c.on_time == c.booked)} ({c.on_time_share:.2%}: {_late(c)}); dollars at most "
        f"{COST_GOAL:.0%} of (a)'s: {_met(c.dollars <= COST_GOAL * a.dollars)} "
        f"({c.dollars / a.dollars:.1%}).",
        "",
        "AWS calls over the week (instance actions in brackets: the calls if each worker had its own). "
        "The EC2 changes are batched per pool and cycle, as main makes its launches and starts (one "
        "RunInstances per batch, one StartInstances per region and type; stops and terminations are still "
        "one per worker); the reads "
        f"are the reconcile cycle's DescribeInstances of the live machines every minute ({DESCRIBE_PAGE} "
        "a page, none while a fleet has no machine) and discovery's DescribeInstances and "
        f"DescribeInstanceStatus every {DISCOVERY_EVERY} minutes, the same for every strategy.",
        "",
        "| strategy | " + " | ".join(MUTATING) + " | DescribeInstances | DescribeInstanceStatus |",
        "|---|" + "---|" * (len(MUTATING) + 2),
    ]
    for r in results.values():
        total: Counter[str] = sum(r.calls.values(), Counter())
        cells = [f"{total[n]:,} ({r.actions[n]:,})" for n in MUTATING]
        cells += [f"{total[n]:,}" for n in ("DescribeInstances", "DescribeInstanceStatus")]
        lines.append(f"| {r.strategy} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "(a) runs each pool's peak of concurrent booked sessions, plus its walk-in share, in whole workers: "
        + ", ".join(f"{pool} {peak_workers(sessions, pool)}" for pool in POOLS)
        + f". (b) launches for the sessions waiting beyond the slots already launching, and terminates a "
        f"worker idle for {IDLE_MINUTES} minutes.",
        "",
        "(c)'s policy per pool: min_workers 0, max_workers "
        f"{MAX_WORKERS}, headroom_slots 4, warm_workers 2, bookings true, no schedules. Steps 2 and 3 "
        "below add schedules in the pool's time zone whose sizes the operator read off the timetable "
        "(the largest 09:00 start in workers); step 3's:",
        "",
    ]
    lines += [f"- {pool}: {_schedules(policy(sessions, pool, len(TUNING) - 1))}" for pool in POOLS]
    lines += [
        "",
        "(c) decides with main's rules where main has a pure function for them: `capacity_target` and "
        "its schedules' cron windows, `shortfall` (a worker launching to refill the warm set counts for "
        f"the warm set only), at most {MAX_NEW_PER_CYCLE} new workers per pool and cycle, the lead time "
        "of `lead_time_of`, the booking clock of domain/bookings.py (due from two lead times ahead, placed "
        "by the cycle, FAILED if unplaced at its timeslot), and scale-in's `scale_in`, `booked_within` "
        "and `warm_short` under the stage default budget, and `warm_surplus`. Modelled: EC2's delays, "
        "the clock, the workload, placement, drains, and the counts the services read. Every booking is "
        "assumed to wait for capacity from when it is made; main would place one at once on a RUNNING "
        "worker with room, holding its slot for the days until its timeslot (not modelled).",
        "",
        "(c) with each policy an operator might set, each a week on the same workload (step 1 is (c)'s):",
        "",
        "| step | policy | booked on time | warm (stopped) hours | warm workers trimmed | dollars of (a) |",
        "|---|---|---|---|---|---|",
    ]
    for step, text in enumerate(TUNING):
        r = c if step == FINAL else Simulation(Strategy.FLEETKEEPER, sessions, WEEK, SEED, step).run()
        lines.append(
            f"| {step + 1} | {text} | {r.on_time_share:.2%} ({_late(r)}) | "
            f"{r.stopped_seconds / 3600:,.0f} | {r.warm_trimmed:,} | {r.dollars / a.dollars:.1%} |"
        )
    late: list[str] = []
    shares: list[float] = []
    for seed in SEEDS:
        other = workload(seed=seed)
        fk = Simulation(Strategy.FLEETKEEPER, other, WEEK, seed).run()
        on = Simulation(Strategy.ALWAYS_ON, other, WEEK, seed).run()
        late.append(f"{fk.booked - fk.on_time}" + (f" ({fk.failed} failed)" if fk.failed else ""))
        shares.append(fk.dollars / on.dollars)
    lines += [
        "",
        "Each step books every session in time: scale-in keeps a worker holding a booking due (from two "
        "lead times ahead) and the free slots the bookings due need, so what the bookings brought up stays "
        "for them. The steps differ in cost and in how much of the 09:00 burst waits warm (STOPPED) rather "
        "than launching when due. Once a window that raised the warm set ends, scale-in terminates the "
        "STOPPED workers beyond the warm target (trimmed), so its volumes stop costing.",
        "",
        f"The final policy over {len(SEEDS)} other seeds (workload and EC2 draws), main's rules: late "
        f"bookings per seed {', '.join(late)}; dollars "
        f"{min(shares):.1%} to {max(shares):.1%} of (a)'s.",
        "",
        f"Wall time of this section: {clock.perf_counter() - started:.1f} s.",
    ]
    return "\n".join(lines) + "\n"
