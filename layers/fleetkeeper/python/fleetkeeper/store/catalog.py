"""Templates and pools: versioned records, each write carrying its audit item.

A pool's status is also kept in POOL_GATES gate items (`POOLGATE#<pool>#<n>`), written in the same
transaction as every write of the pool, under the pool's own version condition, so they never
disagree with it. A placement checks the gate of its worker's write shard rather than the pool item:
every placement into a pool checking one item would make that item the hottest key of the table
(docs/data-model.md). A pool drain still excludes every placement: it rewrites every gate in the
transaction that closes the pool, and a placement conditioned on its gate serialises on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetkeeper.domain.disruption import DisruptionPolicy
from fleetkeeper.domain.errors import BookingsWaiting, Conflict, StaleWrite
from fleetkeeper.domain.lifecycle import check_pool_transition
from fleetkeeper.domain.models import AuditEvent, Pool, WorkerTemplate
from fleetkeeper.store import keys
from fleetkeeper.store.capacity import BOOKINGS_WAITING, members_key
from fleetkeeper.store.codec import load_record, record_attributes, serialize
from fleetkeeper.store.schema import BY_KIND
from fleetkeeper.store.table import Refusal, TableAccess, current_status, refuse_missing, validated_copy


class CatalogRepository(TableAccess):
    # ---- templates ---------------------------------------------------------------------------

    def find_template(self, name: str) -> WorkerTemplate | None:
        return self._find(WorkerTemplate, keys.template_key(name))

    def get_template(self, name: str) -> WorkerTemplate:
        return self._fetch(WorkerTemplate, keys.template_key(name), "template", name)

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

        def refuse(_: dict[str, Any] | None) -> Exception:
            return StaleWrite(
                "template",
                template.name,
                None,
                f"template '{template.name}' changed concurrently; read it again",
            )

        self._transact([put, self._audit_put(audit)], {0: refuse}, written=stored)
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
        return self._find(Pool, keys.pool_key(name))

    def get_pool(self, name: str) -> Pool:
        return self._fetch(Pool, keys.pool_key(name), "pool", name)

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
            entity="pool",
            entity_id=pool.name,
            action="PoolCreated",
            actor=actor,
            to_status=str(pool.status),
            details=_budget_details(None, stored),
        )

        def refuse(current: dict[str, Any] | None) -> Exception:
            status = current_status(Pool, current) if current else None
            return Conflict("pool", pool.name, status, f"pool '{pool.name}' already exists")

        self._transact(
            [self._put(item, "attribute_not_exists(PK)"), self._audit_put(audit), *self._gate_puts(stored)],
            {0: refuse},
            written=stored,
        )
        return stored

    def _gate_puts(self, pool: Pool) -> list[dict[str, Any]]:
        """The pool's gates as the pool now is; unconditional, so always in a transaction with a
        condition on the pool item's version."""
        return [
            {
                "Put": {
                    "TableName": self.table_name,
                    "Item": serialize(
                        {
                            **keys.pool_gate_key(pool.name, gate),
                            "pool": pool.name,
                            "status": str(pool.status),
                            "pool_version": pool.version,
                        }
                    ),
                }
            }
            for gate in range(keys.POOL_GATES)
        ]

    def pools_without_gates(self, pools: list[Pool]) -> list[Pool]:
        """The pools whose gates are missing or behind the pool (written by an earlier release)."""
        items = self._batch_get_items([keys.pool_gate_key(p.name, 0) for p in pools])
        gated = {str(i["pool"]["S"]): int(i["pool_version"]["N"]) for i in items}
        return [p for p in pools if gated.get(p.name) != p.version]

    def gate_pool(self, pool: Pool) -> bool:
        """Write the gates of a pool read at `pool.version`; False when the pool changed meanwhile (its
        own write then wrote them)."""
        check = self._condition_check(
            keys.pool_key(pool.name), "#v = :v", {":v": pool.version}, {"#v": "version"}
        )
        try:
            self._transact(
                [check, *self._gate_puts(pool)], {0: lambda _: StaleWrite("pool", pool.name, None)}
            )
        except StaleWrite:
            return False
        return True

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
        updated = validated_copy(pool, {**changes, "version": pool.version + 1})
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
            details=_budget_details(pool, updated),
        )
        stale = refuse_missing(
            "pool", pool.name, lambda c: StaleWrite("pool", pool.name, current_status(Pool, c))
        )
        items = [put, self._audit_put(audit), *self._gate_puts(updated)]
        refusals: dict[int, Refusal] = {0: stale}
        if pool.capacity.bookings and not updated.capacity.bookings:
            # Exact with the booking's own check of the pool's flag (store/slots.book_instance): either
            # the booking commits first and this write is refused, or this one does and the booking is.
            refusals[len(items)] = lambda _: BookingsWaiting(pool.name)
            items.append(
                self._condition_check(
                    members_key(pool.name),
                    "attribute_not_exists(#b) OR #b = :none",
                    {":none": 0},
                    {"#b": BOOKINGS_WAITING},
                )
            )
        self._transact(items, refusals, written=updated)
        return updated


def _budget_details(before: Pool | None, after: Pool) -> dict[str, str | int | None]:
    """A write that sets a pool's budgets says what they became: with the pool's audit trail in version
    order, which budgets any version of the pool had."""
    if after.disruption == (before.disruption if before is not None else DisruptionPolicy()):
        return {}
    return {"disruption": after.disruption.model_dump_json(exclude_none=True)}
