"""Worker operations: one item per operation in its worker's partition, and the worker's one-at-a-time lock.

Layout: `PK = WORKER#<worker id>`, `SK = OPERATION#<operation id>`; ids sort by creation time, so a
worker's operations list newest first by key. Operations not yet finished carry `GSI1PK =
OPERATION#<status>` so the reconciler finds them without a scan; a finished one leaves the index.

One operation in flight per worker: the worker item's `operation_in_flight` attribute names it. A request
sets it in the same transaction that puts the operation, on the condition that it is absent and the
worker is in a status the operation runs on; the write that finishes the operation removes it, on the
condition that it still names that operation. The attribute is store bookkeeping, not part of the worker
record, so a worker write made from an older read neither sees nor clears it (see store/workers.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

from fleetkeeper.domain.errors import Conflict, NotFound, StaleWrite
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import AuditEvent, Worker, utcnow
from fleetkeeper.domain.operations import Operation, OperationInFlight, OperationStatus, operation_id_floor
from fleetkeeper.store import keys
from fleetkeeper.store.codec import deserialize, load_record, record_attributes, serialize
from fleetkeeper.store.retention import expiration
from fleetkeeper.store.schema import BY_STATUS
from fleetkeeper.store.table import Page, TableAccess, current_status, validated_copy

# The worker attribute naming its operation in flight (absent when none).
OPERATION_LOCK: Final = "operation_in_flight"
MAX_OPERATION_PAGE: Final = 100
OPERATION_PREFIX: Final = "OPERATION#"
_OPEN_STATUSES: Final = (OperationStatus.PENDING, OperationStatus.RUNNING)


class _LockNotOurs(Exception):
    """Finishing an operation whose worker no longer names it (or is gone): the lock is left alone."""


def operation_key(worker_id: str, operation_id: str) -> dict[str, str]:
    return {"PK": keys.worker_key(worker_id)["PK"], "SK": f"{OPERATION_PREFIX}{operation_id}"}


def operation_status_partition(status: OperationStatus) -> str:
    return f"OPERATION#{status}"


class OperationRepository(TableAccess):
    def _operation_item(self, op: Operation) -> dict[str, Any]:
        item = {**operation_key(op.worker_id, op.id), **record_attributes(op)}
        if not op.finished:
            item["GSI1PK"] = operation_status_partition(op.status)
            item["GSI1SK"] = f"{op.worker_id}#{op.id}"
        else:
            # Counted from its end: an operation that is still open never expires under its waiters.
            item.update(expiration(op.finished_at or op.updated_at, self.operation_retention_days))
        return item

    def _operation_audit(self, op: Operation, action: str, actor: str, reason: str | None) -> dict[str, Any]:
        return self._audit_put(
            AuditEvent(
                entity="worker",
                entity_id=op.worker_id,
                action=action,
                actor=actor,
                reason=reason,
                details={
                    "operation_id": op.id,
                    "operation": op.name,
                    "status": str(op.status),
                    "attempts": op.attempts,
                    "origin": str(op.origin),
                },
            )
        )

    def request_operation(self, op: Operation, allowed: Sequence[WorkerStatus], *, actor: str) -> Operation:
        """Store a new PENDING operation and take the worker's lock, in one transaction.

        Refused with NotFound (no worker), Conflict (the worker is in a status the operation does not run
        on) or OperationInFlight (another operation holds the lock).
        """
        now = utcnow()
        stored = op.model_copy(update={"version": 1, "created_at": now, "updated_at": now})
        statuses = {f":s{i}": {"S": str(s)} for i, s in enumerate(allowed)}
        lock = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(op.worker_id)),
                "UpdateExpression": "SET #lock = :id",
                "ConditionExpression": f"attribute_exists(PK) AND attribute_not_exists(#lock) "
                f"AND #s IN ({', '.join(statuses)})",
                "ExpressionAttributeNames": {"#lock": OPERATION_LOCK, "#s": "status"},
                "ExpressionAttributeValues": {":id": {"S": op.id}, **statuses},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

        def refuse(current: dict[str, Any] | None) -> Exception:
            if current is None:
                return NotFound("worker", op.worker_id)
            status = current_status(Worker, current)
            holder = deserialize(current).get(OPERATION_LOCK)
            if holder:
                return OperationInFlight(op.worker_id, status, str(holder))
            wanted = " or ".join(str(s) for s in allowed)
            return _status_conflict(op.worker_id, status, f"'{op.name}' runs only on a {wanted} worker")

        self._transact(
            [
                self._put(self._operation_item(stored), "attribute_not_exists(PK)"),
                lock,
                self._operation_audit(stored, "OperationRequested", actor, None),
            ],
            {1: refuse},
            written=stored,
        )
        return stored

    def find_operation(self, worker_id: str, operation_id: str) -> Operation | None:
        return self._find(Operation, operation_key(worker_id, operation_id))

    def get_operation(self, worker_id: str, operation_id: str) -> Operation:
        return self._fetch(Operation, operation_key(worker_id, operation_id), "operation", operation_id)

    def list_operations(
        self, worker_id: str, *, limit: int = 50, next_token: str | None = None
    ) -> Page[Operation]:
        """One page of a worker's operations, newest first."""
        return self._page(
            Operation,
            min(limit, MAX_OPERATION_PAGE),
            next_token,
            KeyConditionExpression="PK = :pk AND begins_with(SK, :prefix)",
            ExpressionAttributeValues={
                ":pk": {"S": keys.worker_key(worker_id)["PK"]},
                ":prefix": {"S": OPERATION_PREFIX},
            },
            ScanIndexForward=False,
            ConsistentRead=True,
        )

    def operations_since(
        self, worker_id: str, since: datetime, *, limit: int = MAX_OPERATION_PAGE
    ) -> list[Operation]:
        """The worker's newest operations created at or after `since`, at most `limit`, newest first:
        one consistent query of a key range (ids sort by creation time), however long the worker's
        history is."""
        items, _ = self._query(
            KeyConditionExpression="PK = :pk AND SK BETWEEN :first AND :last",
            ExpressionAttributeValues={
                ":pk": {"S": keys.worker_key(worker_id)["PK"]},
                ":first": {"S": f"{OPERATION_PREFIX}{operation_id_floor(since)}"},
                # Past every id: they all begin `op-` and a digit, and '~' sorts after the digits.
                ":last": {"S": f"{OPERATION_PREFIX}op-~"},
            },
            ScanIndexForward=False,
            ConsistentRead=True,
            Limit=min(limit, MAX_OPERATION_PAGE),
        )
        return [load_record(Operation, i) for i in items]

    def open_operations(self) -> Iterator[tuple[str, str]]:
        """(worker id, operation id) of every PENDING or RUNNING operation, from the index.

        The index may lag: callers read each operation again from the table before acting on it.
        """
        for status in _OPEN_STATUSES:
            for item in self._query_all(
                IndexName=BY_STATUS,
                KeyConditionExpression="GSI1PK = :pk",
                ExpressionAttributeValues={":pk": {"S": operation_status_partition(status)}},
            ):
                worker_id, _, operation_id = str(item["GSI1SK"]["S"]).partition("#")
                yield worker_id, operation_id

    def release_operation_lock(self, worker_id: str, holder: str, *, actor: str, reason: str) -> bool:
        """Remove the worker's lock if it still names `holder` (an operation that is gone, unreadable or
        finished without releasing it); False when the lock changed meanwhile."""
        release = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(worker_id)),
                "UpdateExpression": "REMOVE #lock",
                "ConditionExpression": "#lock = :id",
                "ExpressionAttributeNames": {"#lock": OPERATION_LOCK},
                "ExpressionAttributeValues": {":id": {"S": holder}},
                "ReturnValuesOnConditionCheckFailure": "NONE",
            }
        }
        audit = AuditEvent(
            entity="worker",
            entity_id=worker_id,
            action="OperationLockReleased",
            actor=actor,
            reason=reason,
            details={"operation_id": holder},
        )
        try:
            self._transact([release, self._audit_put(audit)], {0: lambda _: _LockNotOurs()})
        except _LockNotOurs:
            return False
        return True

    def record_audit(self, event: AuditEvent) -> None:
        """An audit event that goes with no write of its own (e.g. an operation that could not run)."""
        self._transact([self._audit_put(event)], {})

    def operation_lock(self, worker_id: str) -> str | None:
        """The id of the worker's operation in flight, read consistently; None when there is none."""
        item = self._get(keys.worker_key(worker_id))
        holder = deserialize(item).get(OPERATION_LOCK) if item else None
        return str(holder) if holder else None

    def save_operation(
        self,
        op: Operation,
        changes: Mapping[str, Any],
        *,
        actor: str,
        action: str | None = None,
        reason: str | None = None,
    ) -> Operation:
        """Change an operation read at `op.version` (StaleWrite if it moved); a finishing write also
        releases the worker's lock, in the same transaction, if the lock still names this operation."""
        updated = validated_copy(op, {**changes, "version": op.version + 1, "updated_at": utcnow()})
        put = self._put(
            self._operation_item(updated),
            "#v = :v AND #s = :s",
            {":v": op.version, ":s": str(op.status)},
            {"#v": "version", "#s": "status"},
        )

        def stale(current: dict[str, Any] | None) -> Exception:
            if current is None:
                return NotFound("operation", op.id)
            return StaleWrite("operation", op.id, current_status(Operation, current))

        items: list[dict[str, Any]] = [put]
        if action is not None:
            items.append(self._operation_audit(updated, action, actor, reason))
        if not updated.finished:
            self._transact(items, {0: stale}, written=updated)
            return updated
        release = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(op.worker_id)),
                "UpdateExpression": "REMOVE #lock",
                "ConditionExpression": "#lock = :id",
                "ExpressionAttributeNames": {"#lock": OPERATION_LOCK},
                "ExpressionAttributeValues": {":id": {"S": op.id}},
                "ReturnValuesOnConditionCheckFailure": "NONE",
            }
        }
        try:
            self._transact(
                [*items, release], {0: stale, len(items): lambda _: _LockNotOurs()}, written=updated
            )
        except _LockNotOurs:
            # The worker is gone or names no lock of ours: finishing the operation is all there is to do.
            self._transact(items, {0: stale}, written=updated)
        return updated


def _status_conflict(worker_id: str, status: str | None, why: str) -> Exception:
    return Conflict("worker", worker_id, status, f"worker {worker_id} is {status}; {why}")
