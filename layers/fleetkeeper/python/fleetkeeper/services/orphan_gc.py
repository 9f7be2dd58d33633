"""Orphan GC's circuit breaker as a use case: gate one discovery pass, and let an operator confirm.

The rule itself is in `fleetkeeper.domain.orphan_breaker`; this module keeps the breaker's item in step
with each pass (held back, resumed, confirmation spent) and publishes an audit event when it trips,
resumes, or is confirmed. docs/operations.md describes the operator's side.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.domain.errors import Conflict, StaleWrite
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.orphan_breaker import BreakerDecision, OrphanBreaker, decide, share_percent
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context

# At most this many worker ids in one audit event (EventBridge caps an entry at 256 KB).
MAX_IDS_IN_EVENT = 100
DETAIL_HELD_BACK = "Orphan GC Held Back"
DETAIL_RESUMED = "Orphan GC Resumed"
DETAIL_CONFIRMED = "Orphan GC Confirmed"


def gate(ctx: Context, region: str, suspects: Sequence[str], *, live: int, now: datetime) -> BreakerDecision:
    """Whether this pass may retire its suspects, recording the breaker's new state.

    A lost race on the breaker's item (an operator confirmed meanwhile) is not taken as a success:
    the decision stands for this pass and the next pass decides on a fresh read.
    """
    settings = ctx.settings
    current = ctx.breakers.read(region)
    decision = decide(
        current,
        suspects,
        live=live,
        max_share_percent=settings.orphan_gc_max_share_percent,
        now=now,
    )
    share = round(share_percent(len(suspects), live), 1)
    held = sorted(suspects)
    try:
        if decision is BreakerDecision.HOLD:
            if current is None or current.held_back != held:
                base = current or OrphanBreaker(region=region)
                ctx.breakers.save(
                    current,
                    base.model_copy(
                        update={
                            "held_back": held,
                            "live_workers": live,
                            "share_percent": share,
                            "tripped_at": now if not base.holding else base.tripped_at,
                        }
                    ),
                )
                _publish(ctx, DETAIL_HELD_BACK, region, held, live_workers=live, share_percent=share)
            logger.warning(
                "orphan GC held back by its circuit breaker",
                region=region,
                held_back=len(held),
                live_workers=live,
                share_percent=share,
                max_share_percent=settings.orphan_gc_max_share_percent,
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


def confirm(
    ctx: Context,
    region: str,
    *,
    actor: str,
    expected: Sequence[str] | None = None,
    now: datetime | None = None,
) -> OrphanBreaker:
    """Confirm the workers the breaker holds back in `region`: the next pass retires them (if it finds
    no other suspect) within the confirmation's lifetime. A conflict when nothing is held back, or when
    `expected` (the set the operator looked at) is no longer what is held back."""
    now = now or utcnow()
    current = ctx.breakers.read(region)
    if current is None or not current.holding:
        raise Conflict(
            "orphan-gc-breaker",
            region,
            "closed",
            f"orphan GC holds nothing back in {region}; nothing to confirm",
        )
    if expected is not None and sorted(set(expected)) != current.held_back:
        raise Conflict(
            "orphan-gc-breaker",
            region,
            "holding",
            f"orphan GC now holds back {len(current.held_back)} other workers in {region}; read them again",
        )
    confirmed = ctx.breakers.save(
        current,
        current.model_copy(
            update={
                "confirmed_ids": list(current.held_back),
                "confirmed_by": actor,
                "confirmed_at": now,
                "confirmed_until": now + timedelta(seconds=ctx.settings.orphan_gc_confirmation_ttl_seconds),
            }
        ),
    )
    _publish(ctx, DETAIL_CONFIRMED, region, confirmed.confirmed_ids, confirmed_by=actor)
    logger.info(
        "orphan GC confirmed", region=region, confirmed_by=actor, workers=len(confirmed.confirmed_ids)
    )
    return confirmed


def breakers(ctx: Context) -> list[OrphanBreaker]:
    """Every region's breaker that discovery ever recorded (a region without one never tripped)."""
    return ctx.breakers.list_all()


def _publish(ctx: Context, detail_type: str, region: str, ids: Sequence[str], **extra: object) -> None:
    detail = {"region": region, "count": len(ids), "worker_ids": list(ids[:MAX_IDS_IN_EVENT]), **extra}
    try:
        ctx.audit.publish(detail_type, detail)
    except (ClientError, BotoCoreError, RuntimeError):
        # The breaker's item holds the same facts; the event is the notification, not the record.
        logger.exception("orphan GC event not published", region=region, detail_type=detail_type)
