"""One readable console line per change of the local fleet: worker transitions, drain outcomes, forced
instances, pool drains, rollouts' waves and status changes. It reads the table (as the API does) once a
second and prints the differences, so it shows changes made by any path: the API, the drain workflow,
the reconciler, EC2 events.
"""

from __future__ import annotations

import io
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TextIO

from fleetkeeper.domain.lifecycle import ForceReason, WorkerStatus
from fleetkeeper.domain.models import AuditEvent, Pool, Worker
from fleetkeeper.domain.rollouts import Rollout
from fleetkeeper.store.repository import FleetStore
from fleetkeeper.store.rollouts import RolloutStore
from fleetkeeper_local.loop import Loop

DEFAULT_INTERVAL_SECONDS = 1.0
# Audit events read back to find the steps between two looks; a second between looks holds a handful.
TRAIL_LOOKBACK = 20
# The newest rollouts looked at each second: older ones have long finished on a local fleet.
ROLLOUT_LOOKBACK = 20


# What a drain's force step writes on the instances it ends (deadline passed, or forced now).
FORCE_REASONS = frozenset(ForceReason)
DEADLINE_MOVED = "WorkerDrainDeadlineMoved"


def _clock(moment: object) -> str:
    """`08:42:03` for an ISO timestamp of the audit trail's details (as the drain's deadline prints)."""
    try:
        return f"{datetime.fromisoformat(str(moment)):%H:%M:%S}"
    except ValueError:
        return str(moment)


@dataclass(frozen=True)
class _WorkerSeen:
    status: str
    drain_generation: int | None
    drain_outcome: str | None
    forced: int
    moved: int = 0
    deadline_moves: int = 0


@dataclass(frozen=True)
class _RolloutSeen:
    version: int
    # The last wave (forward, and of the rollback) announced as started; -1: none yet.
    wave: int
    rollback_wave: int
    # How many of its audit items (its status changes) were told.
    told: int


def _started_wave(rollout: Rollout) -> int:
    """The last forward wave that has begun: a wave begins when its workers get their progress."""
    if rollout.wave < rollout.wave_count and rollout.progress and rollout.rollback_through_wave is None:
        return rollout.wave
    return min(rollout.wave, rollout.wave_count) - 1


def _started_rollback_wave(rollout: Rollout) -> int:
    if rollout.rollback_through_wave is None:
        return -1
    if rollout.rollback_progress:
        return rollout.rollback_wave
    return rollout.rollback_wave - 1


@dataclass(frozen=True)
class _PoolSeen:
    status: str
    drain_generation: int
    drain_outcome: str | None


def _workers(store: FleetStore) -> Iterator[Worker]:
    token: str | None = None
    while True:
        page = store.list_workers(limit=1000, next_token=token)
        yield from page.items
        token = page.next_token
        if not token:
            return


def _seen(worker: Worker) -> _WorkerSeen:
    drain = worker.drain
    return _WorkerSeen(
        status=str(worker.status),
        drain_generation=drain.generation if drain else None,
        drain_outcome=str(drain.outcome) if drain else None,
        forced=drain.forced_instances if drain else 0,
        moved=drain.moved_instances if drain else 0,
        deadline_moves=drain.deadline_moves if drain else 0,
    )


class FleetConsole:
    """Prints what changed since the last look; the first look only takes a baseline."""

    def __init__(
        self,
        store: FleetStore,
        *,
        printer: Callable[[str], None] = print,
        interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        rollouts: RolloutStore | None = None,
    ) -> None:
        self._store = store
        self._rollouts = rollouts
        self._print = printer
        self._clock = clock
        self._workers: dict[str, _WorkerSeen] | None = None
        self._pools: dict[str, _PoolSeen] = {}
        self._rollouts_seen: dict[str, _RolloutSeen] = {}
        self._loop = Loop("fleet-console", interval_seconds, self.poll_once, self._could_not_read)

    def _say(self, text: str) -> None:
        self._print(f"{self._clock():%H:%M:%S}  {text}")

    def poll_once(self) -> None:
        workers = {w.id: w for w in _workers(self._store)}
        pools = {p.name: p for p in self._store.list_pools()}
        current = {worker_id: _seen(w) for worker_id, w in workers.items()}
        current_pools = {
            name: _PoolSeen(
                str(p.status), p.drain_generation, str(p.drain_outcome) if p.drain_outcome else None
            )
            for name, p in pools.items()
        }
        previous = self._workers
        baseline = previous is None
        if previous is not None:
            for worker_id, seen in sorted(current.items()):
                self._worker_changes(workers[worker_id], previous.get(worker_id), seen)
            for name, seen_pool in sorted(current_pools.items()):
                self._pool_changes(pools[name], self._pools.get(name), seen_pool)
        self._workers, self._pools = current, current_pools
        if self._rollouts is not None:
            self._rollout_changes(self._rollouts, baseline=baseline)

    def _rollout_changes(self, store: RolloutStore, *, baseline: bool) -> None:
        """Each rollout's status changes (its audit trail) and each wave as it begins, oldest first."""
        page = store.page(limit=ROLLOUT_LOOKBACK)
        for rollout in sorted(page.items, key=lambda r: (r.created_at, r.id)):
            before = self._rollouts_seen.get(rollout.id)
            if before is not None and before.version == rollout.version:
                continue
            trail = self._rollout_trail(rollout)
            wave, rollback_wave = _started_wave(rollout), _started_rollback_wave(rollout)
            told = before.told if before else 0
            wave_told = before.wave if before else -1
            rollback_told = before.rollback_wave if before else -1
            if baseline:
                told, wave_told, rollback_told = len(trail), wave, rollback_wave
            for event in trail[told:]:
                if event.action == "RolloutRollbackStarted":
                    # The forward waves that began before the rollback are told first.
                    wave_told = self._waves(rollout, wave_told, wave)
                self._say(self._rollout_line(rollout, event))
            wave_told = self._waves(rollout, wave_told, wave)
            waves = rollout.rollback_wave_count
            for index in range(rollback_told + 1, rollback_wave + 1):
                self._say(f"rollout {rollout.id} rollback wave {index + 1}/{waves} started")
            self._rollouts_seen[rollout.id] = _RolloutSeen(
                version=rollout.version,
                wave=wave_told,
                rollback_wave=max(rollback_told, rollback_wave),
                told=max(told, len(trail)),
            )

    def _waves(self, rollout: Rollout, told: int, started: int) -> int:
        for index in range(told + 1, started + 1):
            self._say(
                f"rollout {rollout.id} wave {index + 1}/{rollout.wave_count} started: "
                f"{rollout.wave_size(index)} worker(s)"
            )
        return max(told, started)

    def _rollout_trail(self, rollout: Rollout) -> list[AuditEvent]:
        """The rollout's audit items, oldest first (its status changes are few: one page holds them)."""
        items = self._store.audit_page("rollout", rollout.id, limit=TRAIL_LOOKBACK).items
        return list(reversed(items))

    @staticmethod
    def _rollout_line(rollout: Rollout, event: AuditEvent) -> str:
        why = f": {event.reason}" if event.reason else ""
        name = event.action.removeprefix("Rollout")
        if event.action == "RolloutStarted":
            scope = f"template {rollout.template}" if rollout.template else "the workers named"
            because = f" ({event.reason})" if event.reason else ""
            return (
                f"rollout {rollout.id} started by {event.actor}: {rollout.total} worker(s) of {scope} in "
                f"{rollout.wave_count} wave(s){because}"
            )
        # RolloutRollbackStarted -> "rollback started"; the engine's own steps need no "by".
        words = re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()
        by = "" if event.actor == f"rollout:{rollout.id}" else f" by {event.actor}"
        progress = f" ({event.details.get('replaced', '?')}/{rollout.total} replaced)"
        return f"rollout {rollout.id} {words}{by}{why}{progress}"

    def _worker_changes(self, worker: Worker, before: _WorkerSeen | None, now: _WorkerSeen) -> None:
        """The lines of what happened to one worker since the last look, in the order it happened: the
        drain's start, the transitions into DRAINING, moved and forced instances, the transitions out of
        it, the drain's end. A drain that starts and ends between two looks still shows each step."""
        where = "/".join(part for part in (worker.template, worker.pool) if part)
        if before is None:
            self._say(f"worker {worker.id} ({where}) created: {now.status}")
            return
        drain = worker.drain
        new_drain = drain is not None and before.drain_generation != now.drain_generation
        if drain is not None and new_drain:
            why = f" ({drain.reason})" if drain.reason else ""
            self._say(
                f"drain of {worker.id} started by {drain.requested_by}{why}, "
                f"deadline {drain.deadline:%H:%M:%S}"
            )
        steps = self._transitions(worker, before.status) if before.status != now.status else []
        leaving = next(
            (i for i, (source, _, _) in enumerate(steps) if source == WorkerStatus.DRAINING), len(steps)
        )
        for source, target, reason in steps[:leaving]:
            self._say(f"worker {worker.id} ({where}) {source} -> {target}{f': {reason}' if reason else ''}")
        moves = now.deadline_moves - (0 if new_drain else before.deadline_moves)
        if drain is not None and moves > 0:
            self._deadline_moves(worker, drain.generation, moves)
        moved = now.moved - (0 if new_drain else before.moved)
        if moved > 0:
            self._say(f"drain of {worker.id} moved {moved} scheduled instance(s) to other workers")
        forced_before = 0 if new_drain else before.forced
        if drain is not None and forced_before < now.forced:
            forced = [
                i.id
                for i in self._store.list_instances(worker_id=worker.id, limit=1000).items
                if i.reason in FORCE_REASONS and i.updated_at >= drain.started_at
            ]
            count = f"{now.forced - forced_before} instance(s) forced ({', '.join(forced) or '-'})"
            if drain.forced_at is not None:
                why = f" ({drain.force_reason})" if drain.force_reason else ""
                self._say(f"drain of {worker.id} forced by {drain.forced_by}{why}: {count}")
            else:
                self._say(f"drain of {worker.id} reached its deadline: {count}")
        for source, target, reason in steps[leaving:]:
            self._say(f"worker {worker.id} ({where}) {source} -> {target}{f': {reason}' if reason else ''}")
        if (
            drain is not None
            and now.drain_outcome != "RUNNING"
            and (new_drain or before.drain_outcome == "RUNNING")
        ):
            by = f" by {drain.cancelled_by}" if drain.cancelled_by else ""
            self._say(f"drain of {worker.id} ended {now.drain_outcome}{by}; {now.forced} instance(s) forced")

    def _deadline_moves(self, worker: Worker, generation: int, count: int) -> None:
        """The last `count` moves of the drain's deadline, oldest first, from the worker's audit trail."""
        trail = self._store.audit_page("worker", worker.id, limit=TRAIL_LOOKBACK).items
        moves = [e for e in trail if e.action == DEADLINE_MOVED and e.details.get("generation") == generation]
        for event in reversed(moves[:count]):
            why = f" ({event.reason})" if event.reason else ""
            self._say(
                f"drain of {worker.id} deadline moved {_clock(event.details.get('from'))} -> "
                f"{_clock(event.details.get('to'))} by {event.actor}{why}"
            )

    def _transitions(self, worker: Worker, seen: str) -> list[tuple[str, str, str | None]]:
        """The status changes from `seen` to the worker's status, oldest first, read from its audit trail
        (every transition writes one event with it); one line from its own record if the trail is short."""
        chain: list[tuple[str, str, str | None]] = []
        for event in self._store.audit_page("worker", worker.id, limit=TRAIL_LOOKBACK).items:
            if not event.from_status or not event.to_status or event.from_status == event.to_status:
                continue
            expected = chain[0][0] if chain else str(worker.status)
            if event.to_status != expected:
                continue  # not a step of the path to the current status
            chain.insert(0, (event.from_status, event.to_status, event.reason))
            if event.from_status == seen:
                return chain
        return [(seen, str(worker.status), worker.status_reason)]

    def _pool_changes(self, pool: Pool, before: _PoolSeen | None, now: _PoolSeen) -> None:
        if before is None:
            self._say(f"pool {pool.name} created: {now.status}")
            return
        if before.status != now.status:
            self._say(f"pool {pool.name} {before.status} -> {now.status}")
        if (
            now.drain_outcome
            and now.drain_outcome != "RUNNING"
            and (before.drain_outcome == "RUNNING" or before.drain_generation != now.drain_generation)
        ):
            self._say(f"drain of pool {pool.name} ended {now.drain_outcome}")

    def _could_not_read(self, exc: Exception) -> None:
        # A console glitch must not stop the control plane.
        self._say(f"(console could not read the fleet: {exc})")

    def start(self) -> FleetConsole:
        self._loop.start()
        return self

    def stop(self) -> None:
        self._loop.stop(10)


# The start of a line Powertools' metrics print (Embedded Metric Format): one JSON object per line.
EMF_LINE = '{"_aws":'


def hide_metrics_when_disabled() -> None:
    """This process's console without EMF lines when POWERTOOLS_METRICS_DISABLED says metrics are off
    (`make run` without --verbose, and its API instance processes)."""
    if os.environ.get("POWERTOOLS_METRICS_DISABLED", "").lower() == "true" and not isinstance(
        sys.stdout, WithoutMetrics
    ):
        sys.stdout = WithoutMetrics(sys.stdout)


class WithoutMetrics(io.TextIOBase):
    """The console without the EMF lines the functions print: `single_metric` prints them even when
    POWERTOOLS_METRICS_DISABLED is set. A line is held only while it may still be one (it starts with
    `{`), so a progress line without its end shows at once. Threads print at once: one lock."""

    def __init__(self, target: TextIO) -> None:
        self._target = target
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        with self._lock:
            self._pending += text
            *lines, self._pending = self._pending.split("\n")
            shown = "".join(f"{line}\n" for line in lines if not line.startswith(EMF_LINE))
            if self._pending and not EMF_LINE.startswith(self._pending[: len(EMF_LINE)]):
                shown, self._pending = shown + self._pending, ""
            if shown:
                self._target.write(shown)
                self._target.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            self._target.flush()

    def isatty(self) -> bool:
        return self._target.isatty()
