"""Workers: conditional on the version and status that were read; each write carries its audit item.

A worker item also holds store bookkeeping that is not part of the record (the ids of its active
instances, see store/slots.py). Writes of the record therefore SET the record's attributes and REMOVE the
ones that became empty, rather than replace the whole item.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fleetkeeper.domain.admission import Claim, counted, settled
from fleetkeeper.domain.capacity import member_moves
from fleetkeeper.domain.disruption import MEMBERS
from fleetkeeper.domain.drift import current_drift
from fleetkeeper.domain.errors import Conflict, InvalidInput, PoolFull, PoolNotActive, StaleWrite
from fleetkeeper.domain.fleet_counts import FleetCounts
from fleetkeeper.domain.lead_time import settled_lead
from fleetkeeper.domain.lifecycle import Cause, PoolStatus, WorkerStatus, check_transition
from fleetkeeper.domain.models import AuditEvent, Pool, Worker, WorkerSummary, utcnow
from fleetkeeper.domain.reconcile import newest_per_worker
from fleetkeeper.domain.repair import HealthStatus, stopped
from fleetkeeper.domain.sharding import BUCKETS, WHOLE_FLEET, Shard
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.store import keys
from fleetkeeper.store.capacity import member_updates
from fleetkeeper.store.codec import deserialize, load_record, record_attributes, serialize, serialize_value
from fleetkeeper.store.counters import COUNTED_AS, counter_updates, moves, read_counts
from fleetkeeper.store.disruption import BudgetTaken, PoolMoved, count_updates
from fleetkeeper.store.machine_keys import MachineKeyRepository
from fleetkeeper.store.migration import relayout_items
from fleetkeeper.store.schema import BY_EC2_INSTANCE, BY_KIND, BY_PARENT, BY_POOL, BY_SHARD, BY_STATUS
from fleetkeeper.store.table import (
    BATCH_GET_SIZE,
    Page,
    Refusal,
    current_status,
    refuse_missing,
    validated_copy,
)

# Index attributes a worker item carries only in some states or layouts, removed when they no longer
# apply (a worker without a pool has no by_pool entry; once the migration is done, no legacy ones).
_INDEX_ATTRIBUTES = ("GSI4PK", "GSI4SK", "GSI5PK", "GSI5SK", *keys.LEGACY_WORKER_ATTRIBUTES)
# BatchGetItem calls one read of many workers makes at once.
READ_PARALLELISM = 8
# Tries of a status write whose worker turned out to be counted elsewhere than its reader assumed.
_COUNTING_ATTEMPTS = 3


class _CountedElsewhere(Exception):
    """The worker is as it was read, but counted in another cell (or not yet): write again from there."""

    def __init__(self, counted_as: str | None) -> None:
        super().__init__(counted_as)
        self.counted_as = counted_as


@dataclass(frozen=True)
class FleetRead:
    """What a reconcile cycle reads: its own workers in full, and the fleet's counts.

    `statuses` is every worker's status when the read had to see the whole fleet (the table is still
    being migrated, store/layout.py); None when the counts come from the exact counters, and a
    decision that must know a worker's status reads it (`WorkerRepository.worker_statuses`)."""

    workers: list[Worker]
    counts: FleetCounts
    statuses: Mapping[str, WorkerStatus] | None
    read_at: datetime


class WorkerRepository(MachineKeyRepository):
    def _worker_item(self, worker: Worker) -> dict[str, Any]:
        return {
            **keys.worker_key(worker.id),
            **keys.worker_index_attributes(worker, legacy=self.layout().legacy_writes),
            **record_attributes(worker),
        }

    def find_worker(self, worker_id: str) -> Worker | None:
        return self._find(Worker, keys.worker_key(worker_id))

    def get_worker(self, worker_id: str) -> Worker:
        return self._fetch(Worker, keys.worker_key(worker_id), "worker", worker_id)

    def get_workers(self, worker_ids: Sequence[str], *, consistent: bool = True) -> list[Worker]:
        """Reads of many workers, in the order asked (strongly consistent unless asked otherwise);
        unknown ids are skipped."""
        if len(worker_ids) <= BATCH_GET_SIZE:
            items = self._batch_get_items([keys.worker_key(i) for i in worker_ids], consistent=consistent)
        else:
            chunks = [worker_ids[n : n + BATCH_GET_SIZE] for n in range(0, len(worker_ids), BATCH_GET_SIZE)]
            with ContextThreadPool(max_workers=READ_PARALLELISM) as pool:
                parts = pool.map(
                    lambda ids: self._batch_get_items(
                        [keys.worker_key(i) for i in ids], consistent=consistent
                    ),
                    chunks,
                )
                items = [item for part in parts for item in part]
        found = {w.id: w for w in (load_record(Worker, item) for item in items)}
        return [found[i] for i in dict.fromkeys(worker_ids) if i in found]

    def unhealthy_workers(self, worker_ids: Collection[str]) -> set[str]:
        """Which of these workers their health says are unhealthy, read from their items strongly
        consistent: a worker healthy again is not passed over on a stale read (a wrong NO_CAPACITY), and
        one sick since is refused by the placing transaction's condition."""
        items = self._batch_get_items(
            [keys.worker_key(i) for i in sorted(worker_ids)], projection=("id", "health")
        )
        healths = [(str(i["id"]["S"]), deserialize(i).get("health") or {}) for i in items]
        return {id_ for id_, health in healths if health.get("status") == HealthStatus.UNHEALTHY}

    def worker_statuses(self, worker_ids: Collection[str]) -> dict[str, WorkerStatus]:
        """The status of each of these workers now, strongly consistent; unknown ids are left out."""
        items = self._batch_get_items(
            [keys.worker_key(i) for i in sorted(worker_ids)], projection=("id", "status")
        )
        return {str(item["id"]["S"]): WorkerStatus(item["status"]["S"]) for item in items}

    def fleet_counts(self) -> FleetCounts:
        """Workers per scope and status: the counters once the table is migrated, else a read of every
        worker (store/layout.py)."""
        if self.layout().done:
            return read_counts(self._client, self.table_name)
        return FleetCounts.of(newest_per_worker(self._legacy_by_status(list(WorkerStatus))))

    def health_counts(self, pools: Collection[str]) -> FleetCounts:
        """Workers and unhealthy workers per scope and status, exact: the counters once the table is
        migrated (store/counters.py); until then these pools' workers, listed through the pool index and
        read strongly consistent."""
        if self.layout().done:
            return read_counts(self._client, self.table_name)
        listed = [w.id for pool in sorted(pools) for w in self.workers_in_pool(pool)]
        return FleetCounts.of(self.get_workers(listed))

    def count_health(self, pool: str) -> int | None:
        """Count every member of the pool in the cell its health says, once per pool: the workers moved
        (0: none, or the pool is marked counted), or None when one was written meanwhile (the next cycle
        walks again).

        A worker last written before cells said health sits in its status's plain cell, and a sick one
        the brake holds may never be written again. The walk lists the members through the pool index,
        reads them strongly consistent and moves each with the migration's write, conditional on the
        version and cell read (a concurrent write wins and counts the worker itself). A walk refused
        nothing marks the pool: every write since counts by health. Before the table is migrated the
        counts come from the items (`health_counts`), and the migration counts each worker by health."""
        marker = keys.health_counted_key(pool)
        if not self.layout().done or self._get(marker) is not None:
            return 0
        members = [keys.worker_key(w.id) for w in self.workers_in_pool(pool) if w.status in MEMBERS]
        legacy = self.layout().legacy_writes
        moved = refused = 0
        for raw in self._batch_get_items(members):
            items = relayout_items(self.table_name, raw, legacy=legacy)
            if items is None:
                continue
            if self._transact_unless_refused(items):
                moved += 1
            else:
                refused += 1
        if refused:
            return None
        mark = {**marker, "counted_at": utcnow().isoformat(), "moved": moved}
        self._transact_unless_refused([self._put(mark, "attribute_not_exists(PK)")])
        return moved

    def pool_active_instances(self, pool: str) -> int:
        """Active instances across the pool's workers, each worker read consistently.

        The index only says which workers belong to the pool; counts come from the items themselves,
        because a lagging index could hide the last instance ending and stall a pool drain.
        """
        worker_ids = [w.id for w in self.workers_in_pool(pool)]
        return sum(w.active_instances for w in self.get_workers(worker_ids))

    def workers_in_pool(self, pool: str) -> list[WorkerSummary]:
        """The pool's workers as the index shows them (an index lags: read a worker to decide on it)."""
        if not self.layout().done:
            items = self._query_all(
                IndexName=BY_PARENT,
                KeyConditionExpression="GSI2PK = :p AND begins_with(GSI2SK, :w)",
                ExpressionAttributeValues={":p": {"S": f"POOL#{pool}"}, ":w": {"S": "WORKER#"}},
            )
            return [_summary(item) for item in items]
        return [_summary(item) for item in self._query_each(_pool_queries(pool))]

    def placement_candidates(self, *, template: str | None, pool: str | None) -> list[WorkerSummary]:
        """RUNNING workers of the pool (and template, if given), or of the template anywhere, as the
        indexes show them: enough to rank them, never to decide (the placing transaction re-checks)."""
        running = WorkerStatus.RUNNING
        if not self.layout().done:
            if pool is not None:
                return [
                    w
                    for w in self.workers_in_pool(pool)
                    if w.status == running and (template is None or w.template == template)
                ]
            return [w for w in self._legacy_by_status([running]) if w.template == template]
        filters = _Filters()
        if pool is not None:
            # The pool's write shards, its template a prefix of their sort key.
            filters.add("status", str(running))
            queries = _pool_queries(pool, template)
        else:
            filters.add("template", template or "")
            queries = shard_queries([running], WHOLE_FLEET.buckets)
        return [_summary(entry) for entry in self._query_each([filters.applied(q) for q in queries])]

    def find_worker_by_ec2_instance(self, ec2_instance_id: str, region: str | None = None) -> Worker | None:
        """The worker that recorded this machine, by the machine's key item (store/machine_keys.py) and
        the worker item, both read consistently; None after one GetItem for a machine no worker recorded.

        With the machine's `region`, a miss in a region whose older machines have no key items yet is
        looked up in the by_ec2_instance index, as before those items existed.
        """
        worker_id = self.worker_id_of_machine(ec2_instance_id)
        worker = self.find_worker(worker_id) if worker_id is not None else None
        if worker is None and region is not None and not self.machine_keys_migrated(region):
            return self._find_worker_by_ec2_instance_index(ec2_instance_id)
        # The worker may have moved on to another machine since; the item stays.
        return worker if worker is not None and worker.ec2_instance_id == ec2_instance_id else None

    def _find_worker_by_ec2_instance_index(self, ec2_instance_id: str) -> Worker | None:
        items, _ = self._query(
            IndexName=BY_EC2_INSTANCE,
            KeyConditionExpression="ec2_instance_id = :i",
            ExpressionAttributeValues={":i": {"S": ec2_instance_id}},
        )
        for item in items:
            worker_id = str(item["PK"]["S"]).removeprefix("WORKER#")
            worker = self.find_worker(worker_id)
            # The index is eventually consistent: trust it only if the item still says so.
            if worker is not None and worker.ec2_instance_id == ec2_instance_id:
                return worker
        return None

    def create_worker(
        self,
        worker: Worker,
        *,
        actor: str,
        reason: str | None = None,
        active_pool: bool = False,
        max_members: int | None = None,
    ) -> Worker:
        """Store a new worker, counted in its cell and its pool's members; fails with Conflict if the id
        is taken (imports rely on that). With `active_pool`, only into a pool that is active when it
        commits (PoolNotActive); with `max_members`, only while the pool has fewer members (PoolFull)."""
        if counted(worker.owner):
            raise ValueError("a new worker is never being disrupted: its owner can only hold it")
        now = utcnow()
        stored = worker.model_copy(update={"version": 1, "created_at": now, "updated_at": now})
        audit = AuditEvent(
            entity="worker",
            entity_id=worker.id,
            action="WorkerCreated",
            actor=actor,
            to_status=str(worker.status),
            reason=reason,
        )

        def refuse(current: dict[str, Any] | None) -> Exception:
            status = current_status(Worker, current) if current else None
            return Conflict("worker", worker.id, status, f"worker '{worker.id}' already exists")

        cell = keys.counted_cell(stored)
        items = [
            self._put({**self._worker_item(stored), COUNTED_AS: cell}, "attribute_not_exists(PK)"),
            self._audit_put(audit),
            *counter_updates(self.table_name, stored.id, {cell: 1}),
            *self.machine_key_put(stored),
        ]
        refusals: dict[int, Refusal] = {0: refuse}
        joins = member_moves(None, (stored.pool, stored.status))
        if joins and worker.pool is not None:
            full_pool = worker.pool

            def full(_: dict[str, Any] | None) -> Exception:
                return PoolFull(full_pool, max_members or 0)

            refusals[len(items)] = full
            items.extend(member_updates(self.table_name, joins, below=max_members))
        if active_pool and worker.pool is not None:
            pool = worker.pool

            def closed(current: dict[str, Any] | None) -> Exception:
                status = current_status(Pool, current) if current else None
                return PoolNotActive(pool, status or "absent")

            refusals[len(items)] = closed
            items.append(
                self._condition_check(
                    keys.pool_key(pool), "#s = :active", {":active": str(PoolStatus.ACTIVE)}, {"#s": "status"}
                )
            )
        self._transact(items, refusals, written=stored)
        return stored

    def _worker_update(self, current: Worker, updated: Worker, counted_as: str | None) -> dict[str, Any]:
        """Rewrite the record's attributes under `version = read AND status = read`, and its counting
        under `counted_as = <the cell it is counted in>`, keeping the other bookkeeping."""
        item = {**self._worker_item(updated), COUNTED_AS: keys.counted_cell(updated)}
        key = keys.worker_key(current.id)
        names: dict[str, str] = {"#cv": "version", "#cs": "status", "#ca": COUNTED_AS}
        values: dict[str, Any] = {
            ":cv": serialize_value(current.version),
            ":cs": serialize_value(str(current.status)),
        }
        condition = "#cv = :cv AND #cs = :cs AND "
        if counted_as is None:
            condition += "attribute_not_exists(#ca)"
        else:
            condition += "#ca = :ca"
            values[":ca"] = serialize_value(counted_as)
        sets: list[str] = []
        for n, (attribute, value) in enumerate(
            serialize({k: v for k, v in item.items() if k not in key}).items()
        ):
            names[f"#f{n}"] = attribute
            values[f":f{n}"] = value
            sets.append(f"#f{n} = :f{n}")
        removes: list[str] = []
        for n, attribute in enumerate(
            sorted((set(Worker.model_fields) | set(_INDEX_ATTRIBUTES)) - set(item))
        ):
            names[f"#r{n}"] = attribute
            removes.append(f"#r{n}")
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        return {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(key),
                "UpdateExpression": expression,
                "ConditionExpression": condition,
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _save_worker(
        self, current: Worker, updated: Worker, audit: AuditEvent, claim: Claim | None = None
    ) -> Worker:
        """Write `updated` over `current`, moving its count along (store/counters.py), and with a machine
        it now records, that machine's key item (store/machine_keys.py), so an event finds the worker the
        moment the worker holds the id.

        The writer assumes the worker is counted where `current` says; an item counted elsewhere (not
        yet, in a table being migrated, or by a write of an earlier release) fails only that part of
        the condition, and the write is made again from the cell the item names. A worker that changed
        since it was read is a StaleWrite as ever.
        """

        def refuse(found: dict[str, Any]) -> Exception:
            plain = deserialize(found)
            if plain.get("version") == current.version and plain.get("status") == str(current.status):
                counted = plain.get(COUNTED_AS)
                return _CountedElsewhere(str(counted) if counted is not None else None)
            return StaleWrite("worker", current.id, current_status(Worker, found))

        stale = refuse_missing("worker", current.id, refuse)
        machine_key = (
            self.machine_key_put(updated) if updated.ec2_instance_id != current.ec2_instance_id else []
        )
        counted_as: str | None = keys.counted_cell(current)
        delta = int(counted(updated.owner)) - int(counted(current.owner))
        ownership = count_updates(self.table_name, current.pool, current.template, delta, claim)
        if delta:
            audit = audit.model_copy(
                update={"details": {**audit.details, **_ownership_details(current, updated, delta, claim)}}
            )
        members = member_updates(
            self.table_name, member_moves((current.pool, current.status), (updated.pool, updated.status))
        )
        for attempt in range(_COUNTING_ATTEMPTS):
            items = [
                self._worker_update(current, updated, counted_as),
                self._audit_put(audit),
                *counter_updates(self.table_name, current.id, moves(counted_as, keys.counted_cell(updated))),
                *members,
                *machine_key,
            ]
            refusals = {0: stale} | {
                len(items) + n: (
                    (lambda _: PoolMoved(current.pool or "-"))
                    if "ConditionCheck" in item
                    else (lambda _: BudgetTaken(current.pool))
                )
                for n, item in enumerate(ownership)
            }
            try:
                self._transact([*items, *ownership], refusals, written=updated)
            except _CountedElsewhere as elsewhere:
                if attempt + 1 == _COUNTING_ATTEMPTS:
                    raise StaleWrite(
                        "worker", current.id, str(current.status), "the worker's counting kept changing"
                    ) from None
                counted_as = elsewhere.counted_as
                continue
            return updated
        raise AssertionError("unreachable")

    def transition_worker(
        self,
        worker: Worker,
        target: WorkerStatus,
        *,
        cause: Cause,
        actor: str,
        reason: str | None = None,
        action: str | None = None,
        changes: Mapping[str, Any] | None = None,
        claim: Claim | None = None,
    ) -> Worker:
        """Move a worker read at `worker.version` to `target`, if the lifecycle table allows it; its owner
        follows the status (domain/admission.settled), and `claim` is what an admitting write must still
        find (store/disruption.py)."""
        check_transition(worker.status, target, cause)
        now = utcnow()
        wanted = (changes or {}).get("owner", worker.owner)
        owner = settled(worker, target, wanted, cause=cause, actor=actor, now=now)
        # A stopped machine starts on other hardware: its checks' signals no longer stand.
        health = stopped(worker.health, now) if target == WorkerStatus.STOPPED else worker.health
        updated = validated_copy(
            worker,
            {
                "health": health,
                **settled_lead(worker, target),
                **(changes or {}),
                "owner": owner,
                "status": target,
                "version": worker.version + 1,
                "updated_at": now,
            },
        )
        audit = AuditEvent(
            entity="worker",
            entity_id=worker.id,
            action=action or f"Worker{target.title()}",
            actor=actor,
            from_status=str(worker.status),
            to_status=str(target),
            reason=reason,
            details={"cause": str(cause)},
        )
        return self._save_worker(worker, updated, audit, claim)

    def update_worker(
        self,
        worker: Worker,
        changes: Mapping[str, Any],
        *,
        actor: str,
        action: str,
        reason: str | None = None,
        details: Mapping[str, str | int | None] | None = None,
        claim: Claim | None = None,
    ) -> Worker:
        """Change fields other than status on a worker read at `worker.version`; `details` go into its
        audit item, `claim` is what an admitting write must still find (store/disruption.py)."""
        if "status" in changes and changes["status"] != worker.status:
            raise InvalidInput("status", "use a transition to change a worker's status")
        updated = validated_copy(worker, {**changes, "version": worker.version + 1, "updated_at": utcnow()})
        audit = AuditEvent(
            entity="worker",
            entity_id=worker.id,
            action=action,
            actor=actor,
            from_status=str(worker.status),
            to_status=str(worker.status),
            reason=reason,
            details=dict(details or {}),
        )
        return self._save_worker(worker, updated, audit, claim)

    def list_workers(
        self,
        *,
        status: WorkerStatus | None = None,
        region: str | None = None,
        pool: str | None = None,
        template: str | None = None,
        drifted: bool | None = None,
        limit: int = 50,
        next_token: str | None = None,
    ) -> Page[Worker]:
        """One page of workers, served from the narrowest index for the filters given.

        `drifted` is decided on the items themselves (the indexes hold no drift): a page reads `limit`
        workers and keeps those that match, so it may hold fewer, even none, and still go on.
        """
        page = self._list_page(
            status=status, region=region, pool=pool, template=template, limit=limit, next_token=next_token
        )
        if drifted is None:
            return page
        return Page([w for w in page.items if (current_drift(w) is not None) == drifted], page.next_token)

    def _list_page(
        self,
        *,
        status: WorkerStatus | None,
        region: str | None,
        pool: str | None,
        template: str | None,
        limit: int,
        next_token: str | None,
    ) -> Page[Worker]:
        if not self.layout().done:
            return self._legacy_list(
                status=status, region=region, pool=pool, template=template, limit=limit, next_token=next_token
            )
        filters = _Filters()
        passes: Callable[[int], int] | None = None
        if pool is not None:
            # A pool's write shards, its template a prefix of the sort key.
            queries = _pool_queries(pool, template)
            if status is not None:
                filters.add("status", str(status))
        else:
            statuses = [status] if status is not None else list(WorkerStatus)
            queries = shard_queries(statuses, WHOLE_FLEET.buckets)
            if status is None:
                # Statuses the exact counts show empty are passed over, so that a listing costs what
                # the statuses in use need, not 16 queries for each of eleven.
                passes = passing_empty_statuses(
                    statuses,
                    len(queries) // len(statuses),
                    lambda: read_counts(self._client, self.table_name).by_status,
                )
            if template is not None:
                filters.add("template", template)
        if region is not None:
            filters.add("region", region)
        entries, token = self._walk(limit, next_token, [filters.applied(q) for q in queries], passes)
        # The entries say which workers; the items say what they are now. One that no longer matches
        # (it changed status since the index entry was written) is left out of this page.
        found = self.get_workers([str(entry["id"]["S"]) for entry in entries], consistent=False)
        wanted = {"status": status, "region": region, "pool": pool, "template": template}
        return Page([w for w in found if _matches(w, wanted)], token)

    def iter_workers_by_status(
        self,
        statuses: Iterable[WorkerStatus],
        *,
        region: str | None = None,
        shard: Shard = WHOLE_FLEET,
    ) -> Iterator[Worker]:
        """Every worker in the given statuses (of the region, of the shard), read in full.

        Migrated table: the shard's buckets of each status from by_shard (a BETWEEN in each write shard
        its range touches: nobody else's workers are read), then the items themselves, eventually
        consistent like the index. A worker read twice (it changed status during the read) is yielded
        once, as the item is now, and only if that is one of the statuses asked for.
        """
        wanted = list(statuses)
        if not self.layout().done:
            for worker in self._legacy_by_status(wanted, region=region):
                if shard.owns(worker.id):
                    yield worker
            return
        filters = _Filters()
        if region is not None:
            filters.add("region", region)
        entries = self._query_each([filters.applied(q) for q in shard_queries(wanted, shard.buckets)])
        ids = {str(entry["id"]["S"]): None for entry in entries}
        accepted = {str(s) for s in wanted}
        for worker in self.get_workers(list(ids), consistent=False):
            if worker.status in accepted:
                yield worker

    def reconcile_read(self, statuses: Iterable[WorkerStatus], shard: Shard) -> FleetRead:
        """The shard's workers in these statuses, and the fleet's counts (see FleetRead)."""
        read_at = utcnow()
        wanted = list(statuses)
        if self.layout().done:
            counts = read_counts(self._client, self.table_name)
            # The exact counts, read first and strongly consistent, say which statuses hold no worker:
            # their index partitions are not read. A worker entering one after the counts were read is
            # found by the next cycle, as one the index has not shown yet would be.
            held = counts.by_status
            occupied = [status for status in wanted if held[status] > 0]
            return FleetRead(list(self.iter_workers_by_status(occupied, shard=shard)), counts, None, read_at)
        # Until every worker is counted, the counts come from a read of the whole fleet, as before.
        fleet = newest_per_worker(self._legacy_by_status(wanted))
        return FleetRead(
            [w for w in fleet if shard.owns(w.id)],
            FleetCounts.of(fleet),
            {w.id: w.status for w in fleet},
            read_at,
        )

    def worker_summaries(self, statuses: Iterable[WorkerStatus]) -> Iterator[WorkerSummary]:
        """Every worker in these statuses as the index shows it (for fleet-wide figures)."""
        wanted = list(statuses)
        if not self.layout().done:
            yield from self._legacy_by_status(wanted)
            return
        for entry in self._query_each(shard_queries(wanted, WHOLE_FLEET.buckets)):
            yield _summary(entry)

    def _query_each(self, queries: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every item of every query, the queries run READ_PARALLELISM at a time, in the queries' order."""
        with ContextThreadPool(max_workers=READ_PARALLELISM) as pool:
            pages = pool.map(lambda query: list(self._query_all(**query)), queries)
            return [item for page in pages for item in page]

    # ---- the legacy layout (store/layout.py): used until the migration is done -----------------------

    def _legacy_by_status(
        self, statuses: Iterable[WorkerStatus], *, region: str | None = None
    ) -> Iterator[Worker]:
        for status in statuses:
            values: dict[str, Any] = {":pk": {"S": keys.worker_status_partition(status)}}
            condition = "GSI1PK = :pk"
            if region is not None:
                values[":prefix"] = {"S": keys.worker_status_sort(region)}
                condition += " AND begins_with(GSI1SK, :prefix)"
            for item in self._query_all(
                IndexName=BY_STATUS, KeyConditionExpression=condition, ExpressionAttributeValues=values
            ):
                yield load_record(Worker, item)

    def _legacy_list(
        self,
        *,
        status: WorkerStatus | None,
        region: str | None,
        pool: str | None,
        template: str | None,
        limit: int,
        next_token: str | None,
    ) -> Page[Worker]:
        filters: list[str] = []
        values: dict[str, Any] = {}
        names: dict[str, str] = {}

        def add_filter(attribute: str, value: str) -> None:
            names[f"#{attribute}"] = attribute
            values[f":{attribute}"] = {"S": value}
            filters.append(f"#{attribute} = :{attribute}")

        if status is not None:
            query: dict[str, Any] = {"IndexName": BY_STATUS}
            values[":pk"] = {"S": keys.worker_status_partition(status)}
            prefix = keys.worker_status_sort(region, template)
            key_condition = "GSI1PK = :pk"
            if prefix:
                values[":prefix"] = {"S": prefix}
                key_condition += " AND begins_with(GSI1SK, :prefix)"
            elif template is not None:
                add_filter("template", template)
            if pool is not None:
                add_filter("pool", pool)
        elif pool is not None:
            query = {"IndexName": BY_PARENT}
            values[":pk"] = {"S": f"POOL#{pool}"}
            values[":w"] = {"S": "WORKER#"}
            key_condition = "GSI2PK = :pk AND begins_with(GSI2SK, :w)"
            for attribute, value in (("region", region), ("template", template)):
                if value is not None:
                    add_filter(attribute, value)
        else:
            query = {"IndexName": BY_KIND}
            values[":pk"] = {"S": keys.kind_partition("WORKER")}
            key_condition = "GSI3PK = :pk"
            for attribute, value in (("region", region), ("template", template)):
                if value is not None:
                    add_filter(attribute, value)

        query["KeyConditionExpression"] = key_condition
        query["ExpressionAttributeValues"] = values
        if filters:
            query["FilterExpression"] = " AND ".join(filters)
            query["ExpressionAttributeNames"] = names
        return self._page(Worker, limit, next_token, **query)


def _ownership_details(current: Worker, updated: Worker, delta: int, claim: Claim | None) -> dict[str, Any]:
    """What the audit says of a place taken in (+1) or given back to (-1) the pool's budgets, so the
    audit trail alone replays each pool's count: whose place it is, and for one taken, the instant it
    was decided at and the version of the pool's budgets it was decided on."""
    owner = updated.owner if delta > 0 else current.owner
    details: dict[str, Any] = {"in_use": delta, "owner": owner.reason if owner else None}
    if delta > 0 and owner is not None:
        details["owner_since"] = owner.since.isoformat()
        if claim is not None and claim.pool_version is not None:
            details["pool_version"] = claim.pool_version
    return details


def _summary(entry: Mapping[str, Any]) -> WorkerSummary:
    return load_record(WorkerSummary, entry)


def _matches(worker: Worker, wanted: Mapping[str, str | None]) -> bool:
    return all(value is None or str(getattr(worker, name)) == value for name, value in wanted.items())


class _Filters:
    """Equality filters on projected attributes, added to each query of a walk."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self.terms: list[str] = []

    def add(self, attribute: str, value: str) -> None:
        self.names[f"#f_{attribute}"] = attribute
        self.values[f":f_{attribute}"] = {"S": value}
        self.terms.append(f"#f_{attribute} = :f_{attribute}")

    def applied(self, query: Mapping[str, Any]) -> dict[str, Any]:
        if not self.terms:
            return dict(query)
        return {
            **query,
            "FilterExpression": " AND ".join(self.terms),
            "ExpressionAttributeNames": {**query.get("ExpressionAttributeNames", {}), **self.names},
            "ExpressionAttributeValues": {**query["ExpressionAttributeValues"], **self.values},
        }


def passing_empty_statuses(
    statuses: Sequence[WorkerStatus], per_status: int, counts: Callable[[], Counter[WorkerStatus]]
) -> Callable[[int], int]:
    """A walk's `passes` over these statuses' partitions (`per_status` each, in order): at the start of a
    status, its partitions when exact counts say it holds no worker (docs/data-model.md, "Listing").

    Only counts read after every partition before it was read may pass a status over: then they stand
    for a read of it in its turn, as a walk of every partition would make. Counts read before a
    partition that was then read are read again before they pass over another status.
    """
    latest: Counter[WorkerStatus] | None = None
    fresh = False

    def passes(position: int) -> int:
        nonlocal latest, fresh
        if position % per_status == 0:
            status = statuses[position // per_status]
            if latest is None or not (fresh or latest[status]):
                latest, fresh = counts(), True
            if not latest[status]:
                return per_status
        fresh = False
        return 0

    return passes


def shard_queries(statuses: Iterable[WorkerStatus], buckets: range) -> list[dict[str, Any]]:
    """by_shard queries for these statuses and a contiguous range of buckets: one per write shard the
    range touches, each narrowed to the range where it does not cover the whole write shard."""
    queries: list[dict[str, Any]] = []
    per_partition = BUCKETS // keys.INDEX_PARTITIONS
    for status in statuses:
        for partition in keys.partitions_of(buckets):
            first = max(buckets.start, partition * per_partition)
            last = min(buckets.stop, (partition + 1) * per_partition) - 1
            values: dict[str, Any] = {":pk": {"S": keys.worker_shard_partition(status, partition)}}
            condition = "GSI4PK = :pk"
            if first > partition * per_partition or last < (partition + 1) * per_partition - 1:
                # '$' sorts right after '#', which separates the bucket from the worker id.
                values[":lo"] = {"S": keys.bucket_sort(first)}
                values[":hi"] = {"S": keys.bucket_sort(last) + "$"}
                condition += " AND GSI4SK BETWEEN :lo AND :hi"
            queries.append(
                {
                    "IndexName": BY_SHARD,
                    "KeyConditionExpression": condition,
                    "ExpressionAttributeValues": values,
                }
            )
    return queries


def _pool_queries(pool: str, template: str | None = None) -> list[dict[str, Any]]:
    queries: list[dict[str, Any]] = []
    for partition in range(keys.INDEX_PARTITIONS):
        values: dict[str, Any] = {":pk": {"S": keys.pool_member_partition(pool, partition)}}
        condition = "GSI5PK = :pk"
        if template is not None:
            values[":prefix"] = {"S": f"{template}#"}
            condition += " AND begins_with(GSI5SK, :prefix)"
        queries.append(
            {"IndexName": BY_POOL, "KeyConditionExpression": condition, "ExpressionAttributeValues": values}
        )
    return queries
