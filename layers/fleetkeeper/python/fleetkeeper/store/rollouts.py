"""Rollouts in the single table (docs/rollouts.md, docs/data-model.md).

- The rollout: `PK = ROLLOUT#<id>`, `SK = ROLLOUT`, replaced whole under a condition on its version
  and status. Listed newest first from the by_kind index (`GSI3PK = KIND#ROLLOUT`, `GSI3SK` its creation
  time and id). While it is not finished it also carries `GSI1PK = ROLLOUT#<status>` so the reconciler
  finds the running ones without a scan; a finished one leaves that index.
- Which worker it holds is not kept here: the engine claims its scope's workers as their owner, and
  drains them through the door for disruption (domain/admission.py). Items `ROLLOUTLOCK#<worker id>`
  written by an earlier release are read by nobody and expire with the audit retention.
- A finished rollout, and its member pages, expire with the audit retention after it finished (the
  save that finishes it sets their TTL in the same transaction). A rollback of a finished rollout makes
  it active again, and the same kind of save takes the TTL off before anything can expire under it.

- Its scope, sorted, in member pages: `PK = ROLLOUT#<id>`, `SK = MEMBERS#<page:05d>`, each
  `member_page_size` ids (the last fewer), written with the rollout in its start transaction and never
  changed. A wave is a slice of the sorted scope of at most MAX_WAVE_WORKERS ids, so a step reads only
  the page or two it spans. A rollout stored before member pages keeps its ids inline (`worker_ids`).

A rollout covers at most MAX_ROLLOUT_WORKERS workers; its own item holds counts and the current wave's
progress, and a member page at most MEMBER_PAGE_SIZE ids: both stay far inside the item budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from fleetkeeper.domain.errors import Conflict, NotFound, StaleWrite
from fleetkeeper.domain.models import AuditEvent, utcnow
from fleetkeeper.domain.rollouts import ACTIVE, MAX_ROLLOUT_WORKERS, Rollout, RolloutStatus
from fleetkeeper.store.codec import deserialize, record_attributes, serialize, serialize_value
from fleetkeeper.store.retention import expiration
from fleetkeeper.store.schema import BY_KIND, BY_STATUS, TTL_ATTRIBUTE
from fleetkeeper.store.table import Page, Refusal, TableAccess, conditional_write, current_status

MAX_ROLLOUT_PAGE: Final = 100
# The scope's ids per member page: 500 ids of at most 64 characters stay far inside the item budget,
# and 10,000 workers make 20 pages, written in the start's one transaction with the rollout and its audit.
MEMBER_PAGE_SIZE: Final = 500
_MAX_TRANSACTION_ITEMS: Final = 100
ROLLOUT_KIND: Final = "ROLLOUT"


def rollout_key(rollout_id: str) -> dict[str, str]:
    return {"PK": f"ROLLOUT#{rollout_id}", "SK": "ROLLOUT"}


def rollout_turn_key(status: RolloutStatus) -> dict[str, str]:
    return {"PK": f"ROLLOUTTURN#{status}", "SK": "TURN"}


def member_page_key(rollout_id: str, page: int) -> dict[str, str]:
    return {"PK": f"ROLLOUT#{rollout_id}", "SK": f"MEMBERS#{page:05d}"}


def member_page_item(rollout_id: str, page: int, ids: Sequence[str]) -> dict[str, Any]:
    """Member page `page` of a rollout: the sorted scope's ids from position page * MEMBER_PAGE_SIZE."""
    return {**member_page_key(rollout_id, page), "ids": list(ids)}


def rollout_status_partition(status: RolloutStatus) -> str:
    return f"ROLLOUT#{status}"


class RolloutStore(TableAccess):
    def _item(self, rollout: Rollout) -> dict[str, Any]:
        item = {
            **rollout_key(rollout.id),
            **record_attributes(rollout),
            "GSI3PK": f"KIND#{ROLLOUT_KIND}",
            "GSI3SK": f"{rollout.created_at.isoformat()}#{rollout.id}",
        }
        if rollout.status in ACTIVE:
            item["GSI1PK"] = rollout_status_partition(rollout.status)
            item["GSI1SK"] = rollout.id
        else:
            item.update(self._kept_after_finish(rollout))
        return item

    def _kept_after_finish(self, rollout: Rollout) -> dict[str, Any]:
        """The TTL of a finished rollout's item and member pages (none while the audit is kept forever)."""
        return expiration(rollout.finished_at or rollout.updated_at, self.audit_retention_days)

    def _member_page_updates(self, rollout: Rollout) -> list[dict[str, Any]]:
        """Set (finished) or take off (active) the TTL of each of the rollout's member pages, each on the
        condition that the page is there: an update must never create a page of ids out of nothing."""
        size = rollout.member_page_size
        if size is None:
            return []
        kept = self._kept_after_finish(rollout) if rollout.finished else {}
        if kept:
            expression, values = "SET #ttl = :ttl", {":ttl": serialize_value(kept[TTL_ATTRIBUTE])}
        else:
            expression, values = "REMOVE #ttl", {}
        updates = []
        for page in range(-(-rollout.total // size)):
            update: dict[str, Any] = {
                "TableName": self.table_name,
                "Key": serialize(member_page_key(rollout.id, page)),
                "UpdateExpression": expression,
                "ConditionExpression": "attribute_exists(PK)",
                "ExpressionAttributeNames": {"#ttl": TTL_ATTRIBUTE},
            }
            if values:
                update["ExpressionAttributeValues"] = values
            updates.append({"Update": update})
        return updates

    def _audit(
        self, rollout: Rollout, action: str, actor: str, reason: str | None, previous: str | None
    ) -> dict[str, Any]:
        return self._audit_put(
            AuditEvent(
                entity="rollout",
                entity_id=rollout.id,
                action=action,
                actor=actor,
                from_status=previous,
                to_status=str(rollout.status),
                reason=reason,
                details={"total": rollout.total, "replaced": rollout.replaced, "wave": rollout.wave},
            )
        )

    # ---- reads -------------------------------------------------------------------------------

    def find(self, rollout_id: str) -> Rollout | None:
        return self._find(Rollout, rollout_key(rollout_id))

    def get(self, rollout_id: str) -> Rollout:
        return self._fetch(Rollout, rollout_key(rollout_id), "rollout", rollout_id)

    def page(self, *, limit: int = 50, next_token: str | None = None) -> Page[Rollout]:
        """One page of rollouts, newest first (the index is eventually consistent)."""
        return self._page(
            Rollout,
            min(limit, MAX_ROLLOUT_PAGE),
            next_token,
            IndexName=BY_KIND,
            KeyConditionExpression="GSI3PK = :pk",
            ExpressionAttributeValues={":pk": {"S": f"KIND#{ROLLOUT_KIND}"}},
            ScanIndexForward=False,
        )

    def members(self, rollout: Rollout, start: int, stop: int) -> list[str]:
        """The sorted scope's ids from position `start` to `stop` (excluded), read from the member pages
        that slice spans (strongly consistent), or from the item of a rollout stored with them inline."""
        stop = min(stop, rollout.total)
        if start >= stop:
            return []
        size = rollout.member_page_size
        if size is None:
            return rollout.worker_ids[start:stop]
        first, last = start // size, (stop - 1) // size
        items = self._batch_get_items([member_page_key(rollout.id, p) for p in range(first, last + 1)])
        pages = {int(str(i["SK"]["S"]).removeprefix("MEMBERS#")): deserialize(i)["ids"] for i in items}
        if len(pages) != last - first + 1:
            raise NotFound("rollout members", rollout.id)
        ids = [str(w) for p in range(first, last + 1) for w in pages[p]]
        return ids[start - first * size : stop - first * size]

    def wave_ids(self, rollout: Rollout, wave: int) -> list[str]:
        """The workers of the rollout's wave `wave` (and of its rollback's, which are the same)."""
        return self.members(rollout, *rollout.wave_bounds(wave))

    def active_ids(self, status: RolloutStatus, *, limit: int, after: str | None = None) -> list[str]:
        """Ids of rollouts in `status` (an active one), at most `limit`, in id order from the first after
        `after`, then around from the first; the index may lag, so callers read each rollout again
        before acting on it."""
        partition = {":pk": {"S": rollout_status_partition(status)}}
        if after is None:
            items, _ = self._query(
                IndexName=BY_STATUS,
                KeyConditionExpression="GSI1PK = :pk",
                ExpressionAttributeValues=partition,
                Limit=limit,
            )
        else:
            items, _ = self._query(
                IndexName=BY_STATUS,
                KeyConditionExpression="GSI1PK = :pk AND GSI1SK > :after",
                ExpressionAttributeValues={**partition, ":after": {"S": after}},
                Limit=limit,
            )
            if len(items) < limit:
                wrapped, _ = self._query(
                    IndexName=BY_STATUS,
                    KeyConditionExpression="GSI1PK = :pk AND GSI1SK <= :after",
                    ExpressionAttributeValues={**partition, ":after": {"S": after}},
                    Limit=limit - len(items),
                )
                items += wrapped
        return [str(item["GSI1SK"]["S"]) for item in items]

    def active(self, *, limit: int = MAX_ROLLOUT_PAGE) -> list[Rollout]:
        """The active rollouts (RUNNING, PAUSED, ROLLING_BACK), at most `limit` of each, as their items
        are now (the index only names them)."""
        ids = [i for status in sorted(ACTIVE) for i in self.active_ids(status, limit=limit)]
        found = self._batch_get(Rollout, [rollout_key(i) for i in ids])
        return sorted((r for r in found if r.status in ACTIVE), key=lambda r: r.id)

    def turn(self, status: RolloutStatus) -> str | None:
        """The id of the rollout in `status` the last cycle served last: the next cycle starts after it."""
        item = self._get(rollout_turn_key(status))
        return str(deserialize(item)["after"]) if item else None

    def set_turn(self, status: RolloutStatus, after: str, *, read: str | None) -> bool:
        """Record the rollout in `status` this cycle served last, on the condition that the turn is still
        `read` (what this cycle started from; None: there was none). False when another cycle moved it
        meanwhile: that turn stands. Only the leading shard, under its lease, writes it."""
        request: dict[str, Any] = {
            "TableName": self.table_name,
            "Item": serialize({**rollout_turn_key(status), "after": after}),
            "ConditionExpression": "attribute_not_exists(PK)",
        }
        if read is not None:
            request |= {
                "ConditionExpression": "#after = :read",
                "ExpressionAttributeNames": {"#after": "after"},
                "ExpressionAttributeValues": {":read": {"S": read}},
            }
        # A retry after a lost answer sees its own write and reads as refused: one lost turn counted
        # too many, nothing else.
        return conditional_write(lambda: self._client.put_item(**request), name="PutItem") is None

    def start(self, rollout: Rollout, worker_ids: Sequence[str], *, actor: str) -> Rollout:
        """Store the rollout RUNNING with its member pages and its audit item, in one transaction."""
        ids = sorted(set(worker_ids))
        if len(ids) != len(worker_ids) or len(ids) != rollout.total:
            raise ValueError("a rollout's total counts its distinct workers")
        if rollout.total > MAX_ROLLOUT_WORKERS:
            raise ValueError("a rollout covers at most MAX_ROLLOUT_WORKERS workers")
        size = MEMBER_PAGE_SIZE
        pages = [ids[i : i + size] for i in range(0, len(ids), size)]
        if len(pages) + 2 > _MAX_TRANSACTION_ITEMS:
            raise ValueError("a rollout's member pages, item and audit fit in one transaction")
        now = utcnow()
        stored = rollout.model_copy(
            update={
                "version": 1,
                "created_at": now,
                "updated_at": now,
                "member_page_size": size,
                "worker_ids": [],
            }
        )
        members = [
            self._put(member_page_item(stored.id, n, page), "attribute_not_exists(PK)")
            for n, page in enumerate(pages)
        ]
        self._transact(
            [
                self._put(self._item(stored), "attribute_not_exists(PK)"),
                self._audit(stored, "RolloutStarted", actor, stored.reason, None),
                *members,
            ],
            {0: lambda _: Conflict("rollout", stored.id, None, f"rollout {stored.id} already exists")},
            written=stored,
        )
        return stored

    def save(
        self,
        rollout: Rollout,
        changes: dict[str, Any],
        *,
        actor: str,
        action: str | None = None,
        reason: str | None = None,
    ) -> Rollout:
        """Write a rollout read at `rollout.version` in `rollout.status`; StaleWrite (409, naming the
        status now) when it moved since, NotFound when it is gone."""
        now = utcnow()
        updated = Rollout.model_validate(
            {**rollout.model_dump(), **changes, "version": rollout.version + 1, "updated_at": now}
        )
        put = self._put(
            self._item(updated),
            "#v = :v AND #s = :s",
            {":v": rollout.version, ":s": str(rollout.status)},
            {"#v": "version", "#s": "status"},
        )

        def stale(current: dict[str, Any] | None) -> Exception:
            if current is None:
                return NotFound("rollout", rollout.id)
            status = current_status(Rollout, current)
            return StaleWrite(
                "rollout",
                rollout.id,
                status,
                f"rollout {rollout.id} changed concurrently; it is now {status}",
            )

        items = [put]
        if action is not None:
            previous = str(rollout.status) if rollout.status != updated.status else None
            items.append(self._audit(updated, action, actor, reason, previous))
        refusals: dict[int, Refusal] = {0: stale}
        if updated.finished != rollout.finished:
            # Its member pages start (or stop) expiring with it. A page gone means the rollout's own
            # retention passed before this save: what it scoped can no longer be read.
            pages = self._member_page_updates(updated)
            gone: Refusal = lambda _: NotFound("rollout members", rollout.id)  # noqa: E731
            refusals |= {len(items) + n: gone for n in range(len(pages))}
            items += pages
        self._transact(items, refusals, written=updated)
        return updated
