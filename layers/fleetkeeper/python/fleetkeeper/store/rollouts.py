"""Rollouts in the single table (docs/rollouts.md, docs/data-model.md).

- The rollout: `PK = ROLLOUT#<id>`, `SK = ROLLOUT`, replaced whole under a condition on its version
  and status. Listed newest first from the by_kind index (`GSI3PK = KIND#ROLLOUT`, `GSI3SK` its creation
  time and id). While it is not finished it also carries `GSI1PK = ROLLOUT#<status>` so the reconciler
  finds the running ones without a scan; a finished one leaves that index.
- One lock per worker it covers: `PK = ROLLOUTLOCK#<worker id>`, `SK = LOCK`, naming the rollout. A
  rollout takes each lock with a conditional write (absent, already ours, or held by a rollout that has
  finished), so two active rollouts never cover the same worker, whatever their scopes. A finished
  rollout's locks are not removed: the next rollout of those workers takes them over, and they expire
  with the audit retention.
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

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from functools import partial
from typing import Any, Final, cast

from fleetkeeper.domain.errors import Conflict, NotFound, StaleWrite
from fleetkeeper.domain.models import AuditEvent, utcnow
from fleetkeeper.domain.rollouts import ACTIVE, MAX_ROLLOUT_WORKERS, Rollout, RolloutStatus
from fleetkeeper.observability import logger
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.store.codec import deserialize, record_attributes, serialize, serialize_value
from fleetkeeper.store.retention import expiration
from fleetkeeper.store.schema import BY_KIND, BY_STATUS, TTL_ATTRIBUTE
from fleetkeeper.store.table import Page, Refusal, TableAccess, conditional_write, current_status

MAX_ROLLOUT_PAGE: Final = 100
# Locks taken per transaction: DynamoDB allows 100 items in one, the rollout's own item is one of them.
LOCKS_PER_TRANSACTION: Final = 99
# Lock transactions a start runs at once: 10,000 locks one transaction after another would not fit in
# API Gateway's 29 s.
LOCK_TRANSACTIONS_AT_ONCE: Final = 8
# The scope's ids per member page: 500 ids of at most 64 characters stay far inside the item budget,
# and 10,000 workers make 20 pages, written in the start's one transaction with the rollout and its audit.
MEMBER_PAGE_SIZE: Final = 500
_MAX_TRANSACTION_ITEMS: Final = 100
# The finished rollouts a lock's condition names at most before a chunk is read first (DynamoDB's IN
# takes 100 operands; a scope rolled out again mostly names one or two).
_MAX_FINISHED_IN_CONDITION: Final = 20
ROLLOUT_KIND: Final = "ROLLOUT"
# How long a lock outlives its taking when no audit retention is set: far past any rollout.
_LOCK_DAYS_DEFAULT: Final = 90


def _epoch_ms(at: datetime) -> int:
    return int(at.timestamp() * 1000)


def _held_by(holder: Rollout | None, taken_at_ms: int, stale_before_ms: int) -> str | None:
    """The status under which `holder` keeps a lock taken at `taken_at_ms` (None: it may be taken
    over). An active rollout keeps it; so, while the lock is younger than STARTING_LOCK_SECONDS, does a
    start that has not written its rollout yet (not stored) and a finished rollout's rollback on its
    way to ROLLING_BACK (the lock was taken after the rollout finished): both are STARTING."""
    if holder is not None and not holder.finished:
        return str(holder.status)
    if taken_at_ms > _finished_ms(holder) and taken_at_ms >= stale_before_ms:
        return "STARTING"
    return None


def _stale_before(now_ms: int) -> int:
    """Locks taken before this (epoch ms) are old enough that their writer has died."""
    return now_ms - STARTING_LOCK_SECONDS * 1000


def _finished_ms(rollout: Rollout | None) -> int:
    """When a finished rollout finished (epoch ms); 0 for one that was never stored."""
    if rollout is None:
        return 0
    return _epoch_ms(rollout.finished_at or rollout.updated_at)


def _holder_read(held: Mapping[str, Mapping[str, int]], worker_id: str) -> Mapping[str, int]:
    """The holder a worker's lock was read naming, with when it finished; none for a free lock."""
    return held.get(worker_id, {})


# How long a lock naming a rollout that is not stored (yet) counts as its start's: a start writes its
# rollout after its locks, within its Lambda's timeout (15 minutes at most). Younger, the lock is that
# start's, still running; older, its start died and the lock is taken over.
STARTING_LOCK_SECONDS: Final = 15 * 60


def rollout_key(rollout_id: str) -> dict[str, str]:
    return {"PK": f"ROLLOUT#{rollout_id}", "SK": "ROLLOUT"}


def rollout_turn_key(status: RolloutStatus) -> dict[str, str]:
    return {"PK": f"ROLLOUTTURN#{status}", "SK": "TURN"}


def member_page_key(rollout_id: str, page: int) -> dict[str, str]:
    return {"PK": f"ROLLOUT#{rollout_id}", "SK": f"MEMBERS#{page:05d}"}


def member_page_item(rollout_id: str, page: int, ids: Sequence[str]) -> dict[str, Any]:
    """Member page `page` of a rollout: the sorted scope's ids from position page * MEMBER_PAGE_SIZE."""
    return {**member_page_key(rollout_id, page), "ids": list(ids)}


def rollout_lock_key(worker_id: str) -> dict[str, str]:
    return {"PK": f"ROLLOUTLOCK#{worker_id}", "SK": "LOCK"}


def rollout_status_partition(status: RolloutStatus) -> str:
    return f"ROLLOUT#{status}"


class RolloutCovered(Conflict):
    """Another active rollout already covers one of the workers."""

    def __init__(self, worker_id: str, holder: str, holder_status: str | None) -> None:
        super().__init__(
            "rollout",
            holder,
            holder_status,
            f"worker {worker_id} is covered by rollout {holder}, which is {holder_status}; "
            "cancel it or wait for it to finish",
        )
        self.worker_id = worker_id

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "worker_id": self.worker_id}


class _LockTaken(Exception):
    def __init__(self, index: int) -> None:
        self.index = index


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

    def lock_holder(self, worker_id: str) -> str | None:
        item = self._get(rollout_lock_key(worker_id))
        return str(deserialize(item)["rollout_id"]) if item else None

    def lock_holders(self, worker_ids: Sequence[str]) -> dict[str, str]:
        """The rollout each of these workers' locks names (finished or not); free ones left out."""
        return self._lock_holders(worker_ids)

    def _lock_holders(self, worker_ids: Sequence[str]) -> dict[str, str]:
        """The rollout named by each of these workers' locks, read consistently; free ones left out."""
        return {w: holder for w, (holder, _) in self._locks(worker_ids).items()}

    def _locks(self, worker_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """Each of these workers' locks: the rollout it names and when it was taken (epoch ms, 0 for a
        lock stored before locks said so); free ones left out."""
        items = self._batch_get_items([rollout_lock_key(w) for w in worker_ids])
        locks = {}
        for item in items:
            plain = deserialize(item)
            worker_id = str(plain["PK"]).removeprefix("ROLLOUTLOCK#")
            locks[worker_id] = (str(plain["rollout_id"]), int(plain.get("taken_at_ms") or 0))
        return locks

    # ---- writes ------------------------------------------------------------------------------

    def _lock_put(self, worker_id: str, rollout: Rollout, takeable: Mapping[str, int]) -> dict[str, Any]:
        """Take the worker's lock: absent, already ours, or named by one of the rollouts `takeable`
        maps to when it finished (epoch ms; 0 for one that was never stored), and taken before then.

        A lock taken after its rollout finished is that rollout's rollback taking its locks, and a lock
        naming a rollout not stored is a start taking its locks: either is taken over only once it is
        older than STARTING_LOCK_SECONDS (its writer died). The condition carries the rule, so a
        holder that became active again after this start read it refuses the write."""
        days = self.audit_retention_days or _LOCK_DAYS_DEFAULT
        now = utcnow()
        now_ms = _epoch_ms(now)
        # Kept from when it is taken, not from the rollout's start: a rollback of a finished rollout
        # takes locks long after that, and one already past its TTL could vanish under it.
        item = {
            **rollout_lock_key(worker_id),
            "rollout_id": rollout.id,
            "taken_at_ms": now_ms,
            **expiration(now + timedelta(days=1), days),
        }
        condition = "attribute_not_exists(PK) OR rollout_id = :me"
        values: dict[str, Any] = {":me": rollout.id}
        if takeable:
            values[":stale"] = _stale_before(now_ms)
            for n, (holder, finished_ms) in enumerate(sorted(takeable.items())):
                condition += (
                    f" OR (rollout_id = :h{n} AND (attribute_not_exists(taken_at_ms)"
                    f" OR taken_at_ms <= :done{n} OR taken_at_ms < :stale))"
                )
                values |= {f":h{n}": holder, f":done{n}": finished_ms}
        return self._put(item, condition, values)

    def _take_locks(
        self, rollout: Rollout, worker_ids: Sequence[str], takeable: Callable[[str], Mapping[str, int]]
    ) -> int | None:
        """Put one chunk of locks, each on the condition `takeable(worker id)` names (_lock_put); None
        when all were taken, else the index of one held by another."""
        puts = [self._lock_put(w, rollout, takeable(w)) for w in worker_ids]
        try:
            self._transact(puts, {i: (lambda _, i=i: _LockTaken(i)) for i in range(len(puts))})  # type: ignore[misc]
        except _LockTaken as taken:
            return taken.index
        return None

    def _delete_lock(self, worker_id: str, rollout_id: str) -> None:
        """Give back a lock this rollout took, only if it still names it."""
        conditional_write(
            lambda: self._client.delete_item(
                TableName=self.table_name,
                Key=serialize(rollout_lock_key(worker_id)),
                ConditionExpression="rollout_id = :me",
                ExpressionAttributeValues={":me": {"S": rollout_id}},
            ),
            name="DeleteItem",
        )

    def _lock_chunk(self, rollout: Rollout, chunk: Sequence[str], known: dict[str, Rollout | None]) -> None:
        """Take one transaction's worth of locks; RolloutCovered or StaleWrite as _lock_all says, with
        none of this chunk's locks taken. `known`: the other rollouts this start has read, by id."""
        # Locks can be held by finished rollouts' leftovers (the same workers rolled out again). A chunk
        # is first tried on the condition that each lock is free, ours, or held by a finished rollout
        # this start already met (rolled again, a scope's locks mostly name one rollout, so a chunk rarely
        # needs a read of its own). Refused, its locks are read: when every holder is finished their locks
        # are taken over on the condition that each still names one of them and was taken before it
        # finished, else RolloutCovered. A lock that changed meanwhile refuses again and is read again.
        # After a read each lock's condition names only the holder read for it: a chunk's locks may name
        # up to LOCKS_PER_TRANSACTION rollouts, and a condition naming them all would pass DynamoDB's
        # 4 KB expression limit.
        shared = {h: _finished_ms(other) for h, other in known.items() if other is None or other.finished}
        if len(shared) > _MAX_FINISHED_IN_CONDITION:
            shared = {}
        takeable: Callable[[str], Mapping[str, int]] = lambda _: shared  # noqa: E731
        for attempt in range(3):
            if attempt:
                read: dict[str, Rollout | None] = {}
                held = self._takeable_holders(rollout, chunk, read)
                known.update(read)
                takeable = partial(_holder_read, held)
            if self._take_locks(rollout, chunk, takeable) is None:
                return
        raise StaleWrite("rollout", rollout.id, None, "the workers' locks kept changing; try again")

    def _takeable_holders(
        self, rollout: Rollout, chunk: Sequence[str], read: dict[str, Rollout | None]
    ) -> dict[str, dict[str, int]]:
        """By worker, the rollout holding its lock that this start may take it from (free ones and our
        own left out), with when it finished (_lock_put). RolloutCovered when an active rollout holds
        one, or a start or a rollback is taking it (status STARTING). `read`: rollouts read, by id."""
        takeable: dict[str, dict[str, int]] = {}
        stale_before = _stale_before(_epoch_ms(utcnow()))
        for worker_id, (holder, taken_at_ms) in sorted(self._locks(chunk).items()):
            if holder == rollout.id:
                continue
            if holder not in read:
                # A rollout's locks name it many times: each holder is read once.
                read[holder] = self.find(holder)
            other = read[holder]
            held = _held_by(other, taken_at_ms, stale_before)
            if held is not None:
                raise RolloutCovered(worker_id, holder, held)
            takeable[worker_id] = {holder: _finished_ms(other)}
        return takeable

    def locks_taken(self, worker_ids: Sequence[str]) -> dict[str, tuple[str, int]]:
        """Each of these workers' locks (read consistently): the rollout it names and when it was taken
        (epoch ms); free ones left out. `keeps` says whether its holder keeps it."""
        return self._locks(worker_ids)

    @staticmethod
    def keeps(holder: Rollout | None, taken_at_ms: int) -> bool:
        """Whether `holder` (None: not stored) keeps a lock taken at `taken_at_ms` from a start now: it is
        active, or it is a start or a rollback taking its locks (_held_by)."""
        stale_before = _stale_before(_epoch_ms(utcnow()))
        return _held_by(holder, taken_at_ms, stale_before) is not None

    def covers(self, worker_id: str) -> bool:
        """Whether a rollout holds the worker's lock: an active one, or one about to be (a start or a
        rollback taking its locks). The lock item is read consistently: the base table decides."""
        lock = self._locks([worker_id]).get(worker_id)
        if lock is None:
            return False
        holder, taken_at_ms = lock
        return self.keeps(self.find(holder), taken_at_ms)

    def _lock_all(self, rollout: Rollout, ids: Sequence[str]) -> None:
        """Take the lock of each worker for `rollout`, a few transactions at once; RolloutCovered (409)
        when an active rollout holds one of them, StaleWrite when they kept changing. The locks taken
        meanwhile are given back."""
        chunks = [ids[i : i + LOCKS_PER_TRANSACTION] for i in range(0, len(ids), LOCKS_PER_TRANSACTION)]
        known: dict[str, Rollout | None] = {}
        lock = partial(self._lock_chunk, known=known)
        errors: list[Exception] = []
        taken: list[str] = []
        for chunk, error in zip(chunks, self._each_chunk(lock, rollout, chunks), strict=True):
            if error is None:
                taken.extend(chunk)
            else:
                errors.append(error)
        if errors:
            self.give_back(rollout, taken)
            # A refusal naming the holder says more than a chunk that kept changing.
            raise next((e for e in errors if isinstance(e, RolloutCovered)), errors[0])

    def give_back(self, rollout: Rollout, worker_ids: Sequence[str]) -> None:
        """Release the locks this rollout took, as far as it can: a refusal stays the answer, and a lock
        left behind is taken over once it is older than STARTING_LOCK_SECONDS."""
        try:
            self._release_all(rollout, worker_ids)
        except Exception:
            logger.exception("rollout locks not given back", rollout_id=rollout.id, locks=len(worker_ids))

    def _each_chunk(
        self,
        call: Callable[[Rollout, Sequence[str]], None],
        rollout: Rollout,
        chunks: Sequence[Sequence[str]],
    ) -> list[Exception | None]:
        """`call` on every chunk, LOCK_TRANSACTIONS_AT_ONCE at a time (each in a copy of this context, so
        its AWS calls are still this function's); what each raised, in order."""
        if len(chunks) <= 1:
            errors: list[Exception | None] = []
            for chunk in chunks:
                try:
                    call(rollout, chunk)
                    errors.append(None)
                except Exception as exc:  # handed back to the caller, as the pool's future would
                    errors.append(exc)
            return errors
        with ContextThreadPool(max_workers=LOCK_TRANSACTIONS_AT_ONCE) as pool:
            futures = [pool.submit(call, rollout, c) for c in chunks]
            return [cast(Exception | None, f.exception()) for f in futures]

    def start(self, rollout: Rollout, worker_ids: Sequence[str], *, actor: str) -> Rollout:
        """Take the lock of every worker the rollout covers, then store it RUNNING with its member pages
        and its audit item, in one transaction.

        RolloutCovered (409) when an active rollout holds one of the locks; the locks taken meanwhile
        are given back. A lock held by a finished rollout is taken over."""
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
        self._lock_all(stored, ids)
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

    def begin_rollback(
        self,
        rollout: Rollout,
        changes: dict[str, Any],
        replacement_ids: Sequence[str],
        *,
        actor: str,
        reason: str | None,
    ) -> Rollout:
        """Lock the replacements the rollback will drain (another active rollout may have taken them in
        its scope since: RolloutCovered, 409), then save the rollout ROLLING_BACK under its version.

        Locks a finished rollout takes are younger than its finish, so no start takes them over while
        this rollback is on its way to ROLLING_BACK (_lock_put). A save that fails leaves them: they may
        be another rollback's of this same rollout, and a start takes them over once they are old."""
        if len(replacement_ids) > MAX_ROLLOUT_WORKERS:
            raise ValueError("a rollback covers at most MAX_ROLLOUT_WORKERS workers")
        # The replacements of the waves the rollback covers.
        self._lock_all(rollout, sorted(replacement_ids))
        return self.save(rollout, changes, actor=actor, action="RolloutRollbackStarted", reason=reason)

    def _release_all(self, rollout: Rollout, worker_ids: Sequence[str]) -> None:
        step = LOCKS_PER_TRANSACTION
        chunks = [worker_ids[i : i + step] for i in range(0, len(worker_ids), step)]
        errors = [e for e in self._each_chunk(self._release_chunk, rollout, chunks) if e is not None]
        if errors:
            raise errors[0]

    def _release_chunk(self, rollout: Rollout, worker_ids: Sequence[str]) -> None:
        for worker_id in worker_ids:
            self._delete_lock(worker_id, rollout.id)

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
