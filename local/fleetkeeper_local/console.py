"""One readable console line per change of the local fleet: worker transitions, drain outcomes, forced
instances, pool drains. It reads the table (as the API does) once a second and prints the differences,
so it shows changes made by any path: the API, the drain workflow, the reconciler, EC2 events.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Pool, Worker
from fleetkeeper.store.repository import FleetStore

# The reason a drain's force step writes on the instances it terminates.
FORCED_REASON = "drain_timeout"
DEFAULT_INTERVAL_SECONDS = 1.0
# Audit events read back to find the steps between two looks; a second between looks holds a handful.
TRAIL_LOOKBACK = 20


@dataclass(frozen=True)
class _WorkerSeen:
    status: str
    drain_generation: int | None
    drain_outcome: str | None
    forced: int
    moved: int = 0


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
    ) -> None:
        self._store = store
        self._print = printer
        self._clock = clock
        self._interval = interval_seconds
        self._workers: dict[str, _WorkerSeen] | None = None
        self._pools: dict[str, _PoolSeen] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        if self._workers is not None:
            for worker_id, seen in sorted(current.items()):
                self._worker_changes(workers[worker_id], self._workers.get(worker_id), seen)
            for name, seen_pool in sorted(current_pools.items()):
                self._pool_changes(pools[name], self._pools.get(name), seen_pool)
        self._workers, self._pools = current, current_pools

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
        moved = now.moved - (0 if new_drain else before.moved)
        if moved > 0:
            self._say(f"drain of {worker.id} moved {moved} scheduled instance(s) to other workers")
        forced_before = 0 if new_drain else before.forced
        if forced_before < now.forced:
            forced = [
                i.id
                for i in self._store.list_instances(worker_id=worker.id, limit=1000).items
                if i.reason == FORCED_REASON
            ]
            self._say(
                f"drain of {worker.id} reached its deadline: {now.forced - forced_before} instance(s) forced "
                f"({', '.join(forced) or '-'})"
            )
        for source, target, reason in steps[leaving:]:
            self._say(f"worker {worker.id} ({where}) {source} -> {target}{f': {reason}' if reason else ''}")
        if (
            drain is not None
            and now.drain_outcome != "RUNNING"
            and (new_drain or before.drain_outcome == "RUNNING")
        ):
            by = f" by {drain.cancelled_by}" if drain.cancelled_by else ""
            self._say(f"drain of {worker.id} ended {now.drain_outcome}{by}; {now.forced} instance(s) forced")

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

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.poll_once()
            except Exception as exc:  # a console glitch must not stop the control plane
                self._say(f"(console could not read the fleet: {exc})")
            self._stop.wait(self._interval)

    def start(self) -> FleetConsole:
        self._thread = threading.Thread(target=self._run, name="fleet-console", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None
