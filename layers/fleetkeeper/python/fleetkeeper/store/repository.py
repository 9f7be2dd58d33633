"""DynamoDB access for every entity. All writes are conditional; every transition carries its audit item.

Concurrency rules (docs/data-model.md explains them):
- A worker item is rewritten only when its `version` and `status` still match what the writer read.
- Placement and instance completion change `active_instances` with an atomic counter update inside a
  transaction guarded by the invariant they touch (RUNNING and below capacity; above zero), and bump the
  version, so a writer holding an older read of the worker loses instead of overwriting the count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from fleetkeeper.domain.errors import Conflict, InvalidInput, NotFound, StaleWrite
from fleetkeeper.domain.lifecycle import (
    ACCEPTS_INSTANCES,
    ACTIVE_INSTANCE_STATES,
    Cause,
    InstanceState,
    PoolStatus,
    WorkerStatus,
    check_instance_transition,
    check_pool_transition,
    check_transition,
)
from fleetkeeper.domain.models import AuditEvent, Instance, Pool, Worker, WorkerTemplate, utcnow
from fleetkeeper.store import keys
from fleetkeeper.store.codec import (
    decode_page_token,
    encode_page_token,
    load_record,
    record_attributes,
    serialize,
    serialize_value,
)
from fleetkeeper.store.schema import BY_EC2_INSTANCE, BY_KIND, BY_PARENT, BY_STATUS

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

# DynamoDB caps a TransactWriteItems call at 100 items; keep headroom for the audit item.
MAX_QUERY_PAGE = 1000


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_token: str | None


class TransactionFailed(Exception):
    """A transaction was cancelled; `reasons` lines up with the items that were sent."""

    def __init__(self, reasons: list[dict[str, Any]], cause: ClientError) -> None:
        super().__init__(str(cause))
        self.reasons = reasons

    def failed_condition(self, index: int) -> bool:
        return bool(index < len(self.reasons) and self.reasons[index].get("Code") == "ConditionalCheckFailed")

    def old_item(self, index: int) -> dict[str, Any] | None:
        if index < len(self.reasons):
            item = self.reasons[index].get("Item")
            return dict(item) if item else None
        return None


def _validated_copy(record: M, changes: Mapping[str, Any]) -> M:
    """Apply changes and validate the result, so a bad value never reaches the table."""
    data = record.model_dump()
    data.update(changes)
    try:
        return type(record).model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidInput(field, first["msg"]) from exc


class FleetStore:
    """Repository over the single fleetkeeper table."""

    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self.table_name = table_name

    # ---- low-level helpers -------------------------------------------------------------------

    def _get(self, key: Mapping[str, str]) -> dict[str, Any] | None:
        response = self._client.get_item(TableName=self.table_name, Key=serialize(key), ConsistentRead=True)
        item = response.get("Item")
        return dict(item) if item else None

    def _transact(self, items: Sequence[Mapping[str, Any]]) -> None:
        try:
            self._client.transact_write_items(TransactItems=list(items))  # type: ignore[arg-type]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "TransactionCanceledException":
                reasons = list(exc.response.get("CancellationReasons", []))
                raise TransactionFailed([dict(r) for r in reasons], exc) from exc
            raise

    def _put(
        self,
        item: dict[str, Any],
        condition: str,
        values: Mapping[str, Any] | None = None,
        names: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        put: dict[str, Any] = {
            "TableName": self.table_name,
            "Item": serialize(item),
            "ConditionExpression": condition,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if values:
            put["ExpressionAttributeValues"] = {k: serialize_value(v) for k, v in values.items()}
        if names:
            put["ExpressionAttributeNames"] = dict(names)
        return {"Put": put}

    def _audit_put(self, event: AuditEvent) -> dict[str, Any]:
        item = {**keys.audit_key(event), **record_attributes(event)}
        return {"Put": {"TableName": self.table_name, "Item": serialize(item)}}

    def _query(self, **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        response = self._client.query(TableName=self.table_name, **kwargs)
        return [dict(i) for i in response.get("Items", [])], response.get("LastEvaluatedKey")

    def _query_all(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        start: dict[str, Any] | None = None
        while True:
            if start:
                kwargs["ExclusiveStartKey"] = start
            items, start = self._query(**kwargs)
            yield from items
            if not start:
                return

    def _page(self, model: type[M], limit: int, next_token: str | None, **query: Any) -> Page[M]:
        if not 1 <= limit <= MAX_QUERY_PAGE:
            raise InvalidInput("limit", f"must be between 1 and {MAX_QUERY_PAGE}")
        start = decode_page_token(next_token, query)
        try:
            items, last = self._query(Limit=limit, **query, **({"ExclusiveStartKey": start} if start else {}))
        except ClientError as exc:
            # The token was checked against the query; should DynamoDB still refuse it as a start key,
            # that is the client's token, not our bug.
            if start and exc.response.get("Error", {}).get("Code") == "ValidationException":
                raise InvalidInput("next_token", "is not a token this API issued") from exc
            raise
        return Page([load_record(model, i) for i in items], encode_page_token(last, query))

    # ---- templates ---------------------------------------------------------------------------

    def find_template(self, name: str) -> WorkerTemplate | None:
        item = self._get(keys.template_key(name))
        return load_record(WorkerTemplate, item) if item else None

    def get_template(self, name: str) -> WorkerTemplate:
        template = self.find_template(name)
        if template is None:
            raise NotFound("template", name)
        return template

    def put_template(self, template: WorkerTemplate, *, actor: str) -> WorkerTemplate:
        """Create the template, or replace it if nobody changed it since `template.version` was read."""
        stored = template.model_copy(update={"version": template.version + 1})
        item = {
            **keys.template_key(template.name),
            **keys.template_index_attributes(stored),
            **record_attributes(stored),
        }
        if template.version == 0:
            put = self._put(item, "attribute_not_exists(PK)")
        else:
            put = self._put(item, "#v = :v", {":v": template.version}, {"#v": "version"})
        action = "TemplateCreated" if template.version == 0 else "TemplateUpdated"
        audit = AuditEvent(entity="template", entity_id=template.name, action=action, actor=actor)
        try:
            self._transact([put, self._audit_put(audit)])
        except TransactionFailed as failure:
            raise StaleWrite(
                "template",
                template.name,
                None,
                f"template '{template.name}' changed concurrently; read it again",
            ) from failure
        return stored

    def list_templates(self) -> list[WorkerTemplate]:
        items = self._query_all(
            IndexName=BY_KIND,
            KeyConditionExpression="GSI3PK = :k",
            ExpressionAttributeValues={":k": {"S": keys.kind_partition("TEMPLATE")}},
        )
        return [load_record(WorkerTemplate, i) for i in items]

    # ---- pools -------------------------------------------------------------------------------

    def find_pool(self, name: str) -> Pool | None:
        item = self._get(keys.pool_key(name))
        return load_record(Pool, item) if item else None

    def get_pool(self, name: str) -> Pool:
        pool = self.find_pool(name)
        if pool is None:
            raise NotFound("pool", name)
        return pool

    def list_pools(self) -> list[Pool]:
        items = self._query_all(
            IndexName=BY_KIND,
            KeyConditionExpression="GSI3PK = :k",
            ExpressionAttributeValues={":k": {"S": keys.kind_partition("POOL")}},
        )
        return [load_record(Pool, i) for i in items]

    def create_pool(self, pool: Pool, *, actor: str) -> Pool:
        stored = pool.model_copy(update={"version": 1})
        item = {**keys.pool_key(pool.name), **keys.pool_index_attributes(stored), **record_attributes(stored)}
        audit = AuditEvent(
            entity="pool", entity_id=pool.name, action="PoolCreated", actor=actor, to_status=str(pool.status)
        )
        try:
            self._transact([self._put(item, "attribute_not_exists(PK)"), self._audit_put(audit)])
        except TransactionFailed as failure:
            current = self.find_pool(pool.name)
            raise Conflict(
                "pool", pool.name, current.status if current else None, f"pool '{pool.name}' already exists"
            ) from failure
        return stored

    def save_pool(
        self,
        pool: Pool,
        changes: Mapping[str, Any],
        *,
        actor: str,
        action: str,
        reason: str | None = None,
    ) -> Pool:
        """Apply changes to a pool read at `pool.version`; a status change must be a legal move."""
        updated = _validated_copy(pool, {**changes, "version": pool.version + 1})
        if updated.status != pool.status:
            check_pool_transition(pool.status, updated.status)
        item = {
            **keys.pool_key(pool.name),
            **keys.pool_index_attributes(updated),
            **record_attributes(updated),
        }
        put = self._put(
            item,
            "#v = :v AND #s = :s",
            {":v": pool.version, ":s": str(pool.status)},
            {"#v": "version", "#s": "status"},
        )
        audit = AuditEvent(
            entity="pool",
            entity_id=pool.name,
            action=action,
            actor=actor,
            from_status=str(pool.status),
            to_status=str(updated.status),
            reason=reason,
        )
        try:
            self._transact([put, self._audit_put(audit)])
        except TransactionFailed as failure:
            old = failure.old_item(0)
            if old is None and failure.failed_condition(0):
                raise NotFound("pool", pool.name) from failure
            raise StaleWrite("pool", pool.name, load_record(Pool, old).status if old else None) from failure
        return updated

    def workers_in_pool(self, pool: str) -> Iterator[Worker]:
        items = self._query_all(
            IndexName=BY_PARENT,
            KeyConditionExpression="GSI2PK = :p AND begins_with(GSI2SK, :w)",
            ExpressionAttributeValues={":p": {"S": f"POOL#{pool}"}, ":w": {"S": "WORKER#"}},
        )
        for item in items:
            yield load_record(Worker, item)

    def pool_active_instances(self, pool: str) -> int:
        """Active instances across the pool's workers, each worker read consistently.

        The index only says which workers belong to the pool; counts come from the items themselves,
        because a lagging index could hide the last instance ending and stall a pool drain.
        """
        worker_ids = [w.id for w in self.workers_in_pool(pool)]
        return sum(w.active_instances for w in self.get_workers(worker_ids))

    # ---- workers -----------------------------------------------------------------------------

    def get_workers(self, worker_ids: Sequence[str]) -> list[Worker]:
        """Consistent reads of many workers, 100 per BatchGetItem; unknown ids are skipped."""
        found: list[Worker] = []
        for start in range(0, len(worker_ids), 100):
            pending: dict[str, Any] = {
                self.table_name: {
                    "Keys": [serialize(keys.worker_key(i)) for i in worker_ids[start : start + 100]],
                    "ConsistentRead": True,
                }
            }
            while pending:
                response = self._client.batch_get_item(RequestItems=pending)
                found.extend(
                    load_record(Worker, item) for item in response["Responses"].get(self.table_name, [])
                )
                pending = dict(response.get("UnprocessedKeys") or {})
        return found

    def _worker_item(self, worker: Worker) -> dict[str, Any]:
        return {
            **keys.worker_key(worker.id),
            **keys.worker_index_attributes(worker),
            **record_attributes(worker),
        }

    def find_worker(self, worker_id: str) -> Worker | None:
        item = self._get(keys.worker_key(worker_id))
        return load_record(Worker, item) if item else None

    def get_worker(self, worker_id: str) -> Worker:
        worker = self.find_worker(worker_id)
        if worker is None:
            raise NotFound("worker", worker_id)
        return worker

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
        try:
            self._transact(
                [self._put(self._worker_item(stored), "attribute_not_exists(PK)"), self._audit_put(audit)]
            )
        except TransactionFailed as failure:
            old = failure.old_item(0)
            current = load_record(Worker, old).status if old else None
            raise Conflict("worker", worker.id, current, f"worker '{worker.id}' already exists") from failure
        return stored

    def _save_worker(self, current: Worker, updated: Worker, audit: AuditEvent) -> Worker:
        put = self._put(
            self._worker_item(updated),
            "#v = :v AND #s = :s",
            {":v": current.version, ":s": str(current.status)},
            {"#v": "version", "#s": "status"},
        )
        try:
            self._transact([put, self._audit_put(audit)])
        except TransactionFailed as failure:
            old = failure.old_item(0)
            if old is None and failure.failed_condition(0):
                raise NotFound("worker", current.id) from failure
            # A cancellation without a failed condition (a concurrent transaction, throttling) is a race too.
            raise StaleWrite(
                "worker", current.id, load_record(Worker, old).status if old else None
            ) from failure
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
        updated = _validated_copy(
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
        updated = _validated_copy(worker, {**changes, "version": worker.version + 1, "updated_at": utcnow()})
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

    # ---- instances ---------------------------------------------------------------------------

    def _instance_item(self, instance: Instance) -> dict[str, Any]:
        return {
            **keys.instance_key(instance.id),
            **keys.instance_index_attributes(instance),
            **record_attributes(instance),
        }

    def find_instance(self, instance_id: str) -> Instance | None:
        item = self._get(keys.instance_key(instance_id))
        return load_record(Instance, item) if item else None

    def get_instance(self, instance_id: str) -> Instance:
        instance = self.find_instance(instance_id)
        if instance is None:
            raise NotFound("instance", instance_id)
        return instance

    def place_instance(self, instance: Instance, worker: Worker, *, actor: str) -> Instance:
        """Put the instance and take a slot on its worker, in one transaction.

        The worker must be RUNNING with a free slot, and its pool (if any) active. Because a drain
        start rewrites the same worker item, a placement and a drain can never both win.
        """
        now = utcnow()
        stored = instance.model_copy(
            update={
                "worker_id": worker.id,
                "pool": worker.pool,
                "template": worker.template,
                "state": InstanceState.SCHEDULED,
                "version": 1,
                "created_at": now,
                "updated_at": now,
            }
        )
        take_slot = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(worker.id)),
                "UpdateExpression": "SET active_instances = active_instances + :one, "
                "#v = #v + :one, updated_at = :now",
                "ConditionExpression": "#s = :running AND active_instances < #cap",
                "ExpressionAttributeNames": {"#s": "status", "#v": "version", "#cap": "capacity"},
                "ExpressionAttributeValues": {
                    ":one": {"N": "1"},
                    ":running": {"S": str(ACCEPTS_INSTANCES)},
                    ":now": {"S": now.isoformat()},
                },
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }
        items: list[dict[str, Any]] = [
            self._put(self._instance_item(stored), "attribute_not_exists(PK)"),
            take_slot,
            self._audit_put(
                AuditEvent(
                    entity="instance",
                    entity_id=stored.id,
                    action="InstancePlaced",
                    actor=actor,
                    to_status=str(stored.state),
                    details={"worker_id": worker.id},
                )
            ),
        ]
        if worker.pool:
            items.append(
                {
                    "ConditionCheck": {
                        "TableName": self.table_name,
                        "Key": serialize(keys.pool_key(worker.pool)),
                        "ConditionExpression": "#s = :active",
                        "ExpressionAttributeNames": {"#s": "status"},
                        "ExpressionAttributeValues": {":active": {"S": str(PoolStatus.ACTIVE)}},
                        "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
                    }
                }
            )
        try:
            self._transact(items)
        except TransactionFailed as failure:
            raise self._placement_refusal(failure, stored, worker) from failure
        return stored

    def _placement_refusal(self, failure: TransactionFailed, instance: Instance, worker: Worker) -> Exception:
        if failure.failed_condition(0):
            return Conflict("instance", instance.id, None, f"instance '{instance.id}' already exists")
        if failure.failed_condition(1):
            old = failure.old_item(1)
            if old is None:
                return NotFound("worker", worker.id)
            current = load_record(Worker, old)
            if current.status != ACCEPTS_INSTANCES:
                return Conflict(
                    "worker",
                    worker.id,
                    current.status,
                    f"worker {worker.id} is {current.status}; only RUNNING workers accept instances",
                )
            return Conflict(
                "worker",
                worker.id,
                current.status,
                f"worker {worker.id} is full ({current.active_instances}/{current.capacity})",
            )
        if failure.failed_condition(3):
            old = failure.old_item(3)
            status = str(load_record(Pool, old).status) if old else None
            return Conflict(
                "pool",
                worker.pool or "",
                status,
                f"pool {worker.pool} is {status or 'missing'}; it accepts no instances",
            )
        return Conflict("worker", worker.id, None, "placement was cancelled; try again")

    def update_instance(
        self,
        instance: Instance,
        changes: Mapping[str, Any],
        *,
        actor: str,
        action: str,
        reason: str | None = None,
    ) -> Instance:
        """Change an instance that stays active (no slot is taken or freed)."""
        updated = _validated_copy(
            instance, {**changes, "version": instance.version + 1, "updated_at": utcnow()}
        )
        if updated.state != instance.state:
            check_instance_transition(instance.state, updated.state)
        if not updated.is_active:
            raise InvalidInput("state", "ending an instance goes through end_instance")
        put = self._put(self._instance_item(updated), "#v = :v", {":v": instance.version}, {"#v": "version"})
        audit = AuditEvent(
            entity="instance",
            entity_id=instance.id,
            action=action,
            actor=actor,
            from_status=str(instance.state),
            to_status=str(updated.state),
            reason=reason,
        )
        try:
            self._transact([put, self._audit_put(audit)])
        except TransactionFailed as failure:
            old = failure.old_item(0)
            raise StaleWrite(
                "instance", instance.id, str(load_record(Instance, old).state) if old else None
            ) from failure
        return updated

    def end_instance(
        self, instance: Instance, target: InstanceState, *, actor: str, reason: str | None = None
    ) -> Instance:
        """End an active instance and free its slot on the worker, atomically and only once."""
        if target in ACTIVE_INSTANCE_STATES:
            raise InvalidInput("state", f"{target} is not an ending state")
        check_instance_transition(instance.state, target)
        updated = _validated_copy(
            instance,
            {"state": target, "reason": reason, "version": instance.version + 1, "updated_at": utcnow()},
        )
        active_values = {f":a{i}": str(s) for i, s in enumerate(sorted(ACTIVE_INSTANCE_STATES))}
        end = self._put(
            self._instance_item(updated),
            f"#v = :v AND #st IN ({', '.join(active_values)})",
            {":v": instance.version, **active_values},
            {"#v": "version", "#st": "state"},
        )
        free_slot = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.worker_key(instance.worker_id)),
                "UpdateExpression": "SET active_instances = active_instances - :one, #v = #v + :one, "
                "updated_at = :now",
                "ConditionExpression": "active_instances > :zero",
                "ExpressionAttributeNames": {"#v": "version"},
                "ExpressionAttributeValues": {
                    ":one": {"N": "1"},
                    ":zero": {"N": "0"},
                    ":now": {"S": utcnow().isoformat()},
                },
            }
        }
        audit = self._audit_put(
            AuditEvent(
                entity="instance",
                entity_id=instance.id,
                action=f"Instance{target.title()}",
                actor=actor,
                from_status=str(instance.state),
                to_status=str(target),
                reason=reason,
                details={"worker_id": instance.worker_id},
            )
        )
        try:
            self._transact([end, free_slot, audit])
        except TransactionFailed as failure:
            if failure.failed_condition(0):
                old = failure.old_item(0)
                state = str(load_record(Instance, old).state) if old else None
                raise StaleWrite("instance", instance.id, state) from failure
            if not failure.failed_condition(1):
                raise StaleWrite("instance", instance.id, str(instance.state)) from failure
            # The worker's counter is already at zero (or the worker is gone): end the instance anyway
            # rather than leave it active forever, and say so in its audit record.
            self._transact(
                [
                    end,
                    self._audit_put(
                        AuditEvent(
                            entity="instance",
                            entity_id=instance.id,
                            action=f"Instance{target.title()}",
                            actor=actor,
                            from_status=str(instance.state),
                            to_status=str(target),
                            reason=reason,
                            details={
                                "worker_id": instance.worker_id,
                                "counter": "worker had no slot to free",
                            },
                        )
                    ),
                ]
            )
        return updated

    def list_instances(
        self,
        *,
        worker_id: str | None = None,
        state: InstanceState | None = None,
        limit: int = 50,
        next_token: str | None = None,
    ) -> Page[Instance]:
        values: dict[str, Any] = {}
        if state is not None:
            values[":pk"] = {"S": keys.instance_state_partition(state)}
            condition = "GSI1PK = :pk"
            if worker_id is not None:
                values[":prefix"] = {"S": f"{worker_id}#"}
                condition += " AND begins_with(GSI1SK, :prefix)"
            return self._page(
                Instance,
                limit,
                next_token,
                IndexName=BY_STATUS,
                KeyConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        if worker_id is not None:
            values[":pk"] = {"S": f"WORKER#{worker_id}"}
            values[":i"] = {"S": "INSTANCE#"}
            return self._page(
                Instance,
                limit,
                next_token,
                IndexName=BY_PARENT,
                KeyConditionExpression="GSI2PK = :pk AND begins_with(GSI2SK, :i)",
                ExpressionAttributeValues=values,
            )
        values[":pk"] = {"S": keys.kind_partition("INSTANCE")}
        return self._page(
            Instance,
            limit,
            next_token,
            IndexName=BY_KIND,
            KeyConditionExpression="GSI3PK = :pk",
            ExpressionAttributeValues=values,
        )

    def active_instances_of(self, worker_id: str) -> list[Instance]:
        """The worker's instances that still hold a slot, read consistently from their items."""
        items = self._query_all(
            IndexName=BY_PARENT,
            KeyConditionExpression="GSI2PK = :pk AND begins_with(GSI2SK, :i)",
            ExpressionAttributeValues={":pk": {"S": f"WORKER#{worker_id}"}, ":i": {"S": "INSTANCE#"}},
        )
        active = []
        for item in items:
            candidate = load_record(Instance, item)
            if candidate.is_active:
                # The index may lag; the item itself is the truth.
                fresh = self.find_instance(candidate.id)
                if fresh is not None and fresh.is_active:
                    active.append(fresh)
        return active

    # ---- audit -------------------------------------------------------------------------------

    def audit_trail(self, entity: str, entity_id: str) -> list[AuditEvent]:
        """Every audit event of one entity, oldest first."""
        items = self._query_all(
            KeyConditionExpression="PK = :pk",
            ExpressionAttributeValues={":pk": {"S": keys.audit_partition(entity, entity_id)}},
            ConsistentRead=True,
        )
        return [load_record(AuditEvent, i) for i in items]
