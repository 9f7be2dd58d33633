"""Which worker an EC2 instance is: one item per recorded machine, keyed by its instance id.

An EC2 event names only an instance id, and most events in an account are about machines fleetkeeper
does not manage. The item `EC2#<instance id>` / `WORKER` names the worker that recorded the machine, so
one strongly consistent GetItem tells ours from foreign ones: no index (eventually consistent), no
DescribeInstances, no write. It is written in the same transaction as the worker write that records the
machine (store/workers.py: a launch, an adoption, an import), so it exists exactly when the worker holds
the id. It is never deleted, like the worker; a worker that moved to another machine keeps the old item,
which the lookup ignores because the worker no longer holds that id.

Tables written before these items existed are backfilled by discovery, region by region, from the
workers it reads anyway (services/discovery.py). Until a region is done, a machine without an item is
looked up in the `by_ec2_instance` index as before. A region is done after a pass that started more than
MIGRATION_SETTLE after the first one, since an invocation of the previous version (the longest Lambda
runs 15 minutes) may record a machine without its item until then.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.models import Worker
from fleetkeeper.store import keys
from fleetkeeper.store.codec import deserialize, serialize
from fleetkeeper.store.table import TableAccess

MIGRATION_SETTLE = timedelta(minutes=15)
# Key items put per TransactWriteItems (at most 100, and 4 MB; these items are tiny).
_PUTS_PER_WRITE = 50
# (table, region) pairs known to be backfilled: a region once done stays done, so each process reads
# its marker once.
_MIGRATED: set[tuple[str, str]] = set()
_MIGRATED_LOCK = threading.Lock()


def migration_key(region: str) -> dict[str, str]:
    return {"PK": "MIGRATION#ec2-instance-keys", "SK": region}


def machine_key_item(worker: Worker) -> dict[str, Any] | None:
    """The item naming this worker as its machine's, or None while it has no machine."""
    if not worker.ec2_instance_id:
        return None
    return {**keys.ec2_instance_key(worker.ec2_instance_id), "worker_id": worker.id, "region": worker.region}


class MachineKeyRepository(TableAccess):
    def machine_key_put(self, worker: Worker) -> list[dict[str, Any]]:
        """The transaction item that records the worker's machine key: none while it has no machine."""
        item = machine_key_item(worker)
        return [{"Put": {"TableName": self.table_name, "Item": serialize(item)}}] if item else []

    def worker_id_of_machine(self, instance_id: str) -> str | None:
        """The worker that recorded this instance, by its key item (one strongly consistent GetItem)."""
        item = self._get(keys.ec2_instance_key(instance_id))
        return str(deserialize(item)["worker_id"]) if item else None

    # ---- backfill of tables written before the items existed -----------------------------------------

    def machine_keys_migrated(self, region: str) -> bool:
        """Whether every machine of the region recorded before the items existed has its item."""
        with _MIGRATED_LOCK:
            if (self.table_name, region) in _MIGRATED:
                return True
        item = self._get(migration_key(region))
        done = bool(item and deserialize(item).get("done"))
        if done:
            with _MIGRATED_LOCK:
                _MIGRATED.add((self.table_name, region))
        return done

    def backfill_machine_keys(self, region: str, workers: Iterable[Worker], *, now: datetime) -> int:
        """One backfill pass over the region's workers (discovery's); the number of items written, 0 once
        the region is done."""
        if self.machine_keys_migrated(region):
            return 0
        state = self._get(migration_key(region))
        first_pass = deserialize(state).get("first_pass_at") if state else None
        # A worker that changed status while discovery read the status index is listed twice, and
        # DynamoDB refuses a whole transaction that touches one item twice: each machine's item once.
        unique = {item["PK"]: item for item in map(machine_key_item, workers) if item is not None}
        items = list(unique.values())
        self._put_all(items)
        marker: dict[str, Any] = {**migration_key(region), "first_pass_at": first_pass or now.isoformat()}
        if first_pass is not None and now - datetime.fromisoformat(str(first_pass)) >= MIGRATION_SETTLE:
            marker["done"] = True
        with_backoff(
            lambda: self._client.put_item(TableName=self.table_name, Item=serialize(marker)), name="PutItem"
        )
        return len(items)

    def _put_all(self, items: list[dict[str, Any]]) -> None:
        """Put the items, in transactions of _PUTS_PER_WRITE: the roles may put items, and a transaction
        needs no other permission (BatchWriteItem would)."""
        for start in range(0, len(items), _PUTS_PER_WRITE):
            puts = [
                {"Put": {"TableName": self.table_name, "Item": serialize(item)}}
                for item in items[start : start + _PUTS_PER_WRITE]
            ]
            self._transact(puts, {})
