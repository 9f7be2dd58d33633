"""The audit trail: one partition per entity (`AUDIT#<entity>#<id>`), its sort key ordered by time.

Audit items are written inside the transactions that change the entity; how long they are kept is
store/retention.py.
"""

from __future__ import annotations

from fleetkeeper.domain.models import AuditEvent
from fleetkeeper.store import keys
from fleetkeeper.store.codec import load_record
from fleetkeeper.store.table import Page, TableAccess

MAX_AUDIT_PAGE = 100


class AuditRepository(TableAccess):
    def audit_trail(self, entity: str, entity_id: str) -> list[AuditEvent]:
        """Every audit event of one entity, oldest first."""
        items = self._query_all(
            KeyConditionExpression="PK = :pk",
            ExpressionAttributeValues={":pk": {"S": keys.audit_partition(entity, entity_id)}},
            ConsistentRead=True,
        )
        return [load_record(AuditEvent, i) for i in items]

    def audit_page(
        self, entity: str, entity_id: str, *, limit: int = 50, next_token: str | None = None
    ) -> Page[AuditEvent]:
        """One page of one entity's trail, newest first; a token of another trail is refused."""
        return self._page(
            AuditEvent,
            min(limit, MAX_AUDIT_PAGE),
            next_token,
            KeyConditionExpression="PK = :pk",
            ExpressionAttributeValues={":pk": {"S": keys.audit_partition(entity, entity_id)}},
            ScanIndexForward=False,
        )
