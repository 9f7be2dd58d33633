"""The store's side of migrating a table to the bucket layout (store/layout.py; the reconciler drives it
from services/layout.py).

Every step is one conditional write per item, safe to repeat and to race with any other writer:
- counting a worker: its bucket and bucket-index attributes set and its count added, under the
  condition that it is still the version read and counted where it was read (not at all, or in a cell
  an earlier release's write left behind). The version is not bumped: nothing of the record changes,
  so no other writer loses a race to the migration;
- cleaning a worker (once the migration is done): the same, and its legacy index attributes removed;
- re-keying an instance: its state key moved to the write-sharded one, under its version;
- gating a pool: its gates written under the pool's version (store/catalog.py).
A step whose condition fails is counted as refused and left for the next pass.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import ClientError

from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.models import Instance, Worker
from fleetkeeper.store import keys
from fleetkeeper.store.codec import deserialize, load_record, serialize, serialize_value
from fleetkeeper.store.counters import COUNTED_AS, counter_updates, moves
from fleetkeeper.store.layout import LAYOUT_KEY, LayoutState, read_layout_state
from fleetkeeper.store.schema import BY_KIND, BY_POOL, BY_SHARD
from fleetkeeper.store.table import TableAccess, put_next_version

# What DynamoDB answers for an index that is not there yet, still backfilling, or not granted yet.
_NOT_READY = frozenset({"ValidationException", "ResourceNotFoundException", "AccessDeniedException"})
_INSTANCE_LEGACY = ("GSI3PK", "GSI3SK")


class MigrationRepository(TableAccess):
    def layout_state(self) -> LayoutState:
        return read_layout_state(self._client, self.table_name)

    def save_layout_state(self, current: LayoutState, changed: LayoutState) -> LayoutState:
        """Write the next version of the marker; StaleWrite if another cycle wrote it first."""
        stored = changed.model_copy(update={"version": current.version + 1})
        put_next_version(
            self._client,
            self.table_name,
            {**LAYOUT_KEY, **stored.model_dump(mode="json", exclude_none=True)},
            expected_version=current.version,
            stale=lambda: StaleWrite("layout", "table", None, "another cycle wrote the layout marker first"),
        )
        self._layout.forget()
        return stored

    def bucket_indexes_ready(self) -> bool:
        """Whether by_shard and by_pool exist and answer (an index being created refuses reads)."""
        for index, partition in ((BY_SHARD, "GSI4PK"), (BY_POOL, "GSI5PK")):
            try:
                self._query(
                    IndexName=index,
                    KeyConditionExpression=f"{partition} = :p",
                    ExpressionAttributeValues={":p": {"S": "probe"}},
                    Limit=1,
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in _NOT_READY:
                    return False
                raise
        return True

    def legacy_page(
        self, kind: str, cursor: str | None, limit: int
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the legacy listing of a kind (`KIND#WORKER`, `KIND#INSTANCE`) from a cursor."""
        start = serialize(json.loads(cursor)) if cursor else None
        items, last = self._query(
            IndexName=BY_KIND,
            KeyConditionExpression="GSI3PK = :k",
            ExpressionAttributeValues={":k": {"S": keys.kind_partition(kind)}},
            Limit=limit,
            **({"ExclusiveStartKey": start} if start else {}),
        )
        return items, json.dumps(deserialize(last), sort_keys=True) if last else None

    def relayout_worker(self, entry: dict[str, Any], *, legacy: bool) -> str:
        """Bring one worker item to the bucket layout (keeping the legacy attributes with `legacy`) and
        count it where it belongs: `changed`, `unchanged` (nothing to do) or `refused` (it was written
        meanwhile; the next pass looks again).

        `entry` is the worker's entry in the legacy listing (the whole item, as the index has it): one
        that shows nothing to do costs no read of the item, so a pass that confirms a migrated table
        reads the listing only."""
        if _relayout(entry, legacy=legacy) is None:
            return "unchanged"
        raw = self._get(keys.worker_key(str(entry["id"]["S"])))
        items = relayout_items(self.table_name, raw, legacy=legacy) if raw is not None else None
        if items is None:
            return "unchanged"
        return self._try(items)

    def rekey_instance(self, entry: dict[str, Any]) -> str:
        """Move one instance from the legacy state and kind partitions to the write-sharded state key:
        `changed` or `refused` (it was written meanwhile, and that write re-keyed it)."""
        instance = load_record(Instance, entry)
        attributes = keys.instance_index_attributes(instance)
        update = {
            "Update": {
                "TableName": self.table_name,
                "Key": serialize(keys.instance_key(instance.id)),
                "UpdateExpression": "SET #pk = :pk, #sk = :sk REMOVE #kpk, #ksk",
                "ConditionExpression": "#v = :v",
                "ExpressionAttributeNames": {
                    "#pk": "GSI1PK",
                    "#sk": "GSI1SK",
                    "#kpk": _INSTANCE_LEGACY[0],
                    "#ksk": _INSTANCE_LEGACY[1],
                    "#v": "version",
                },
                "ExpressionAttributeValues": {
                    ":pk": {"S": attributes["GSI1PK"]},
                    ":sk": {"S": attributes["GSI1SK"]},
                    ":v": serialize_value(instance.version),
                },
            }
        }
        return self._try([update])

    def _try(self, items: Sequence[dict[str, Any]]) -> str:
        return "changed" if self._transact_unless_refused(items) else "refused"


def relayout_items(table_name: str, raw: dict[str, Any], *, legacy: bool) -> list[dict[str, Any]] | None:
    """The transaction that brings a worker item (read strongly consistent) to the bucket layout and
    counts it in the cell it belongs in (keys.counted_cell), under the condition that it is still the
    version read and counted where it was read; None when it is already there."""
    change = _relayout(raw, legacy=legacy)
    if change is None:
        return None
    worker, counted, wanted, stale = change
    worker_id = worker.id
    cell = str(wanted[COUNTED_AS])
    names: dict[str, str] = {"#v": "version", "#ca": COUNTED_AS}
    values: dict[str, Any] = {":v": serialize_value(worker.version)}
    sets = []
    for n, (name, value) in enumerate(wanted.items()):
        names[f"#s{n}"] = name
        values[f":s{n}"] = serialize_value(value)
        sets.append(f"#s{n} = :s{n}")
    removes = []
    for n, name in enumerate(stale):
        names[f"#r{n}"] = name
        removes.append(f"#r{n}")
    if counted is None:
        condition = "#v = :v AND attribute_not_exists(#ca)"
    else:
        condition = "#v = :v AND #ca = :ca"
        values[":ca"] = serialize_value(counted)
    expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
    update = {
        "Update": {
            "TableName": table_name,
            "Key": serialize(keys.worker_key(worker_id)),
            "UpdateExpression": expression,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": names,
            "ExpressionAttributeValues": values,
        }
    }
    return [update, *counter_updates(table_name, worker_id, moves(counted, cell))]


def _relayout(
    raw: dict[str, Any], *, legacy: bool
) -> tuple[Worker, str | None, dict[str, Any], list[str]] | None:
    """What bringing this worker item to the bucket layout changes: the worker, the cell it is counted
    in now, the attributes to set and those to remove; None when it is already there."""
    worker = load_record(Worker, raw)
    plain = deserialize(raw)
    counted = plain.get(COUNTED_AS)
    wanted: dict[str, Any] = {
        **keys.worker_index_attributes(worker, legacy=legacy),
        COUNTED_AS: keys.counted_cell(worker),
    }
    stale = sorted(
        name
        for name in ("GSI4PK", "GSI4SK", "GSI5PK", "GSI5SK", *keys.LEGACY_WORKER_ATTRIBUTES)
        if name in plain and name not in wanted
    )
    if not stale and all(plain.get(name) == value for name, value in wanted.items()):
        return None
    return worker, str(counted) if counted is not None else None, wanted, stale
