"""Workers: conditional on the version and status that were read; each write carries its audit item.

A worker item also holds store bookkeeping that is not part of the record (the ids of its active
instances, see store/slots.py). Writes of the record therefore SET the record's attributes and REMOVE the
ones that became empty, rather than replace the whole item.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from fleetkeeper.domain.errors import Conflict, InvalidInput, StaleWrite
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus, check_transition
from fleetkeeper.domain.models import AuditEvent, Worker, utcnow
from fleetkeeper.store import keys
from fleetkeeper.store.codec import load_record, record_attributes, serialize, serialize_value
from fleetkeeper.store.schema import BY_EC2_INSTANCE, BY_KIND, BY_PARENT, BY_STATUS
from fleetkeeper.store.table import Page, TableAccess, current_status, refuse_missing, validated_copy

# Index attributes a worker carries only in some states (a pool), removed when they no longer apply.
_OPTIONAL_INDEX_ATTRIBUTES = ("GSI2PK", "GSI2SK")


class WorkerRepository(TableAccess):
    def _worker_item(self, worker: Worker) -> dict[str, Any]:
        return {
            **keys.worker_key(worker.id),
            **keys.worker_index_attributes(worker),
            **record_attributes(worker),
        }

    def find_worker(self, worker_id: str) -> Worker | None:
        return self._find(Worker, keys.worker_key(worker_id))

    def get_worker(self, worker_id: str) -> Worker:
        return self._fetch(Worker, keys.worker_key(worker_id), "worker", worker_id)

    def get_workers(self, worker_ids: Sequence[str]) -> list[Worker]:
        """Consistent reads of many workers; unknown ids are skipped."""
        return self._batch_get(Worker, [keys.worker_key(i) for i in worker_ids])

    def pool_active_instances(self, pool: str) -> int:
        """Active instances across the pool's workers, each worker read consistently.

        The index only says which workers belong to the pool; counts come from the items themselves,
        because a lagging index could hide the last instance ending and stall a pool drain.
        """
        worker_ids = [w.id for w in self.workers_in_pool(pool)]
        return sum(w.active_instances for w in self.get_workers(worker_ids))

    def workers_in_pool(self, pool: str) -> Iterator[Worker]:
        items = self._query_all(
            IndexName=BY_PARENT,
            KeyConditionExpression="GSI2PK = :p AND begins_with(GSI2SK, :w)",
            ExpressionAttributeValues={":p": {"S": f"POOL#{pool}"}, ":w": {"S": "WORKER#"}},
        )
        for item in items:
            yield load_record(Worker, item)

    def find_worker_by_ec2_instance(self, ec2_instance_id: str) -> Worker | None:
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

    def create_worker(self, worker: Worker, *, actor: str, reason: str | None = None) -> Worker:
        """Store a new worker; fails with Conflict if the id is taken (imports rely on that)."""
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

        self._transact(
            [self._put(self._worker_item(stored), "attribute_not_exists(PK)"), self._audit_put(audit)],
            {0: refuse},
            written=stored,
        )
        return stored

    def _worker_update(self, current: Worker, updated: Worker) -> dict[str, Any]:
        """Rewrite the record's attributes under `version = read AND status = read`, keeping bookkeeping."""
        item = self._worker_item(updated)
        key = keys.worker_key(current.id)
        names: dict[str, str] = {"#cv": "version", "#cs": "status"}
        values: dict[str, Any] = {
            ":cv": serialize_value(current.version),
            ":cs": serialize_value(str(current.status)),
        }
        sets: list[str] = []
        for n, (attribute, value) in enumerate(
            serialize({k: v for k, v in item.items() if k not in key}).items()
        ):
            names[f"#f{n}"] = attribute
            values[f":f{n}"] = value
            sets.append(f"#f{n} = :f{n}")
        removes: list[str] = []
        for n, attribute in enumerate(
            sorted((set(Worker.model_fields) | set(_OPTIONAL_INDEX_ATTRIBUTES)) - set(item))
        ):
            names[f"#r{n}"] = attribute
            removes.append(f"#r{n}")
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        return {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(key),
                "UpdateExpression": expression,
                "ConditionExpression": "#cv = :cv AND #cs = :cs",
                "ExpressionAttributeNames": names,
                "ExpressionAttributeValues": values,
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _save_worker(self, current: Worker, updated: Worker, audit: AuditEvent) -> Worker:
        stale = refuse_missing(
            "worker", current.id, lambda c: StaleWrite("worker", current.id, current_status(Worker, c))
        )
        self._transact(
            [self._worker_update(current, updated), self._audit_put(audit)], {0: stale}, written=updated
        )
        return updated

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
    ) -> Worker:
        """Move a worker read at `worker.version` to `target`, if the lifecycle table allows it."""
        check_transition(worker.status, target, cause)
        updated = validated_copy(
            worker,
            {**(changes or {}), "status": target, "version": worker.version + 1, "updated_at": utcnow()},
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
        return self._save_worker(worker, updated, audit)

    def update_worker(
        self,
        worker: Worker,
        changes: Mapping[str, Any],
        *,
        actor: str,
        action: str,
        reason: str | None = None,
    ) -> Worker:
        """Change fields other than status on a worker read at `worker.version`."""
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
        )
        return self._save_worker(worker, updated, audit)

    def list_workers(
        self,
        *,
        status: WorkerStatus | None = None,
        region: str | None = None,
        pool: str | None = None,
        template: str | None = None,
        limit: int = 50,
        next_token: str | None = None,
    ) -> Page[Worker]:
        """One page of workers, served from the narrowest index for the filters given."""
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

    def iter_workers_by_status(
        self, statuses: Iterable[WorkerStatus], *, region: str | None = None
    ) -> Iterator[Worker]:
        """Every worker in the given statuses, one status partition at a time (no table scan)."""
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
