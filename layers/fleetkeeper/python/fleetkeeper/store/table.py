"""The single table: consistent reads of one record by key, queries, and transactions with one mapper.

Every DynamoDB call goes through `cloud/retry.with_backoff`, so throttling, 5xx and transactions cancelled
by a concurrent one are retried with jittered backoff and end, when they persist, as `Unavailable`.
A transaction cancelled by a failed condition is final: `cancellation_error` turns it into the typed
error its caller described for that item, built from the item's current state (ALL_OLD).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from botocore.exceptions import ClientError
from pydantic import BaseModel, ValidationError

from fleetkeeper.cloud.retry import (
    DEFAULT_ATTEMPTS,
    DEFAULT_BASE_SECONDS,
    DEFAULT_CAP_SECONDS,
    cancellation_reasons,
    error_code,
    full_jitter,
    with_backoff,
)
from fleetkeeper.domain.errors import InvalidInput, NotFound, StaleWrite, Unavailable
from fleetkeeper.domain.models import AuditEvent
from fleetkeeper.store import keys
from fleetkeeper.store.codec import (
    decode_page_token,
    decode_walk_token,
    encode_page_token,
    encode_walk_token,
    load_record,
    record_attributes,
    serialize,
    serialize_value,
)
from fleetkeeper.store.layout import Layout, LayoutCache
from fleetkeeper.store.retention import audit_kept_days, expiration

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

MAX_QUERY_PAGE = 1000
# BatchGetItem reads at most 100 keys per call, BatchWriteItem writes at most 25 items.
BATCH_GET_SIZE = 100
# Queries one page of a walk may make beyond one per partition (filters can leave a query's page empty).
WALK_EXTRA_CALLS = 8
BATCH_WRITE_SIZE = 25
CONDITION_FAILED = "ConditionalCheckFailed"
# The error of a single write (PutItem, UpdateItem, DeleteItem) whose condition failed.
CONDITIONAL_CHECK_FAILED = "ConditionalCheckFailedException"

# What a failed condition on one item means, given that item as it is now (None when it does not exist).
Refusal = Callable[[dict[str, Any] | None], Exception]


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    next_token: str | None


def validated_copy(record: M, changes: Mapping[str, Any]) -> M:
    """Apply changes and validate the result, so a bad value never reaches the table."""
    data = record.model_dump()
    data.update(changes)
    try:
        return type(record).model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "body"
        raise InvalidInput(field, first["msg"]) from exc


def cancellation_error(exc: ClientError, refusals: Mapping[int, Refusal]) -> Exception | None:
    """The typed error for a transaction cancelled by a failed condition, or None if none failed.

    Reasons line up with the items sent; the first item whose condition failed decides, and its refusal
    is given the item's current state. A condition failing on an item nobody described is a bug.
    """
    for index, reason in enumerate(cancellation_reasons(exc)):
        if reason.get("Code") != CONDITION_FAILED:
            continue
        refusal = refusals.get(index)
        if refusal is None:
            return None
        old = reason.get("Item")
        return refusal(dict(old) if old else None)
    return None


def _already_written(exc: ClientError, record: BaseModel) -> bool:
    """True when item 0's condition failed because it already holds exactly `record` (our own write)."""
    reasons = cancellation_reasons(exc)
    if not reasons or reasons[0].get("Code") != CONDITION_FAILED or not reasons[0].get("Item"):
        return False
    return load_record(type(record), reasons[0]["Item"]) == record


def refuse_missing(kind: str, key: str, otherwise: Callable[[dict[str, Any]], Exception]) -> Refusal:
    """A refusal that says NotFound when the item is gone, and `otherwise(current)` when it is not."""

    def refuse(current: dict[str, Any] | None) -> Exception:
        return NotFound(kind, key) if current is None else otherwise(current)

    return refuse


class TableAccess:
    """The table and its client; the entity repositories build on these few operations."""

    def __init__(
        self,
        client: DynamoDBClient,
        table_name: str,
        *,
        audit_retention_days: int | None = None,
        operation_retention_days: int | None = None,
    ) -> None:
        self._client = client
        self.table_name = table_name
        # Audit items expire this many days after they were written, finished operations this many days
        # after they finished (None or 0: kept for ever; store/retention.py).
        self.audit_retention_days = audit_retention_days
        self.operation_retention_days = operation_retention_days
        self._layout = LayoutCache(client, table_name)

    def layout(self) -> Layout:
        """The table's index layout as this process knows it (store/layout.py)."""
        return self._layout.get()

    # ---- reads -------------------------------------------------------------------------------

    def _get(self, key: Mapping[str, str]) -> dict[str, Any] | None:
        """The item at `key`, strongly consistent; None when absent."""
        response = with_backoff(
            lambda: self._client.get_item(TableName=self.table_name, Key=serialize(key), ConsistentRead=True),
            name="GetItem",
        )
        item = response.get("Item")
        return dict(item) if item else None

    def _find(self, model: type[M], key: Mapping[str, str]) -> M | None:
        """One record by key, strongly consistent; None when absent."""
        item = self._get(key)
        return load_record(model, item) if item else None

    def _fetch(self, model: type[M], key: Mapping[str, str], kind: str, identifier: str) -> M:
        """One record by key, strongly consistent; NotFound naming `kind` and `identifier` when absent."""
        record = self._find(model, key)
        if record is None:
            raise NotFound(kind, identifier)
        return record

    def _batch_get(
        self, model: type[M], keys_: Sequence[Mapping[str, str]], *, consistent: bool = True
    ) -> list[M]:
        """Reads of many records (strongly consistent unless asked otherwise); missing keys are
        skipped, order is not kept."""
        return [load_record(model, item) for item in self._batch_get_items(keys_, consistent=consistent)]

    def _batch_get_items(
        self,
        keys_: Sequence[Mapping[str, str]],
        *,
        consistent: bool = True,
        projection: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """The items at these keys, 100 per BatchGetItem, unprocessed keys asked again (with backoff)."""
        found: list[dict[str, Any]] = []
        shape: dict[str, Any] = {"ConsistentRead": consistent}
        if projection:
            names = {f"#p{n}": name for n, name in enumerate(projection)}
            shape["ProjectionExpression"] = ", ".join(names)
            shape["ExpressionAttributeNames"] = names
        # DynamoDB refuses a batch that names one key twice (ValidationException), and a listing merged
        # from several index partitions can name a worker twice when it changed status during the walk.
        keys_ = list({tuple(sorted(k.items())): k for k in keys_}.values())
        for start in range(0, len(keys_), BATCH_GET_SIZE):
            pending: dict[str, Any] = {
                self.table_name: {
                    "Keys": [serialize(k) for k in keys_[start : start + BATCH_GET_SIZE]],
                    **shape,
                }
            }
            attempt = 0
            while pending:
                if attempt:
                    # DynamoDB hands back what it could not read under load: ask again, after a pause.
                    time.sleep(full_jitter(attempt, DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS))
                response = with_backoff(
                    lambda request=pending: self._client.batch_get_item(RequestItems=request),  # type: ignore[misc]
                    name="BatchGetItem",
                )
                found.extend(dict(item) for item in response["Responses"].get(self.table_name, []))
                pending = dict(response.get("UnprocessedKeys") or {})
                attempt += 1
        return found

    def _query(self, **kwargs: Any) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        response = with_backoff(lambda: self._client.query(TableName=self.table_name, **kwargs), name="Query")
        return [dict(i) for i in response.get("Items", [])], response.get("LastEvaluatedKey")

    def _query_all(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
        start: dict[str, Any] | None = None
        while True:
            if start:
                kwargs["ExclusiveStartKey"] = start
            items, start = self._query(**kwargs)
            yield from items
            if not start:
                return

    def _page(self, model: type[M], limit: int, next_token: str | None, **query: Any) -> Page[M]:
        if not 1 <= limit <= MAX_QUERY_PAGE:
            raise InvalidInput("limit", f"must be between 1 and {MAX_QUERY_PAGE}")
        start = decode_page_token(next_token, query)
        try:
            items, last = self._query(Limit=limit, **query, **({"ExclusiveStartKey": start} if start else {}))
        except ClientError as exc:
            # The token was checked against the query; should DynamoDB still refuse it as a start key,
            # that is the client's token, not our bug.
            if start and exc.response.get("Error", {}).get("Code") == "ValidationException":
                raise InvalidInput("next_token", "is not a token this API issued") from exc
            raise
        return Page([load_record(model, i) for i in items], encode_page_token(last, query))

    def _walk(
        self,
        limit: int,
        next_token: str | None,
        queries: Sequence[Mapping[str, Any]],
        passes: Callable[[int], int] | None = None,
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of a listing over several partitions, read one after another (codec.py, "walks").

        At most one page's worth of items, from at most one query per partition plus a few: a listing
        whose filters match little returns a short page and a token rather than read on without bound.
        Before a partition is begun, `passes(position)` may name a number of partitions to pass over
        unread, from that one on; the token stays the walk's own.
        """
        if not 1 <= limit <= MAX_QUERY_PAGE:
            raise InvalidInput("limit", f"must be between 1 and {MAX_QUERY_PAGE}")
        position, start = decode_walk_token(next_token, queries)
        items: list[dict[str, Any]] = []
        calls = len(queries) - position + WALK_EXTRA_CALLS
        while position < len(queries) and len(items) < limit and calls > 0:
            if start is None and passes is not None and (passed := passes(position)):
                position += passed
                continue
            calls -= 1
            try:
                found, last = self._query(
                    Limit=limit - len(items),
                    **queries[position],
                    **({"ExclusiveStartKey": start} if start else {}),
                )
            except ClientError as exc:
                if start and exc.response.get("Error", {}).get("Code") == "ValidationException":
                    raise InvalidInput("next_token", "is not a token this API issued") from exc
                raise
            items.extend(found)
            if last:
                start = last
            else:
                position, start = position + 1, None
        return items, encode_walk_token(position, start, queries)

    # ---- writes ------------------------------------------------------------------------------

    def _transact(
        self,
        items: Sequence[Mapping[str, Any]],
        refusals: Mapping[int, Refusal],
        *,
        written: BaseModel | None = None,
    ) -> None:
        """Write the items in one transaction; the one place a cancellation is mapped.

        `refusals[i]` says what a failed condition on item i means. Conflicts with concurrent
        transactions and throttling are retried (cloud/retry.py), then raise `Unavailable`.
        `written` is the record item 0 stores: when a retry fails its condition because the item now is
        exactly that record, an earlier attempt committed and only its answer was lost, so it succeeded.
        """
        try:
            with_backoff(
                lambda: self._client.transact_write_items(TransactItems=list(items)),  # type: ignore[arg-type]
                name="TransactWriteItems",
            )
        except ClientError as exc:
            if written is not None and _already_written(exc, written):
                return
            refused = cancellation_error(exc, refusals)
            if refused is None:
                raise
            raise refused from exc

    def _transact_unless_refused(self, items: Sequence[Mapping[str, Any]]) -> bool:
        """Write the items in one transaction: False when a condition of theirs failed (another writer
        came first; so does a lost answer's retry, which reading again tells apart)."""
        try:
            self._transact(items, {})
        except ClientError as exc:
            if any(r.get("Code") == CONDITION_FAILED for r in cancellation_reasons(exc)):
                return False
            raise
        return True

    def _put(
        self,
        item: dict[str, Any],
        condition: str,
        values: Mapping[str, Any] | None = None,
        names: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        put: dict[str, Any] = {
            "TableName": self.table_name,
            "Item": serialize(item),
            "ConditionExpression": condition,
            "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
        }
        if values:
            put["ExpressionAttributeValues"] = {k: serialize_value(v) for k, v in values.items()}
        if names:
            put["ExpressionAttributeNames"] = dict(names)
        return {"Put": put}

    def _condition_check(
        self, key: Mapping[str, str], condition: str, values: Mapping[str, Any], names: Mapping[str, str]
    ) -> dict[str, Any]:
        return {
            "ConditionCheck": {
                "TableName": self.table_name,
                "Key": serialize(key),
                "ConditionExpression": condition,
                "ExpressionAttributeNames": dict(names),
                "ExpressionAttributeValues": {k: serialize_value(v) for k, v in values.items()},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    def _audit_put(self, event: AuditEvent) -> dict[str, Any]:
        item = {
            **keys.audit_key(event),
            **record_attributes(event),
            **expiration(
                event.at, audit_kept_days(event, self.audit_retention_days, self.operation_retention_days)
            ),
        }
        return {"Put": {"TableName": self.table_name, "Item": serialize(item)}}


def conditional_write(call: Callable[[], object], *, name: str) -> ClientError | None:
    """Send one conditional single-item write, retried like every call (cloud/retry.py); None when it
    was written, the refusal when its condition failed. The one place such a refusal is read (a
    transaction's go through `cancellation_error`): every caller decides what a refusal means for it.

    A retry after an answer that was lost sees the first attempt's own write, so a condition that the
    write itself falsifies reads as refused: callers keep to the safe side of that doubt."""
    try:
        with_backoff(call, name=name)
    except ClientError as exc:
        if error_code(exc) == CONDITIONAL_CHECK_FAILED:
            return exc
        raise
    return None


def write_batches(
    client: DynamoDBClient,
    table_name: str,
    requests: Sequence[Mapping[str, Any]],
    *,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Send BatchWriteItem requests (`{"PutRequest": ...}` or `{"DeleteRequest": ...}`), 25 per call.

    For items no condition guards (pages of ids written before anything refers to them, or no longer
    referred to): each call is retried like every call, and what DynamoDB leaves unprocessed (throttled
    partitions) is sent again after a jittered backoff; `Unavailable` when it is still left after the
    attempts, with whatever was written staying written.
    """
    for start in range(0, len(requests), BATCH_WRITE_SIZE):
        pending: dict[str, Any] = {table_name: list(requests[start : start + BATCH_WRITE_SIZE])}
        for attempt in range(DEFAULT_ATTEMPTS):
            response = with_backoff(
                lambda batch=pending: client.batch_write_item(RequestItems=batch),  # type: ignore[misc]
                name="BatchWriteItem",
            )
            pending = dict(response.get("UnprocessedItems") or {})
            if not pending:
                break
            if attempt + 1 == DEFAULT_ATTEMPTS:
                left = len(pending.get(table_name, []))
                raise Unavailable(
                    "BatchWriteItem", f"{left} items unprocessed after {DEFAULT_ATTEMPTS} attempts"
                )
            sleep(full_jitter(attempt, DEFAULT_BASE_SECONDS, DEFAULT_CAP_SECONDS))


def put_next_version(
    client: DynamoDBClient,
    table_name: str,
    item: Mapping[str, Any],
    *,
    expected_version: int,
    stale: Callable[[], StaleWrite],
) -> None:
    """Put `item` only if the stored one is still at `expected_version` (0: there is none yet); raise
    `stale()` when another writer got there first. For small items replaced whole (not transitions)."""
    condition: dict[str, Any]
    if expected_version == 0:
        condition = {"ConditionExpression": "attribute_not_exists(PK)"}
    else:
        condition = {
            "ConditionExpression": "#v = :v",
            "ExpressionAttributeNames": {"#v": "version"},
            "ExpressionAttributeValues": {":v": serialize_value(expected_version)},
        }
    refused = conditional_write(
        lambda: client.put_item(TableName=table_name, Item=serialize(item), **condition), name="PutItem"
    )
    if refused is not None:
        raise stale() from refused


def current_status(model: type[BaseModel], item: Mapping[str, Any], field: str = "status") -> str | None:
    """The status (or state) field of a stored item as a string, for the message of a conflict."""
    value = getattr(load_record(model, item), field, None)
    return str(value) if value is not None else None
