"""The audit trail: one partition per entity, written inside the transactions that change it."""

from __future__ import annotations

from fleetkeeper.domain.models import AuditEvent
from fleetkeeper.store import keys
from fleetkeeper.store.codec import load_record
from fleetkeeper.store.table import TableAccess


class AuditRepository(TableAccess):
    def audit_trail(self, entity: str, entity_id: str) -> list[AuditEvent]:
        """Every audit event of one entity, oldest first."""
        items = self._query_all(
            KeyConditionExpression="PK = :pk",
            ExpressionAttributeValues={":pk": {"S": keys.audit_partition(entity, entity_id)}},
            ConsistentRead=True,
        )
        return [load_record(AuditEvent, i) for i in items]
