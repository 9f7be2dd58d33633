"""The audit trail: one partition per entity (`AUDIT#<entity>#<id>`), sort key time-ordered.

Reads go newest first, a page at a time. How long items are kept: store/retention.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.models import AuditEvent
from fleetkeeper.store import keys
from fleetkeeper.store.codec import decode_page_token, encode_page_token, load_record
from fleetkeeper.store.repository import Page

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

MAX_AUDIT_PAGE = 100


class AuditLog:
    """Reads one entity's audit trail, newest first."""

    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self.table_name = table_name

    def newest_first(
        self, entity: str, entity_id: str, *, limit: int = 50, next_token: str | None = None
    ) -> Page[AuditEvent]:
        if not 1 <= limit <= MAX_AUDIT_PAGE:
            raise InvalidInput("limit", f"must be between 1 and {MAX_AUDIT_PAGE}")
        query: dict[str, Any] = {
            "TableName": self.table_name,
            "KeyConditionExpression": "PK = :pk",
            "ExpressionAttributeValues": {":pk": {"S": keys.audit_partition(entity, entity_id)}},
            "ScanIndexForward": False,
            "Limit": limit,
        }
        start = decode_page_token(next_token)
        if start:
            # A token of another entity's trail would silently list that trail.
            if start.get("PK") != {"S": keys.audit_partition(entity, entity_id)}:
                raise InvalidInput("next_token", "belongs to another listing")
            query["ExclusiveStartKey"] = start
        response = self._client.query(**query)
        items = [load_record(AuditEvent, item) for item in response.get("Items", [])]
        return Page(items, encode_page_token(response.get("LastEvaluatedKey")))
