"""Orphan GC's circuit breaker: a small head item per region and the pages of its sets of worker ids.

Layout, in one partition per region (`PK = BREAKER#orphan-gc#<region>`):
- the head, `SK = BREAKER`, listed through by_kind (`KIND#BREAKER`): the breaker's state, and for each
  of its sets (held back, confirmed) the count, fingerprint and page key (domain/orphan_breaker.IdSet);
- the pages, `SK = IDS#<page key>#<n>`: at most `PAGE_MAX_IDS` sorted ids and `PAGE_BUDGET_BYTES` each.

A set's pages are written first, under a page key of their own that nothing refers to yet, in batches;
then the head is written, conditional on the version it read, to refer to them. So a reader never sees a
half-written set, and of two writers racing for the head the loser's pages are its own to delete. Pages
are never rewritten: the set is confirmed by referring to the same pages. Once a head write that changes
its sets succeeds, the pages of sets it no longer refers to are deleted, and so are pages nothing refers
to that are older than any writer could still be working on (a writer that died between its pages and
its head).
"""

from __future__ import annotations

import math
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.errors import StaleWrite, Unavailable
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.orphan_breaker import IdSet, OrphanBreaker, fingerprint
from fleetkeeper.observability import logger
from fleetkeeper.store import keys
from fleetkeeper.store.codec import (
    decode_page_token,
    encode_page_token,
    load_record,
    record_attributes,
    serialize,
)
from fleetkeeper.store.item_size import item_size
from fleetkeeper.store.schema import BY_KIND
from fleetkeeper.store.table import Page, put_next_version, write_batches

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

PAGE_PREFIX: Final = "IDS#"
# A page holds at most this many ids and this many bytes (ids are up to 256 characters: EC2 tag values).
PAGE_MAX_IDS: Final = 1000
PAGE_BUDGET_BYTES: Final = 64 * 1024
# Pages nothing refers to are left alone this long: their writer may still be writing its head (a
# discovery run lasts at most 15 minutes).
UNREFERENCED_GRACE: Final = timedelta(minutes=20)
# Every page of a region's sets shares the breaker's partition, and one partition takes 1,000 write
# units a second on AWS. A mass disappearance's set (50,000 ids of 256 characters: about 200 pages of
# 64 KB, 12,600 units) would be throttled if sent at once, so its pages go out at most this many write
# units a second, under the partition's rate to leave room for the head's own writes.
PAGE_WRITE_UNITS_PER_SECOND: Final = 800


def _paced(items: Sequence[dict[str, Any]], units_per_second: int) -> Iterator[list[dict[str, Any]]]:
    """The items in groups of at most `units_per_second` write units (one unit per started KB)."""
    group: list[dict[str, Any]] = []
    units = 0
    for item in items:
        cost = max(1, math.ceil(item_size(item) / 1024))
        if group and units + cost > units_per_second:
            yield group
            group, units = [], 0
        group.append(item)
        units += cost
    if group:
        yield group


class IncompleteIdSet(Exception):
    """A set's pages are not all there (never expected: the head refers only to pages already written)."""


def breaker_key(region: str) -> dict[str, str]:
    return {"PK": f"BREAKER#orphan-gc#{region}", "SK": "BREAKER"}


def page_key(region: str, pages_key: str, number: int) -> dict[str, str]:
    return {"PK": breaker_key(region)["PK"], "SK": f"{PAGE_PREFIX}{pages_key}#{number:05d}"}


def _prefix(pages_key: str) -> str:
    return f"{PAGE_PREFIX}{pages_key}#"


def _pages_of(region: str, pages_key: str, ids: Sequence[str], written_at: datetime) -> list[dict[str, Any]]:
    """The page items of a set: sorted ids, cut where a page would pass its id count or byte budget."""
    pages: list[dict[str, Any]] = []
    current: list[str] = []

    def page(number: int, content: list[str]) -> dict[str, Any]:
        return {**page_key(region, pages_key, number), "ids": content, "written_at": written_at.isoformat()}

    size = item_size(serialize(page(0, [])))
    for worker_id in ids:
        grows = len(worker_id.encode()) + 1  # a list element: its bytes and one byte of overhead
        if current and (len(current) == PAGE_MAX_IDS or size + grows > PAGE_BUDGET_BYTES):
            pages.append(page(len(pages), current))
            current, size = [], item_size(serialize(page(0, [])))
        current.append(worker_id)
        size += grows
    if current:
        pages.append(page(len(pages), current))
    return pages


class BreakerStore:
    def __init__(
        self, client: DynamoDBClient, table_name: str, *, sleep: Callable[[float], None] = time.sleep
    ) -> None:
        self._client = client
        self.table_name = table_name
        self._sleep = sleep

    # ---- the head ----------------------------------------------------------------------------------

    def read(self, region: str) -> OrphanBreaker | None:
        response = with_backoff(
            lambda: self._client.get_item(
                TableName=self.table_name, Key=serialize(breaker_key(region)), ConsistentRead=True
            ),
            name="GetItem",
        )
        item = response.get("Item")
        return load_record(OrphanBreaker, item) if item else None

    def list_all(self) -> list[OrphanBreaker]:
        """Every region's breaker, by region."""
        found: list[OrphanBreaker] = []
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "IndexName": BY_KIND,
            "KeyConditionExpression": "GSI3PK = :k",
            "ExpressionAttributeValues": {":k": {"S": keys.kind_partition("BREAKER")}},
        }
        while True:
            response = with_backoff(lambda: self._client.query(**request), name="Query")
            found.extend(load_record(OrphanBreaker, item) for item in response.get("Items", []))
            start = response.get("LastEvaluatedKey")
            if not start:
                return sorted(found, key=lambda b: b.region)
            request["ExclusiveStartKey"] = start

    def save(self, current: OrphanBreaker | None, updated: OrphanBreaker) -> OrphanBreaker:
        """Write `updated` as the next version of `current` (None: the item must not exist yet); then
        delete the pages it no longer refers to. Its own sets' pages must already be written."""
        expected = current.version if current is not None else 0
        stored = updated.model_copy(update={"version": expected + 1})
        item = {
            **breaker_key(stored.region),
            **record_attributes(stored),
            "GSI3PK": keys.kind_partition("BREAKER"),
            "GSI3SK": stored.region,
        }
        put_next_version(
            self._client,
            self.table_name,
            item,
            expected_version=expected,
            stale=lambda: StaleWrite(
                "orphan-gc-breaker",
                stored.region,
                None,
                f"the orphan GC breaker of {stored.region} changed concurrently; read it again",
            ),
        )
        before = {s.pages_key for s in current.id_sets()} if current is not None else set()
        after = {s.pages_key for s in stored.id_sets()}
        if before != after:
            # Pages are written (and so left behind) only around a change of sets: look for them then.
            self._collect(stored.region, keep=after, superseded=before - after)
        return stored

    # ---- the pages -----------------------------------------------------------------------------------

    def write_ids(self, region: str, ids: Sequence[str], *, now: datetime | None = None) -> IdSet:
        """Write a set's pages under a fresh page key, in batches; nothing refers to them until a head
        that names the returned set is saved."""
        unique = sorted(set(ids))
        if not unique:
            raise ValueError("an empty set has no pages")
        pages_key = uuid.uuid4().hex[:16]
        pages = [serialize(p) for p in _pages_of(region, pages_key, unique, now or utcnow())]
        started = time.monotonic()
        for n, group in enumerate(_paced(pages, PAGE_WRITE_UNITS_PER_SECOND)):
            # Group n starts no sooner than n seconds after the first: the partition's rate, not a burst.
            self._sleep(max(0.0, started + n - time.monotonic()))
            write_batches(self._client, self.table_name, [{"PutRequest": {"Item": p}} for p in group])
        return IdSet(
            count=len(unique), fingerprint=fingerprint(unique), pages_key=pages_key, pages=len(pages)
        )

    def discard(self, region: str, id_set: IdSet) -> None:
        """Delete the pages of a set no head refers to (its writer lost the race for the head)."""
        self._delete_pages(region, [id_set.pages_key])

    def ids(self, region: str, id_set: IdSet) -> list[str]:
        """Every id of the set, sorted, read consistently; `IncompleteIdSet` when pages are missing."""
        found: list[str] = []
        pages = 0
        for item in self._query_pages(region, _prefix(id_set.pages_key)):
            found.extend(str(v["S"]) for v in item["ids"]["L"])
            pages += 1
        if pages != id_set.pages or len(found) != id_set.count:
            raise IncompleteIdSet(
                f"{region}: {pages} of {id_set.pages} pages, {len(found)} of {id_set.count} ids"
            )
        return found

    def ids_page(self, region: str, id_set: IdSet, next_token: str | None = None) -> Page[str]:
        """One page of the set's ids, in order: a page as stored (at most `PAGE_MAX_IDS` ids)."""
        query = self._page_query(region, _prefix(id_set.pages_key))
        start = decode_page_token(next_token, query)
        request: dict[str, Any] = {**query, "Limit": 1, "ConsistentRead": True}
        if start:
            request["ExclusiveStartKey"] = start
        response = with_backoff(lambda: self._client.query(**request), name="Query")
        items: list[Any] = list(response.get("Items", []))
        ids = [str(v["S"]) for item in items for v in item["ids"]["L"]]
        # DynamoDB hands back a start key whenever the limit was reached; after the last page there is
        # nothing to start from.
        last = not items or int(str(items[-1]["SK"]["S"]).rsplit("#", 1)[1]) + 1 >= id_set.pages
        return Page(ids, None if last else encode_page_token(response.get("LastEvaluatedKey"), query))

    def _page_query(self, region: str, sk_prefix: str) -> dict[str, Any]:
        return {
            "TableName": self.table_name,
            "KeyConditionExpression": "PK = :pk AND begins_with(SK, :prefix)",
            "ExpressionAttributeValues": {
                ":pk": {"S": breaker_key(region)["PK"]},
                ":prefix": {"S": sk_prefix},
            },
        }

    def _query_pages(self, region: str, sk_prefix: str, **extra: Any) -> Iterator[dict[str, Any]]:
        request = {**self._page_query(region, sk_prefix), "ConsistentRead": True, **extra}
        while True:
            response = with_backoff(lambda: self._client.query(**request), name="Query")
            yield from (dict(i) for i in response.get("Items", []))
            start = response.get("LastEvaluatedKey")
            if not start:
                return
            request["ExclusiveStartKey"] = start

    def _collect(self, region: str, *, keep: set[str], superseded: set[str]) -> None:
        """Delete the pages of the superseded sets, and those nothing refers to past the grace. Best
        effort: the head is already written, and what is left here is collected after the next write."""
        try:
            written: dict[str, str] = {}
            for item in self._query_pages(
                region, PAGE_PREFIX, ProjectionExpression="SK, written_at", ConsistentRead=False
            ):
                pages_key = str(item["SK"]["S"]).removeprefix(PAGE_PREFIX).rsplit("#", 1)[0]
                written[pages_key] = min(written.get(pages_key, "~"), str(item["written_at"]["S"]))
            cutoff = (utcnow() - UNREFERENCED_GRACE).isoformat()
            doomed = [k for k, at in written.items() if k not in keep and (k in superseded or at < cutoff)]
            self._delete_pages(region, doomed)
        except (ClientError, BotoCoreError, Unavailable) as error:
            logger.warning("orphan GC breaker pages not collected", region=region, error=str(error))

    def _delete_pages(self, region: str, pages_keys: Sequence[str]) -> None:
        doomed: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pages_key in pages_keys:
            for item in self._query_pages(region, _prefix(pages_key), ProjectionExpression="PK, SK"):
                doomed[pages_key].append({"DeleteRequest": {"Key": {"PK": item["PK"], "SK": item["SK"]}}})
        requests = [r for pages_key in pages_keys for r in doomed[pages_key]]
        if requests:
            write_batches(self._client, self.table_name, requests)
