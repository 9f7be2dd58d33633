"""Which layout of the index attributes the table is in, read from one marker item.

A table written by the release before bucket keys (docs/data-model.md, "Migrating a table") holds
workers without a bucket, without counters and under fleet-wide index keys. The reconciler migrates it
online (store/migration.py, services/layout.py); the marker `PK = LAYOUT#table`, `SK = LAYOUT` says how
far it is, and every reader and writer follows it:

- `migrating`: writes carry both layouts' index attributes and keep the counters; reads use the
  legacy indexes and count from a read of the whole fleet, as the earlier release did, because only
  they hold every worker until the backfill has passed over all of them.
- `done`: reads use the bucket indexes and the counters. Writes keep the legacy attributes for a grace
  period (a process may still read the marker as `migrating` for up to CACHE_SECONDS), then drop them;
  the reconciler then removes them from the items that still carry them.

A table created by this release has nothing to migrate: the local stack marks it `done` at creation;
on AWS the first reconcile cycle finds nothing to migrate and marks it so.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from fleetkeeper.cloud.retry import with_backoff
from fleetkeeper.domain.models import UtcDatetime, utcnow
from fleetkeeper.store.codec import load_record, record_attributes, serialize

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

LAYOUT_KEY = {"PK": "LAYOUT#table", "SK": "LAYOUT"}
# How long a process trusts the marker it read while the migration is not done.
CACHE_SECONDS = 30.0
# Writes keep the legacy attributes this long after the migration is done: longer than any process
# can go on reading the marker as `migrating`.
LEGACY_GRACE = timedelta(seconds=4 * CACHE_SECONDS)


class LayoutPhase(StrEnum):
    MIGRATING = "migrating"
    DONE = "done"


class LayoutState(BaseModel):
    """The marker: the phase, the backfill's cursor and its progress."""

    model_config = ConfigDict(extra="ignore")

    version: int = Field(default=0, ge=0)
    phase: LayoutPhase = LayoutPhase.MIGRATING
    # The bucket indexes exist and are ACTIVE: the backfill may start.
    indexes_ready: bool = False
    # Which legacy listing the current pass walks (`WORKER` or `INSTANCE`) and where it stands (the
    # Query's LastEvaluatedKey as JSON; None at the start of a pass).
    walking: str = "WORKER"
    cursor: str | None = None
    passes: int = Field(default=0, ge=0)
    # What the current pass changed or could not change (an item written meanwhile): a pass that
    # changed nothing and was refused nothing proves every item migrated.
    pass_changed: int = Field(default=0, ge=0)
    pass_refused: int = Field(default=0, ge=0)
    workers_counted: int = Field(default=0, ge=0)
    pools_gated: int = Field(default=0, ge=0)
    workers_cleaned: int = Field(default=0, ge=0)
    instances_rekeyed: int = Field(default=0, ge=0)
    started_at: UtcDatetime | None = None
    done_at: UtcDatetime | None = None
    # Writes carry the legacy attributes until then (None: never again).
    legacy_until: UtcDatetime | None = None


@dataclass(frozen=True)
class Layout:
    """What readers and writers do now."""

    # Reads use the bucket indexes, counts come from the counters, placements check the pool gates.
    done: bool
    # Writes also carry the legacy index attributes.
    legacy_writes: bool

    @classmethod
    def of(cls, state: LayoutState, now: datetime) -> Layout:
        if state.phase != LayoutPhase.DONE:
            return cls(done=False, legacy_writes=True)
        return cls(done=True, legacy_writes=state.legacy_until is not None and now < state.legacy_until)

    @property
    def settled(self) -> bool:
        """Nothing about it can change any more: done, and past the grace."""
        return self.done and not self.legacy_writes


def read_layout_state(client: DynamoDBClient, table_name: str) -> LayoutState:
    response = with_backoff(
        lambda: client.get_item(TableName=table_name, Key=serialize(LAYOUT_KEY), ConsistentRead=True),
        name="GetItem",
    )
    item = response.get("Item")
    return load_record(LayoutState, item) if item else LayoutState()


class LayoutCache:
    """The marker as one process last read it: kept for CACHE_SECONDS, for ever once settled."""

    def __init__(self, client: DynamoDBClient, table_name: str) -> None:
        self._client = client
        self._table_name = table_name
        self._lock = threading.Lock()
        self._layout: Layout | None = None
        self._expires = 0.0

    def get(self) -> Layout:
        with self._lock:
            if self._layout is not None and (self._layout.settled or time.monotonic() < self._expires):
                return self._layout
        state = read_layout_state(self._client, self._table_name)
        layout = Layout.of(state, utcnow())
        with self._lock:
            self._layout = layout
            self._expires = time.monotonic() + CACHE_SECONDS
        return layout

    def forget(self) -> None:
        with self._lock:
            self._layout = None


def initialise_new_table(client: DynamoDBClient, table_name: str) -> None:
    """Mark a table this release just created: nothing in it needs migrating."""
    now = utcnow()
    state = LayoutState(
        version=1, phase=LayoutPhase.DONE, indexes_ready=True, started_at=now, done_at=now, legacy_until=None
    )
    with_backoff(
        lambda: client.put_item(
            TableName=table_name,
            Item=serialize({**LAYOUT_KEY, **record_attributes(state)}),
            ConditionExpression="attribute_not_exists(PK)",
        ),
        name="PutItem",
    )
