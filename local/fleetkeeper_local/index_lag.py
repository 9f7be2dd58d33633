"""Global secondary indexes that lag their table, both ways, as DynamoDB's do.

A GSI is updated asynchronously (usually within a second, sometimes more), so a Query on it answers
from the index as it stood a moment ago. DynamoDB Local's indexes are always current. `LaggingIndexes`
makes every index Query answer as the index stood `lag` seconds ago, for the items written since:

- an item that did not exist then is missing (a worker just created is not listed);
- an item that did shows its old image: its old keys (a worker drained a moment ago is still in the
  RUNNING partition of by_shard) and its old projected attributes (by_pool still says RUNNING), and
  it is missing where only its new image would put it.

With `old_images` off, every item written since is missing instead, whatever it was before (the
cheaper model: nothing is read out of band).

How: before a write, the items it changes are read as they are (a consistent BatchGetItem on a client
no layer sees), and when it lands, (when, image before) is kept per item for `lag` seconds. A Query
answer on an index then drops the items written since and adds the old images the query's key
condition and filter select (evaluated by moto's DynamoDB expression parser), projected as the index
projects, in the index's order and within the answer's page (its start key, its last evaluated key,
its Limit).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from moto.dynamodb.comparisons import get_filter_expression
from moto.dynamodb.models.dynamo_type import DynamoType, Item

from fleetkeeper_local.tables import TableShape, describe, write_items

# The request-context key under which a write's before-images wait for its answer.
_BEFORE = "fleetkeeper_index_lag_before"
_BATCH_GET_KEYS = 100


class LaggingIndexes:
    """Index Query answers as the indexes stood `lag` seconds ago (module docstring)."""

    def __init__(self, lag: float, *, old_images: bool, reader: Callable[[], Any]) -> None:
        self.lag = lag
        self.old_images = old_images
        self._reader = reader
        self._client: Any = None
        self._lock = threading.Lock()
        self._tables: dict[str, TableShape | None] = {}
        # (table, item key) -> [(monotonic time the write landed, the item before it; None: no item)]
        self._written: dict[tuple[str, str], list[tuple[float, dict[str, Any] | None]]] = {}
        self.hidden = 0  # index entries left out because their item was written too recently
        self.shown_old = 0  # old images answered in their place

    # ---- writes --------------------------------------------------------------------------------------

    def before_write(self, operation: str, body: Mapping[str, Any], context: dict[str, Any]) -> None:
        """Note the items the write changes and, with old images, what they are now."""
        wanted: dict[tuple[str, str], Mapping[str, Any]] = {}
        for table_name, action, spec in write_items(operation, body):
            table = self._table(table_name)
            if table is None or action == "ConditionCheck" or not table.indexes:
                continue
            item = spec.get("Key") or spec.get("Item") or {}
            key = {name: item[name] for name in table.key_names if name in item}
            wanted[(table_name, table.item_key(key))] = key
        images: dict[tuple[str, str], dict[str, Any] | None] = dict.fromkeys(wanted)
        if self.old_images and wanted:
            images.update(self._read(wanted))
        context[_BEFORE] = images

    def after_write(self, context: dict[str, Any], landed: bool) -> None:
        images = context.pop(_BEFORE, None)
        if not landed or not images:
            return
        now = time.monotonic()
        with self._lock:
            for key, image in images.items():
                self._written.setdefault(key, []).append((now, image))

    def _read(
        self, wanted: Mapping[tuple[str, str], Mapping[str, Any]]
    ) -> dict[tuple[str, str], dict[str, Any]]:
        by_table: dict[str, list[Mapping[str, Any]]] = {}
        for (table_name, _), key in wanted.items():
            by_table.setdefault(table_name, []).append(key)
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for table_name, keys in by_table.items():
            table = self._table(table_name)
            assert table is not None  # noqa: S101 - only known tables' keys are wanted
            for start in range(0, len(keys), _BATCH_GET_KEYS):
                request: dict[str, Any] = {
                    table_name: {"Keys": keys[start : start + _BATCH_GET_KEYS], "ConsistentRead": True}
                }
                while request:
                    answer = self._raw().batch_get_item(RequestItems=request)
                    for item in answer.get("Responses", {}).get(table_name, []):
                        found[(table_name, table.item_key(item))] = dict(item)
                    request = answer.get("UnprocessedKeys") or {}
        return found

    # ---- index queries --------------------------------------------------------------------------------

    def after_query(self, body: Mapping[str, Any], parsed: dict[str, Any]) -> None:
        """Make an index Query's answer what the lagging index would have answered."""
        index = body.get("IndexName")
        items = parsed.get("Items")
        table = self._table(str(body.get("TableName", "")))
        if not index or items is None or table is None or index not in table.indexes:
            return
        recent = self._recent(table.name)
        if not recent:
            return
        kept = [item for item in items if table.item_key(item) not in recent]
        entries = [
            entry
            for image in recent.values()
            if image is not None and (entry := table.index_entry(str(index), image)) is not None
        ]
        if entries:
            selects = _selection(body)
            entries = _within_page(table, str(index), body, parsed, [e for e in entries if selects(e)])
        old = entries
        with self._lock:
            self.hidden += len(items) - len(kept)
            self.shown_old += len(old)
        answer = _in_index_order(table, str(index), body, kept + old)
        limit = body.get("Limit")
        if isinstance(limit, int) and len(answer) > limit:
            answer = answer[:limit]
            parsed["LastEvaluatedKey"] = _position_key(table, str(index), answer[-1])
        shown = {id(entry) for entry in old}
        answer = [_projected(item, body) if id(item) in shown else item for item in answer]
        parsed["Items"] = answer
        parsed["Count"] = len(answer)
        parsed["ScannedCount"] = max(int(parsed.get("ScannedCount", 0)), len(answer))

    def _recent(self, table_name: str) -> dict[str, dict[str, Any] | None]:
        """Per item of the table written less than `lag` ago: how the index still shows it (the image
        before its oldest write since; None: it did not exist)."""
        cutoff = time.monotonic() - self.lag
        recent: dict[str, dict[str, Any] | None] = {}
        with self._lock:
            for key in list(self._written):
                writes = [entry for entry in self._written[key] if entry[0] > cutoff]
                if not writes:
                    del self._written[key]
                    continue
                self._written[key] = writes
                if key[0] == table_name:
                    recent[key[1]] = writes[0][1]
        return recent

    # ---- the table and the raw client -------------------------------------------------------------------

    def _table(self, name: str) -> TableShape | None:
        with self._lock:
            if name in self._tables:
                return self._tables[name]
        try:
            table: TableShape | None = describe(self._raw(), name)
        except Exception:
            table = None  # DynamoDB Local answers the call itself (a missing table, say)
        with self._lock:
            self._tables[name] = table
        return table

    def _raw(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._reader()
            return self._client


def _selection(body: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], bool]:
    """Whether an index entry is one the query's key condition and filter select."""
    condition = str(body.get("KeyConditionExpression") or "")
    if body.get("FilterExpression"):
        condition = f"({condition}) AND ({body['FilterExpression']})"
    parsed = get_filter_expression(
        condition, body.get("ExpressionAttributeNames"), body.get("ExpressionAttributeValues")
    )

    def selects(entry: Mapping[str, Any]) -> bool:
        first = next(iter(entry.values()))
        return bool(parsed.expr(Item(hash_key=DynamoType(first), range_key=None, attrs=dict(entry))))

    return selects


def _sort_value(value: Mapping[str, Any] | None) -> tuple[int, Any]:
    if not value:
        return (0, "")
    kind, raw = next(iter(value.items()))
    return (1, Decimal(raw)) if kind == "N" else (1, raw)


def _position(table: TableShape, index: str, item: Mapping[str, Any]) -> tuple[Any, ...]:
    """Where an entry sorts in its index partition: by the index's range key, then the table's key."""
    range_attribute = table.indexes[index][1]
    own = tuple(_sort_value(item.get(name)) for name in table.key_names)
    return (_sort_value(item.get(range_attribute)) if range_attribute else (0, ""), *own)


def _within_page(
    table: TableShape,
    index: str,
    body: Mapping[str, Any],
    parsed: Mapping[str, Any],
    entries: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    """The entries that fall in this page: after its start key, up to its last evaluated key."""
    forward = body.get("ScanIndexForward", True) is not False
    start, last = body.get("ExclusiveStartKey"), parsed.get("LastEvaluatedKey")

    def after(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
        return a > b if forward else a < b

    kept: list[dict[str, Any]] = []
    for entry in entries:
        at = _position(table, index, entry)
        if start and not after(at, _position(table, index, start)):
            continue
        if last and after(at, _position(table, index, last)):
            continue
        kept.append(entry)
    return kept


def _in_index_order(
    table: TableShape, index: str, body: Mapping[str, Any], items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    forward = body.get("ScanIndexForward", True) is not False
    return sorted(items, key=lambda item: _position(table, index, item), reverse=not forward)


def _position_key(table: TableShape, index: str, item: Mapping[str, Any]) -> dict[str, Any]:
    """The LastEvaluatedKey of a page that ends at `item`: the table's key and the index's."""
    hash_attribute, range_attribute, _ = table.indexes[index]
    names = {*table.key_names, hash_attribute, *([range_attribute] if range_attribute else [])}
    return {name: item[name] for name in names if name in item}


def _projected(entry: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """The entry as the query asked for it: a ProjectionExpression of top-level names keeps only those."""
    expression = body.get("ProjectionExpression")
    if not expression:
        return entry
    names = body.get("ExpressionAttributeNames") or {}
    wanted = {names.get(part.strip(), part.strip()) for part in str(expression).split(",")}
    return {name: value for name, value in entry.items() if name in wanted}
