"""The drain sweep's marks: what it last asked Step Functions about each open drain (domain/drain_sweep.py).

One small item per worker or pool that has had an open drain, beside its record: PK `WORKER#<id>` (or
`POOL#<name>`), SK `DRAINMARK`. It is bookkeeping, not part of the record: the sweep replaces it whole
without a condition (one sweep owns a drain: its shard's, under the shard's lease), so it never
conflicts with the drain's own conditional writes on the record. It expires a day after its last
write: an open drain's mark is rewritten every few minutes, and a lost mark only makes the next sweep
call Step Functions once more.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.drain_sweep import DrainKind, DrainMark
from fleetkeeper.store.codec import record_attributes, serialize
from fleetkeeper.store.schema import TTL_ATTRIBUTE
from fleetkeeper.store.table import TableAccess

MARK_SORT_KEY = "DRAINMARK"
MARK_LIFETIME = timedelta(days=1)
_PARTITION = {"worker": "WORKER#", "pool": "POOL#"}


def drain_mark_key(kind: DrainKind, key: str) -> dict[str, str]:
    return {"PK": _PARTITION[kind] + key, "SK": MARK_SORT_KEY}


class DrainMarkRepository(TableAccess):
    def drain_marks(
        self, subjects: Sequence[tuple[DrainKind, str]]
    ) -> dict[tuple[DrainKind, str], DrainMark]:
        """The marks of these drains, by (kind, key); a drain without one is left out."""
        found = self._batch_get(DrainMark, [drain_mark_key(kind, key) for kind, key in subjects])
        return {(mark.kind, mark.key): mark for mark in found}

    def put_drain_mark(self, mark: DrainMark, *, now: datetime) -> None:
        item = {
            **drain_mark_key(mark.kind, mark.key),
            **record_attributes(mark),
            TTL_ATTRIBUTE: int((now + MARK_LIFETIME).timestamp()),
        }
        with_backoff(
            lambda: self._client.put_item(TableName=self.table_name, Item=serialize(item)), name="PutItem"
        )
