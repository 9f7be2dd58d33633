"""`--workload`: a simulated user base, so drains finish on their own while a person watches.

It places instances (on any template and pool that has room) at a steady rate and ends each one
COMPLETED after a random duration, through the same services the API calls. Instances it did not
place (the demo fleet's, or ones placed through the API) are adopted and ended the same way, so every
drain finishes on its own. Capacity refusals are
normal and only counted: the fleet is small and a draining pool or worker takes no new work.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fleetkeeper.domain.errors import FleetkeeperError
from fleetkeeper.domain.lifecycle import ACTIVE_INSTANCE_STATES, InstanceState
from fleetkeeper.services import instances, placement
from fleetkeeper.services.context import Context
from fleetkeeper_local.loop import Loop

WORKLOAD_ACTOR = "workload-simulator"
ADOPT_EVERY_SECONDS = 5.0


@dataclass(frozen=True)
class WorkloadSettings:
    placements_per_minute: float = 12.0
    min_seconds: float = 10.0
    max_seconds: float = 60.0
    seed: int | None = None

    def describe(self) -> str:
        return (
            f"workload        about {self.placements_per_minute:g} instances a minute, each running "
            f"{self.min_seconds:g}-{self.max_seconds:g} s"
        )


@dataclass
class WorkloadCounts:
    placed: int = 0
    completed: int = 0
    refused: int = 0
    ended_elsewhere: int = 0  # forced by a drain, or ended by someone else first


@dataclass
class WorkloadSimulator:
    ctx_factory: Callable[[], Context]
    settings: WorkloadSettings = field(default_factory=WorkloadSettings)
    clock: Callable[[], float] = time.monotonic
    counts: WorkloadCounts = field(default_factory=WorkloadCounts)
    _due: dict[str, float] = field(default_factory=dict)
    _next_placement: float = 0.0
    _next_adoption: float = 0.0

    def __post_init__(self) -> None:
        self._random = random.Random(self.settings.seed)  # noqa: S311 - a simulation, not a secret
        self._loop = Loop("workload", 0.5, self.step, self._step_failed)

    def step(self) -> None:
        """Place what is due, then end what is due."""
        ctx = self.ctx_factory()
        now = self.clock()
        if now >= self._next_placement:
            self._place(ctx, now)
            self._next_placement = now + self._random.expovariate(self.settings.placements_per_minute / 60)
        if now >= self._next_adoption:
            self._adopt(ctx, now)
            self._next_adoption = now + ADOPT_EVERY_SECONDS
        for instance_id, due in sorted(self._due.items()):
            if due <= now:
                self._end(ctx, instance_id)

    def _duration(self) -> float:
        return self._random.uniform(self.settings.min_seconds, self.settings.max_seconds)

    def _adopt(self, ctx: Context, now: float) -> None:
        for state in sorted(ACTIVE_INSTANCE_STATES):
            for instance in ctx.store.list_instances(state=state, limit=1000).items:
                self._due.setdefault(instance.id, now + self._duration())

    def _place(self, ctx: Context, now: float) -> None:
        templates = [t.name for t in ctx.store.list_templates()]
        if not templates:
            return
        try:
            instance = placement.place_instance(
                ctx.store, actor=WORKLOAD_ACTOR, template=self._random.choice(templates)
            )
        except FleetkeeperError:
            self.counts.refused += 1
            return
        self.counts.placed += 1
        self._due[instance.id] = now + self._duration()

    def _end(self, ctx: Context, instance_id: str) -> None:
        self._due.pop(instance_id, None)
        try:
            instances.change_instance_state(
                ctx, instance_id, InstanceState.COMPLETED, actor=WORKLOAD_ACTOR, reason="work finished"
            )
        except FleetkeeperError:
            self.counts.ended_elsewhere += 1
            return
        self.counts.completed += 1

    @staticmethod
    def _step_failed(exc: Exception) -> None:
        # The simulation must not stop the control plane.
        print(f"workload: {exc}", flush=True)

    def start(self) -> WorkloadSimulator:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop(10)

    def summary(self) -> str:
        c = self.counts
        return (
            f"workload: {c.placed} placed, {c.completed} completed, {c.ended_elsewhere} ended by a drain "
            f"or someone else, {c.refused} refused (no room)"
        )
