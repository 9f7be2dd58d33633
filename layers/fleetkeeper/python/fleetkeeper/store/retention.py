"""How long audit items are kept: the table's TTL attribute, from the stage's AUDIT_RETENTION_DAYS.

DynamoDB deletes an item some time after its TTL passes (usually within days), so a trail may show
events slightly older than the retention; never younger ones missing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fleetkeeper.store.schema import TTL_ATTRIBUTE


def audit_expiration(at: datetime, retention_days: int | None) -> dict[str, Any]:
    """The TTL attribute of an audit item written at `at`; none when the trail is kept forever."""
    if not retention_days or retention_days <= 0:
        return {}
    return {TTL_ATTRIBUTE: int((at + timedelta(days=retention_days)).timestamp())}
