"""Templates and pools: versioned records, each write carrying its audit item."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetkeeper.domain.errors import Conflict, StaleWrite
from fleetkeeper.domain.lifecycle import check_pool_transition
from fleetkeeper.domain.models import AuditEvent, Pool, WorkerTemplate
from fleetkeeper.store import keys
from fleetkeeper.store.codec import load_record, record_attributes
from fleetkeeper.store.schema import BY_KIND
from fleetkeeper.store.table import TableAccess, current_status, refuse_missing, validated_copy


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
            entity="pool", entity_id=pool.name, action="PoolCreated", actor=actor, to_status=str(pool.status)
        )

        def refuse(current: dict[str, Any] | None) -> Exception:
            status = current_status(Pool, current) if current else None
            return Conflict("pool", pool.name, status, f"pool '{pool.name}' already exists")

        self._transact(
            [self._put(item, "attribute_not_exists(PK)"), self._audit_put(audit)], {0: refuse}, written=stored
        )
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
        )
        stale = refuse_missing(
            "pool", pool.name, lambda c: StaleWrite("pool", pool.name, current_status(Pool, c))
        )
        self._transact([put, self._audit_put(audit)], {0: stale}, written=updated)
        return updated
