"""Orphan GC's circuit breaker as a use case: gate one discovery pass, and let an operator confirm.

The rule itself is in `fleetkeeper.domain.orphan_breaker`; this module keeps the breaker in step with
each pass (held back, resumed, confirmation in use or spent) and publishes an audit event when it trips,
resumes, or is confirmed. The held-back and confirmed workers are pages of ids beside the breaker's item
(store/breakers.py), so a mass disappearance of tens of thousands of workers is held, shown page by
page, confirmed and retired like a small one. docs/operations.md describes the operator's side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.domain.errors import Conflict, StaleWrite
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.orphan_breaker import (
    PREVIEW_IDS,
    BreakerDecision,
    IdSet,
    OrphanBreaker,
    decide,
    fingerprint,
    share_percent,
)
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context
from fleetkeeper.store.breakers import IncompleteIdSet
from fleetkeeper.store.table import Page

MAX_IDS_IN_EVENT = PREVIEW_IDS
DETAIL_HELD_BACK = "Orphan GC Held Back"
DETAIL_RESUMED = "Orphan GC Resumed"
DETAIL_CONFIRMED = "Orphan GC Confirmed"


@dataclass(frozen=True)
class BreakerSummary:
    """A breaker with the first ids of each of its sets (the rest: `held_back_page`)."""

    breaker: OrphanBreaker
    held_back: list[str]
    confirmed_ids: list[str]


@dataclass(frozen=True)
class HeldBackPage:
    region: str
    held: IdSet | None
    page: Page[str]


def gate(
    ctx: Context,
    region: str,
    suspects: Sequence[str],
    *,
    live: int,
    now: datetime,
    retire_per_pass: int | None = None,
) -> BreakerDecision:
    """Whether this pass may retire its suspects, recording the breaker's new state.

    `retire_per_pass` is how many suspects the pass will retire: a confirmation whose workers take more
    passes than one stays in use (its lifetime renewed by each pass) until a pass retires the last of
    them. A lost race on the breaker's item (an operator confirmed meanwhile) is not taken as a success:
    the decision stands for this pass and the next pass decides on a fresh read.
    """
    settings = ctx.settings
    current = ctx.breakers.read(region)
    held = sorted(set(suspects))
    decision = decide(
        current,
        held,
        live=live,
        max_share_percent=settings.orphan_gc_max_share_percent,
        now=now,
        confirmed_ids=lambda: _confirmed_ids(ctx, current),
    )
    share = round(share_percent(len(held), live), 1)
    try:
        if decision is BreakerDecision.HOLD:
            _hold(ctx, current, region, held, live=live, share=share, now=now)
        elif (
            decision is BreakerDecision.CONFIRMED
            and current is not None
            and retire_per_pass is not None
            and len(held) > retire_per_pass
        ):
            # More confirmed workers than one pass retires: the confirmation lives on for the next passes.
            ttl = timedelta(seconds=settings.orphan_gc_confirmation_ttl_seconds)
            until = max(current.confirmed_until or now, now + ttl)
            ctx.breakers.save(current, current.model_copy(update={"confirmed_until": until}))
            logger.info(
                "orphan GC retiring confirmed workers over several passes",
                region=region,
                left=len(held),
                per_pass=retire_per_pass,
                confirmed_until=until.isoformat(),
            )
        elif current is not None and (current.holding or current.confirmed_until is not None):
            # Resumed: below the limit again, or confirmed (the confirmation is spent by this pass).
            ctx.breakers.save(current, OrphanBreaker(region=region))
            how = "confirmed" if decision is BreakerDecision.CONFIRMED else "below the limit"
            _publish(
                ctx,
                DETAIL_RESUMED,
                region,
                held,
                how=how,
                confirmed_by=current.confirmed_by if decision is BreakerDecision.CONFIRMED else None,
            )
            logger.info("orphan GC resumed", region=region, how=how, orphans=len(held))
    except StaleWrite:
        logger.info("orphan GC breaker changed concurrently; the next pass decides again", region=region)
    return decision


def _hold(
    ctx: Context,
    current: OrphanBreaker | None,
    region: str,
    held: list[str],
    *,
    live: int,
    share: float,
    now: datetime,
) -> None:
    if current is None or current.held is None or current.held.fingerprint != fingerprint(held):
        # A new held-back set: its pages first, then the item that refers to them.
        id_set = ctx.breakers.write_ids(region, held, now=now)
        base = current or OrphanBreaker(region=region)
        try:
            ctx.breakers.save(
                current,
                base.model_copy(
                    update={
                        "held": id_set,
                        "live_workers": live,
                        "share_percent": share,
                        "tripped_at": now if not base.holding else base.tripped_at,
                    }
                ),
            )
        except StaleWrite:
            ctx.breakers.discard(region, id_set)
            raise
        _publish(ctx, DETAIL_HELD_BACK, region, held, live_workers=live, share_percent=share)
    logger.warning(
        "orphan GC held back by its circuit breaker",
        region=region,
        held_back=len(held),
        live_workers=live,
        share_percent=share,
        max_share_percent=ctx.settings.orphan_gc_max_share_percent,
    )


def _confirmed_ids(ctx: Context, breaker: OrphanBreaker | None) -> list[str]:
    """The confirmed workers, read from their pages; none (so nothing is covered) if they cannot be."""
    if breaker is None or breaker.confirmed is None:
        return []
    try:
        return ctx.breakers.ids(breaker.region, breaker.confirmed)
    except IncompleteIdSet as missing:
        logger.error("orphan GC confirmation unreadable; holding", region=breaker.region, error=str(missing))
        return []


def confirm(
    ctx: Context,
    region: str,
    *,
    actor: str,
    expected: Sequence[str] | None = None,
    expected_set: str | None = None,
    now: datetime | None = None,
) -> BreakerSummary:
    """Confirm the workers the breaker holds back in `region`: the passes that follow retire them (if
    they find no other suspect) within the confirmation's lifetime. A conflict when nothing is held
    back, or when what the operator looked at (`expected` ids, or the `expected_set` fingerprint the
    breaker showed) is no longer what is held back."""
    now = now or utcnow()
    current = ctx.breakers.read(region)
    if current is None or current.held is None:
        raise Conflict(
            "orphan-gc-breaker",
            region,
            "closed",
            f"orphan GC holds nothing back in {region}; nothing to confirm",
        )
    held = current.held
    looked_at = [fingerprint(expected)] if expected is not None else []
    if expected_set is not None:
        looked_at.append(expected_set)
    if any(seen != held.fingerprint for seen in looked_at):
        raise Conflict(
            "orphan-gc-breaker",
            region,
            "holding",
            f"orphan GC now holds back {held.count} other workers in {region}; read them again",
        )
    confirmed = ctx.breakers.save(
        current,
        current.model_copy(
            update={
                "confirmed": held,
                "confirmed_by": actor,
                "confirmed_at": now,
                "confirmed_until": now + timedelta(seconds=ctx.settings.orphan_gc_confirmation_ttl_seconds),
            }
        ),
    )
    first = ctx.breakers.ids_page(region, held).items[:MAX_IDS_IN_EVENT]
    _publish(ctx, DETAIL_CONFIRMED, region, first, count=held.count, confirmed_by=actor)
    logger.info("orphan GC confirmed", region=region, confirmed_by=actor, workers=held.count)
    return BreakerSummary(confirmed, held_back=first, confirmed_ids=first)


def breakers(ctx: Context) -> list[BreakerSummary]:
    """Every region's breaker that discovery ever recorded (a region without one never tripped), with the
    first ids of its sets."""
    return [_summary(ctx, b) for b in ctx.breakers.list_all()]


def _summary(ctx: Context, breaker: OrphanBreaker) -> BreakerSummary:
    previews: dict[str, list[str]] = {}
    for id_set in breaker.id_sets():
        if id_set.pages_key not in previews:
            previews[id_set.pages_key] = ctx.breakers.ids_page(breaker.region, id_set).items[
                :MAX_IDS_IN_EVENT
            ]
    return BreakerSummary(
        breaker,
        held_back=previews[breaker.held.pages_key] if breaker.held else [],
        confirmed_ids=previews[breaker.confirmed.pages_key] if breaker.confirmed else [],
    )


def held_back_page(
    ctx: Context, region: str, *, next_token: str | None = None, expected_set: str | None = None
) -> HeldBackPage:
    """One page of the workers held back in `region`, in order (empty when nothing is held back). With
    `expected_set`, a conflict when the held-back set is no longer that one (paging would mix sets)."""
    breaker = ctx.breakers.read(region)
    held = breaker.held if breaker is not None else None
    if expected_set is not None and (held is None or held.fingerprint != expected_set):
        raise Conflict(
            "orphan-gc-breaker",
            region,
            "holding" if held else "closed",
            f"the workers held back in {region} changed; read them again from the first page",
        )
    if breaker is None or held is None:
        return HeldBackPage(region, None, Page([], None))
    return HeldBackPage(region, held, ctx.breakers.ids_page(region, held, next_token))


def _publish(ctx: Context, detail_type: str, region: str, ids: Sequence[str], **extra: object) -> None:
    detail = {"region": region, "count": len(ids), "worker_ids": list(ids[:MAX_IDS_IN_EVENT]), **extra}
    try:
        ctx.audit.publish(detail_type, detail)
    except (ClientError, BotoCoreError, RuntimeError):
        # The breaker's item holds the same facts; the event is the notification, not the record.
        logger.exception("orphan GC event not published", region=region, detail_type=detail_type)
