"""The slot counter: placing an instance takes a slot on its worker, ending it frees the slot.

Each is one transaction over the instance, the worker, the worker's slot item and an audit item
(docs/data-model.md):
- the worker's `active_instances` changes under the invariant it touches (RUNNING and below capacity;
  above zero) and its `version` is bumped, so a writer holding an older read of the worker loses;
- a slot item per active instance (`PK = WORKER#<worker>`, `SK = SLOT#<instance>`) is put or deleted in
  the same transaction, so the slots and the counter never disagree and "which instances are active on
  this worker" is answered exactly by a consistent query of the worker's partition, not from an index
  that may lag behind a just-committed placement. The ids live beside the worker, not in it: a list on
  the worker item would grow with its capacity and be rewritten by every placement.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.errors import (
    CapacityUnavailable,
    Conflict,
    DrainNoLongerActive,
    InvalidInput,
    NotFound,
)
from fleetkeeper.domain.lifecycle import (
    ACCEPTS_INSTANCES,
    ACTIVE_INSTANCE_STATES,
    InstanceState,
    PoolStatus,
    WorkerStatus,
    check_instance_transition,
)
from fleetkeeper.domain.models import AuditEvent, DrainOutcome, Instance, Worker, WorkerSummary, utcnow
from fleetkeeper.domain.placement import refusal_reason, sickness
from fleetkeeper.domain.repair import HealthStatus
from fleetkeeper.store import keys
from fleetkeeper.store.capacity import bookings_update
from fleetkeeper.store.codec import deserialize, load_record, serialize
from fleetkeeper.store.instances import InstanceRepository
from fleetkeeper.store.schema import BY_PARENT
from fleetkeeper.store.table import Refusal, validated_copy

# The worker attribute where an earlier release kept the ids of its active instances (a string set):
# still read, and emptied as those instances end, but no longer written.
ACTIVE_IDS = "active_instance_ids"
SLOT_PREFIX = "SLOT#"
# A worker whose health says it is sick takes no new instance (domain/placement.sickness): the condition
# rides on the worker item, as exact as the status and capacity beside it.
NOT_SICK = "(attribute_not_exists(#health.#hstatus) OR #health.#hstatus <> :sick)"
SICK_NAMES = {"#health": "health", "#hstatus": "status"}
SICK_VALUES = {":sick": {"S": str(HealthStatus.UNHEALTHY)}}


def slot_key(worker_id: str, instance_id: str) -> dict[str, str]:
    """The item that says an instance holds a slot on its worker, in the worker's partition."""
    return {"PK": keys.worker_key(worker_id)["PK"], "SK": f"{SLOT_PREFIX}{instance_id}"}


class _CounterAtZero(Exception):
    """The worker's counter had no slot to free; the instance is ended without it."""


class SlotTransactions(InstanceRepository):
    def place_instance(self, instance: Instance, worker: WorkerSummary, *, actor: str) -> Instance:
        """Put the instance and take a slot on its worker, in one transaction.

        The worker must be RUNNING with a free slot, and its pool (if any) active. Because a drain
        start rewrites the same worker item, a placement and a drain can never both win.
        """
        now = utcnow()
        booked = instance.state == InstanceState.WAITING_FOR_CAPACITY
        if booked:
            check_instance_transition(instance.state, InstanceState.SCHEDULED)
        stored = instance.model_copy(
            update={
                "worker_id": worker.id,
                "pool": worker.pool,
                "template": worker.template,
                "state": InstanceState.SCHEDULED,
                "version": instance.version + 1 if booked else 1,
                "updated_at": now,
                **({} if booked else {"created_at": now}),
            }
        )
        take_slot = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(worker.id)),
                "UpdateExpression": "SET active_instances = active_instances + :one, "
                "#v = #v + :one, updated_at = :now",
                "ConditionExpression": f"#s = :running AND active_instances < #cap AND {NOT_SICK}",
                "ExpressionAttributeNames": {
                    "#s": "status",
                    "#v": "version",
                    "#cap": "capacity",
                    **SICK_NAMES,
                },
                "ExpressionAttributeValues": {
                    ":one": {"N": "1"},
                    ":running": {"S": str(ACCEPTS_INSTANCES)},
                    ":now": {"S": now.isoformat()},
                    **SICK_VALUES,
                },
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        # A new instance is put once; a booking moves from WAITING_FOR_CAPACITY only as it was read, so
        # one ended meanwhile is never placed, and its reserved room is released in the same step.
        put = (
            self._put(
                self._instance_item(stored),
                "#v = :v AND #st = :waiting",
                {":v": instance.version, ":waiting": str(InstanceState.WAITING_FOR_CAPACITY)},
                {"#v": "version", "#st": "state"},
            )
            if booked
            else self._put(self._instance_item(stored), "attribute_not_exists(PK)")
        )
        items: list[dict[str, Any]] = [
            put,
            take_slot,
            self._audit_put(
                AuditEvent(
                    entity="instance",
                    entity_id=stored.id,
                    action="InstancePlaced",
                    actor=actor,
                    from_status=str(instance.state) if booked else None,
                    to_status=str(stored.state),
                    details={"worker_id": worker.id},
                )
            ),
        ]
        refusals: dict[int, Refusal] = {
            0: self._refuse_stale_instance(instance)
            if booked
            else lambda _: Conflict("instance", stored.id, None, f"instance '{stored.id}' already exists"),
            1: lambda current: _worker_refuses(worker.id, current),
        }
        if worker.pool:
            items.append(self._pool_open(worker.pool, worker.id))
            refusals[3] = _pool_refuses(worker.pool)
        items.append(self._take_slot_item(worker.id, stored.id))
        if booked and instance.pool:
            items.append(bookings_update(self.table_name, instance.pool, -1))
        self._transact(items, refusals, written=stored)
        return stored

    def book_instance(self, instance: Instance, *, room: int, actor: str) -> Instance:
        """Put a booking WAITING_FOR_CAPACITY in its pool, in one transaction with a place among the
        pool's waiting bookings, taken only while fewer than `room` wait (else `CapacityUnavailable`)."""
        if instance.pool is None or instance.timeslot_start is None:
            raise InvalidInput("pool", "a booking needs a pool and a timeslot_start")
        now = utcnow()
        stored = instance.model_copy(
            update={
                "worker_id": "",
                "state": InstanceState.WAITING_FOR_CAPACITY,
                "version": 1,
                "created_at": now,
                "updated_at": now,
            }
        )
        pool = instance.pool
        items = [
            self._put(self._instance_item(stored), "attribute_not_exists(PK)"),
            bookings_update(self.table_name, pool, 1, below=room),
            # Exact with the pool write that turns bookings off (store/catalog.save_pool): no booking
            # waits in a pool that no longer books, where no cycle would place or fail it.
            self._condition_check(
                keys.pool_key(pool), "#c.#b = :on", {":on": True}, {"#c": "capacity", "#b": "bookings"}
            ),
            self._audit_put(
                AuditEvent(
                    entity="instance",
                    entity_id=stored.id,
                    action="InstanceBooked",
                    actor=actor,
                    to_status=str(stored.state),
                    details={"pool": pool, "timeslot_start": instance.timeslot_start.isoformat()},
                )
            ),
        ]
        refusals: dict[int, Refusal] = {
            0: lambda _: Conflict("instance", stored.id, None, f"instance '{stored.id}' already exists"),
            1: lambda _: CapacityUnavailable(
                f"no worker of pool {pool} has room, and max_workers leaves no room for another booking "
                f"({room} may wait)"
            ),
            2: lambda _: CapacityUnavailable(f"no worker of pool {pool} has room, and it no longer books"),
        }
        self._transact(items, refusals, written=stored)
        return stored

    def _pool_open(self, pool: str, worker_id: str) -> dict[str, Any]:
        """The condition that the pool is active: on the gate of the worker's write shard once the table
        is migrated (store/catalog.py), on the pool item before."""
        key = keys.pool_gate_key(pool, keys.gate_of(worker_id)) if self.layout().done else keys.pool_key(pool)
        return self._condition_check(
            key, "#s = :active", {":active": str(PoolStatus.ACTIVE)}, {"#s": "status"}
        )

    def _take_slot_item(self, worker_id: str, instance_id: str) -> dict[str, Any]:
        # Unconditional: the instance's own put (attribute_not_exists) already makes the placement once.
        item = {**slot_key(worker_id, instance_id), "instance_id": instance_id}
        return {"Put": {"TableName": self.table_name, "Item": serialize(item)}}

    def _free_slot_item(self, worker_id: str, instance_id: str) -> dict[str, Any]:
        return {"Delete": {"TableName": self.table_name, "Key": serialize(slot_key(worker_id, instance_id))}}

    def end_instance(
        self,
        instance: Instance,
        target: InstanceState,
        *,
        actor: str,
        reason: str | None = None,
        drain_generation: int | None = None,
    ) -> Instance:
        """End an active instance and free its slot on the worker, atomically and only once.

        `instance` is the copy the caller read: if it changed since, `StaleWrite` names its state now.
        With `drain_generation` the end is done for that drain, and only while it is still active: the
        worker must be DRAINING with that generation still RUNNING, or `DrainNoLongerActive` is raised
        and nothing is written, so an end can never land after a cancel that committed first.
        """
        if target in ACTIVE_INSTANCE_STATES:
            raise InvalidInput("state", f"{target} is not an ending state")
        check_instance_transition(instance.state, target)
        updated = validated_copy(
            instance,
            {"state": target, "reason": reason, "version": instance.version + 1, "updated_at": utcnow()},
        )
        if instance.state == InstanceState.WAITING_FOR_CAPACITY:
            return self._end_booking(instance, updated, actor=actor, reason=reason)
        active_values = {f":a{i}": str(s) for i, s in enumerate(sorted(ACTIVE_INSTANCE_STATES))}
        end = self._put(
            self._instance_item(updated),
            f"#v = :v AND #st IN ({', '.join(active_values)})",
            {":v": instance.version, **active_values},
            {"#v": "version", "#st": "state"},
        )
        drain_condition, drain_names, drain_values = _drain_still_active(drain_generation)
        free_slot = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(instance.worker_id)),
                "UpdateExpression": "SET active_instances = active_instances - :one, #v = #v + :one, "
                "updated_at = :now DELETE #ids :id",
                "ConditionExpression": "active_instances > :zero" + drain_condition,
                "ExpressionAttributeNames": {"#v": "version", "#ids": ACTIVE_IDS, **drain_names},
                "ExpressionAttributeValues": {
                    ":one": {"N": "1"},
                    ":zero": {"N": "0"},
                    ":now": {"S": utcnow().isoformat()},
                    ":id": {"SS": [instance.id]},
                    **drain_values,
                },
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

        def audit(details: dict[str, Any]) -> dict[str, Any]:
            return self._audit_put(
                AuditEvent(
                    entity="instance",
                    entity_id=instance.id,
                    action=f"Instance{target.title()}",
                    actor=actor,
                    from_status=str(instance.state),
                    to_status=str(target),
                    reason=reason,
                    details={"worker_id": instance.worker_id, **details},
                )
            )

        def worker_refuses(current: dict[str, Any] | None) -> Exception:
            if drain_generation is not None:
                over = _drain_over(instance.worker_id, drain_generation, current)
                if over is not None:
                    return over
            return _CounterAtZero()

        refuse_instance = self._refuse_stale_instance(instance)
        slot = self._free_slot_item(instance.worker_id, instance.id)
        try:
            self._transact(
                [end, free_slot, audit({}), slot], {0: refuse_instance, 1: worker_refuses}, written=updated
            )
        except _CounterAtZero:
            # The worker's counter is already at zero (or the worker is gone): end the instance anyway
            # rather than leave it active forever, and say so in its audit record.
            anomaly = audit({"counter": "worker had no slot to free"})
            if self._get(keys.worker_key(instance.worker_id)) is None:
                if drain_generation is not None:
                    raise DrainNoLongerActive(
                        instance.worker_id, drain_generation, None, "the worker is gone"
                    ) from None
                self._transact([end, anomaly, slot], {0: refuse_instance}, written=updated)
                return updated
            forget_id = {
                "Update": {
                    "TableName": self.table_name,
                    "Key": serialize(keys.worker_key(instance.worker_id)),
                    "UpdateExpression": "SET #v = #v + :one, updated_at = :now DELETE #ids :id",
                    "ConditionExpression": "attribute_exists(PK)" + drain_condition,
                    "ExpressionAttributeNames": {"#v": "version", "#ids": ACTIVE_IDS, **drain_names},
                    "ExpressionAttributeValues": {
                        ":one": {"N": "1"},
                        ":now": {"S": utcnow().isoformat()},
                        ":id": {"SS": [instance.id]},
                        **drain_values,
                    },
                    "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                }
            }

            def gone_or_over(current: dict[str, Any] | None) -> Exception:
                over = (
                    _drain_over(instance.worker_id, drain_generation, current)
                    if drain_generation is not None
                    else None
                )
                return over or NotFound("worker", instance.worker_id)

            self._transact(
                [end, forget_id, anomaly, slot], {0: refuse_instance, 1: gone_or_over}, written=updated
            )
        return updated

    def _end_booking(
        self, instance: Instance, updated: Instance, *, actor: str, reason: str | None
    ) -> Instance:
        """End a booking still waiting: it held no slot; its place among the pool's waiting bookings is
        released in the same transaction, once, since the end is conditional on the state it was read in."""
        items: list[dict[str, Any]] = [
            self._put(
                self._instance_item(updated),
                "#v = :v AND #st = :waiting",
                {":v": instance.version, ":waiting": str(InstanceState.WAITING_FOR_CAPACITY)},
                {"#v": "version", "#st": "state"},
            ),
            self._audit_put(
                AuditEvent(
                    entity="instance",
                    entity_id=instance.id,
                    action=f"Instance{updated.state.title()}",
                    actor=actor,
                    from_status=str(instance.state),
                    to_status=str(updated.state),
                    reason=reason,
                    details={"pool": instance.pool},
                )
            ),
        ]
        if instance.pool:
            items.append(bookings_update(self.table_name, instance.pool, -1))
        self._transact(items, {0: self._refuse_stale_instance(instance)}, written=updated)
        return updated

    def waiting_bookings(
        self, pool: str, *, starting_before: datetime, limit: int
    ) -> tuple[list[Instance], int]:
        """The pool's bookings waiting for capacity whose timeslot starts before `starting_before`,
        earliest first, at most `limit`, and how many more wait behind those (counted, not read).
        Read through by_parent, which may lag: the writes that place or end one are conditional on
        its state."""
        query: dict[str, Any] = {
            "IndexName": BY_PARENT,
            "KeyConditionExpression": "GSI2PK = :pk AND GSI2SK < :until",
            "ExpressionAttributeValues": {
                ":pk": {"S": keys.booking_partition(pool)},
                ":until": {"S": keys.booking_sort(starting_before)},
            },
        }
        items, start = self._query(**query, Limit=limit)
        behind = 0
        while start:
            response = with_backoff(
                lambda start=start: self._client.query(  # type: ignore[misc]
                    TableName=self.table_name, **query, Select="COUNT", ExclusiveStartKey=start
                ),
                name="Query",
            )
            behind += int(response.get("Count", 0))
            start = response.get("LastEvaluatedKey")
        return [load_record(Instance, i) for i in items], behind

    def move_instance(
        self, instance: Instance, target: WorkerSummary, *, actor: str, drain_generation: int
    ) -> Instance:
        """Move a SCHEDULED instance from its draining worker to `target`, in one transaction.

        `instance` is the copy the caller read. The transaction holds only while:
        - the instance is that very version, still SCHEDULED, still on its worker (else `StaleWrite`);
        - its worker is still DRAINING for `drain_generation`, that drain RUNNING (else
          `DrainNoLongerActive`): a cancel that commits first stops the moves;
        - `target` is RUNNING with a free slot, of the same template and pool (else `Conflict`);
        - the pool, if any, is active (else `Conflict`).
        Both counters and id sets change together and the drain's `moved_instances` grows by one, so an
        instance is never on two workers, on none, or moved without being counted. The target comes from
        a read that may be stale (an index, or a copy): the conditions, not that read, decide.
        """
        source_id = instance.worker_id
        if target.id == source_id:
            raise InvalidInput("worker_id", f"instance {instance.id} is already on worker {target.id}")
        now = utcnow()
        moved = validated_copy(
            instance, {"worker_id": target.id, "version": instance.version + 1, "updated_at": now}
        )
        move = self._put(
            self._instance_item(moved),
            "#v = :v AND #st = :scheduled AND #w = :source",
            {":v": instance.version, ":scheduled": str(InstanceState.SCHEDULED), ":source": source_id},
            {"#v": "version", "#st": "state", "#w": "worker_id"},
        )
        drain_condition, drain_names, drain_values = _drain_still_active(drain_generation)
        free_slot = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(source_id)),
                "UpdateExpression": "SET active_instances = active_instances - :one, #v = #v + :one, "
                "updated_at = :now, #d.#moved = if_not_exists(#d.#moved, :zero) + :one DELETE #ids :id",
                "ConditionExpression": "active_instances > :zero" + drain_condition,
                "ExpressionAttributeNames": {
                    "#v": "version",
                    "#ids": ACTIVE_IDS,
                    "#moved": "moved_instances",
                    **drain_names,
                },
                "ExpressionAttributeValues": {
                    ":one": {"N": "1"},
                    ":zero": {"N": "0"},
                    ":now": {"S": now.isoformat()},
                    ":id": {"SS": [instance.id]},
                    **drain_values,
                },
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        same_pool = "#pool = :pool" if instance.pool else "attribute_not_exists(#pool)"
        take_slot = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(target.id)),
                "UpdateExpression": "SET active_instances = active_instances + :one, "
                "#v = #v + :one, updated_at = :now",
                "ConditionExpression": f"#s = :running AND active_instances < #cap AND {NOT_SICK} AND "
                "#tpl = :tpl AND " + same_pool,
                "ExpressionAttributeNames": {
                    "#s": "status",
                    "#v": "version",
                    "#cap": "capacity",
                    "#tpl": "template",
                    "#pool": "pool",
                    **SICK_NAMES,
                },
                "ExpressionAttributeValues": {
                    **SICK_VALUES,
                    ":one": {"N": "1"},
                    ":running": {"S": str(ACCEPTS_INSTANCES)},
                    ":now": {"S": now.isoformat()},
                    ":tpl": {"S": instance.template or target.template},
                    **({":pool": {"S": instance.pool}} if instance.pool else {}),
                },
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        audit = self._audit_put(
            AuditEvent(
                entity="instance",
                entity_id=instance.id,
                action="InstanceMoved",
                actor=actor,
                from_status=str(instance.state),
                to_status=str(moved.state),
                reason="worker draining",
                details={"from_worker_id": source_id, "worker_id": target.id, "generation": drain_generation},
            )
        )

        def source_refuses(current: dict[str, Any] | None) -> Exception:
            over = _drain_over(source_id, drain_generation, current)
            if over is not None:
                return over
            return Conflict("worker", source_id, None, f"worker {source_id} has no slot to free")

        def target_refuses(current: dict[str, Any] | None) -> Exception:
            if current is not None:
                other = load_record(Worker, current)
                if other.template != (instance.template or target.template) or other.pool != instance.pool:
                    return Conflict(
                        "worker",
                        target.id,
                        other.status,
                        f"worker {target.id} is in another pool or template",
                    )
            return _worker_refuses(target.id, current)

        items: list[dict[str, Any]] = [move, free_slot, take_slot, audit]
        refusals: dict[int, Refusal] = {
            0: self._refuse_stale_instance(instance),
            1: source_refuses,
            2: target_refuses,
        }
        if instance.pool:
            items.append(self._pool_open(instance.pool, target.id))
            refusals[4] = _pool_refuses(instance.pool)
        items += [self._free_slot_item(source_id, instance.id), self._take_slot_item(target.id, instance.id)]
        self._transact(items, refusals, written=moved)
        return moved

    def active_instances_of(self, worker_id: str) -> list[Instance]:
        """The worker's instances that still hold a slot, exactly: from its slot items, not an index.

        The slot items are written in the same transactions as the worker's counter and read with a
        consistent query of the worker's partition (at most `capacity` of them); the instances are then
        read consistently. A worker stored by an earlier release names its instances in a set on its item
        instead, and one older still in neither: when the counter says more than were found, the rest are
        looked up through the by_parent index and each re-read from its own item.
        """
        item = self._get(keys.worker_key(worker_id))
        if item is None:
            return self._active_from_index(worker_id, set())
        plain = deserialize(item)
        slots = self._query_all(
            KeyConditionExpression="PK = :pk AND begins_with(SK, :slot)",
            ExpressionAttributeValues={
                ":pk": {"S": keys.worker_key(worker_id)["PK"]},
                ":slot": {"S": SLOT_PREFIX},
            },
            ConsistentRead=True,
        )
        ids = {str(s["SK"]["S"]).removeprefix(SLOT_PREFIX) for s in slots}
        ids.update(str(i) for i in plain.get(ACTIVE_IDS) or [])
        found = self._batch_get(Instance, [keys.instance_key(i) for i in sorted(ids)])
        active = [i for i in found if i.is_active and i.worker_id == worker_id]
        if int(plain.get("active_instances", 0)) > len(active):
            active.extend(self._active_from_index(worker_id, {i.id for i in active}))
        return sorted(active, key=lambda i: i.id)

    def _active_from_index(self, worker_id: str, known: set[str]) -> list[Instance]:
        items = self._query_all(
            IndexName=BY_PARENT,
            KeyConditionExpression="GSI2PK = :pk AND begins_with(GSI2SK, :i)",
            ExpressionAttributeValues={":pk": {"S": f"WORKER#{worker_id}"}, ":i": {"S": "INSTANCE#"}},
        )
        candidates = [load_record(Instance, i) for i in items]
        ids = [c.id for c in candidates if c.is_active and c.id not in known]
        # The index may lag; the items themselves are the truth.
        return [i for i in self._batch_get(Instance, [keys.instance_key(i) for i in ids]) if i.is_active]


def _worker_refuses(worker_id: str, current: dict[str, Any] | None) -> Exception:
    if current is None:
        return NotFound("worker", worker_id)
    worker = load_record(Worker, current)
    if worker.status != ACCEPTS_INSTANCES:
        return Conflict(
            "worker",
            worker_id,
            worker.status,
            f"worker {worker_id} is {worker.status}; only RUNNING workers accept instances",
        )
    if sickness(worker) is not None:
        return Conflict("worker", worker_id, worker.status, str(refusal_reason(worker, None)))
    return Conflict(
        "worker",
        worker_id,
        worker.status,
        f"worker {worker_id} is full ({worker.active_instances}/{worker.capacity})",
    )


def _pool_refuses(pool: str) -> Refusal:
    """A closed pool, from its item or one of its gates (both carry the pool's status)."""

    def refuse(current: dict[str, Any] | None) -> Exception:
        status = str(deserialize(current).get("status")) if current else None
        return Conflict(
            "pool", pool, status, f"pool {pool} is {status or 'missing'}; it accepts no instances"
        )

    return refuse


def _drain_still_active(generation: int | None) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The extra worker condition of an end done for a drain: that drain generation is still running."""
    if generation is None:
        return "", {}, {}
    return (
        " AND #s = :draining AND #d.#g = :g AND #d.#o = :drain_running",
        {"#s": "status", "#d": "drain", "#g": "generation", "#o": "outcome"},
        {
            ":draining": {"S": str(WorkerStatus.DRAINING)},
            ":g": {"N": str(generation)},
            ":drain_running": {"S": str(DrainOutcome.RUNNING)},
        },
    )


def _drain_over(
    worker_id: str, generation: int, current: dict[str, Any] | None
) -> DrainNoLongerActive | None:
    """Why the drain `generation` no longer allows ending instances, or None if it still does."""
    if current is None:
        return DrainNoLongerActive(worker_id, generation, None, "the worker is gone")
    worker = load_record(Worker, current)
    if worker.status != WorkerStatus.DRAINING:
        return DrainNoLongerActive(worker_id, generation, worker.status, f"the worker is {worker.status}")
    if worker.drain is None or worker.drain.generation != generation:
        now = worker.drain.generation if worker.drain else None
        return DrainNoLongerActive(worker_id, generation, worker.status, f"the current drain is {now}")
    if worker.drain.outcome != DrainOutcome.RUNNING:
        return DrainNoLongerActive(worker_id, generation, worker.status, f"it ended {worker.drain.outcome}")
    return None
