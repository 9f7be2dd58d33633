"""How long items are kept: the table's TTL attribute, from the stage's retention settings.

- Audit items expire `AUDIT_RETENTION_DAYS` after they were written.
- Worker operations expire `OPERATION_RETENTION_DAYS` after they finished: an operation still PENDING
  or RUNNING carries no TTL, so it can never expire under the reconciler or a drain that waits on it.
  Their audit items (and the worker's `WorkerSystemInfoCollected`, the result of the hourly
  collect-system-info operation) follow the same retention, or the audit retention if that is shorter:
  a steady fleet writes them every hour for every worker, and keeping them as long as the rest of the
  trail would make them most of the table.

0 keeps items forever. DynamoDB deletes an item some time after its TTL passes (usually within days),
so a trail may show events slightly older than the retention; never younger ones missing.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Final

from fleetkeeper.domain.models import AuditEvent
from fleetkeeper.store.schema import TTL_ATTRIBUTE

# The audit actions that record a worker operation's life, and so share its retention.
OPERATION_ACTIONS: Final = frozenset(
    {
        "OperationRequested",
        "OperationSucceeded",
        "OperationFailed",
        "OperationAttemptFailed",
        "OperationCancelled",
        "OperationLockReleased",
        "WorkerSystemInfoCollected",
    }
)


def expiration(at: datetime, retention_days: int | None) -> dict[str, Any]:
    """The TTL attribute of an item kept `retention_days` after `at`; none when it is kept forever."""
    if not retention_days or retention_days <= 0:
        return {}
    return {TTL_ATTRIBUTE: int((at + timedelta(days=retention_days)).timestamp())}


def audit_kept_days(event: AuditEvent, audit_days: int | None, operation_days: int | None) -> int | None:
    """The days an audit item is kept: an operation's events the shorter of both retentions (0 or None
    meaning forever), every other event the audit retention."""
    if event.action not in OPERATION_ACTIONS:
        return audit_days
    kept = [days for days in (audit_days, operation_days) if days and days > 0]
    return min(kept) if kept else None
