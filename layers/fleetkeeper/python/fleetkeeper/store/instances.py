"""Instances: records and their state changes while they stay active.

Taking and freeing a worker's slot (placement, ending) lives in store/slots.py, next to the counter.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from fleetkeeper.domain.errors import Conflict, InvalidInput, NotFound, StaleWrite
from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus, check_instance_transition
from fleetkeeper.domain.models import AuditEvent, Instance, Worker, utcnow
from fleetkeeper.domain.sharding import bucket_of
from fleetkeeper.store import keys
from fleetkeeper.store.codec import load_record, record_attributes
from fleetkeeper.store.schema import BY_KIND, BY_PARENT, BY_STATUS
from fleetkeeper.store.table import Page, Refusal, TableAccess, current_status, refuse_missing, validated_copy


class InstanceRepository(TableAccess):
    def _instance_item(self, instance: Instance) -> dict[str, Any]:
        return {
            **keys.instance_key(instance.id),
            **keys.instance_index_attributes(instance, legacy=self.layout().legacy_writes),
            **record_attributes(instance),
        }

    def find_instance(self, instance_id: str) -> Instance | None:
        return self._find(Instance, keys.instance_key(instance_id))

    def get_instance(self, instance_id: str) -> Instance:
        return self._fetch(Instance, keys.instance_key(instance_id), "instance", instance_id)

    def _refuse_stale_instance(self, instance: Instance) -> Refusal:
        return refuse_missing(
            "instance",
            instance.id,
            lambda c: StaleWrite("instance", instance.id, current_status(Instance, c, "state")),
        )

    def update_instance(
        self,
        instance: Instance,
        changes: Mapping[str, Any],
        *,
        actor: str,
        action: str,
        reason: str | None = None,
        worker_in: Collection[WorkerStatus] | None = None,
    ) -> Instance:
        """Change an instance that stays active (no slot is taken or freed).

        With `worker_in`, the same transaction checks that the instance's worker is in one of those
        statuses, so a report can never keep an instance alive on a worker that is stopping or gone.
        """
        updated = validated_copy(
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
        items: list[dict[str, Any]] = [put, self._audit_put(audit)]
        refusals: dict[int, Refusal] = {0: self._refuse_stale_instance(instance)}
        if worker_in is not None:
            allowed = sorted(str(s) for s in worker_in)
            values = {f":w{n}": s for n, s in enumerate(allowed)}
            items.append(
                self._condition_check(
                    keys.worker_key(instance.worker_id),
                    f"#s IN ({', '.join(values)})",
                    values,
                    {"#s": "status"},
                )
            )
            refusals[2] = _refuse_worker_not_in(instance, allowed)
        self._transact(items, refusals, written=updated)
        return updated

    def list_instances(
        self,
        *,
        worker_id: str | None = None,
        state: InstanceState | None = None,
        limit: int = 50,
        next_token: str | None = None,
    ) -> Page[Instance]:
        """One page of instances: of a worker (its own partition of by_parent), in a state, or all.

        Once the table is migrated (store/layout.py) a state is split into write shards by the worker's
        bucket; the listing reads them one after another, after the state's legacy partition, which
        keeps instances written before the migration until the reconciler moves them.
        """
        if state is None and worker_id is not None:
            return self._page(
                Instance,
                limit,
                next_token,
                IndexName=BY_PARENT,
                KeyConditionExpression="GSI2PK = :pk AND begins_with(GSI2SK, :i)",
                ExpressionAttributeValues={":pk": {"S": f"WORKER#{worker_id}"}, ":i": {"S": "INSTANCE#"}},
            )
        if not self.layout().done:
            return self._legacy_instances(
                state=state, worker_id=worker_id, limit=limit, next_token=next_token
            )
        states = [state] if state is not None else list(InstanceState)
        queries: list[dict[str, Any]] = []
        for each in states:
            partitions = [keys.instance_state_partition(each, p) for p in range(keys.INDEX_PARTITIONS)]
            if worker_id is not None:
                partitions = [keys.instance_state_partition(each, keys.partition_of(bucket_of(worker_id)))]
            for partition in [keys.legacy_instance_state_partition(each), *partitions]:
                values: dict[str, Any] = {":pk": {"S": partition}}
                condition = "GSI1PK = :pk"
                if worker_id is not None:
                    values[":prefix"] = {"S": f"{worker_id}#"}
                    condition += " AND begins_with(GSI1SK, :prefix)"
                queries.append(
                    {
                        "IndexName": BY_STATUS,
                        "KeyConditionExpression": condition,
                        "ExpressionAttributeValues": values,
                    }
                )
        items, token = self._walk(limit, next_token, queries)
        return Page([load_record(Instance, i) for i in items], token)

    def _legacy_instances(
        self, *, state: InstanceState | None, worker_id: str | None, limit: int, next_token: str | None
    ) -> Page[Instance]:
        values: dict[str, Any] = {}
        if state is not None:
            values[":pk"] = {"S": keys.legacy_instance_state_partition(state)}
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
        values[":pk"] = {"S": keys.kind_partition("INSTANCE")}
        return self._page(
            Instance,
            limit,
            next_token,
            IndexName=BY_KIND,
            KeyConditionExpression="GSI3PK = :pk",
            ExpressionAttributeValues=values,
        )


def _refuse_worker_not_in(instance: Instance, allowed: list[str]) -> Refusal:
    def refuse(current: dict[str, Any] | None) -> Exception:
        if current is None:
            return NotFound("worker", instance.worker_id)
        status = current_status(Worker, current)
        return Conflict(
            "worker",
            instance.worker_id,
            status,
            f"worker {instance.worker_id} is {status}; instance {instance.id} on it accepts no state report "
            f"(only on a worker that is {' or '.join(allowed)})",
        )

    return refuse
