"""`rollback_on_alarms`: before a RUNNING or PAUSED rollout's step, its CloudWatch alarms are read in one
call; one in ALARM starts the rollout's rollback (docs/rollouts.md, "Rollback")."""

from __future__ import annotations

from collections import Counter

from fleetkeeper.domain.errors import Conflict, StaleWrite
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.rollouts import Blocked, Rollout, RolloutStatus
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context
from fleetkeeper.services.rollouts.commands import begin_rollback


def held_by_alarms(ctx: Context, rollout: Rollout, counters: Counter[str]) -> bool:
    """Read the rollout's `rollback_on_alarms` (one DescribeAlarms call); one in ALARM starts its
    rollback. True when the rollout must not step this cycle: it is rolling back now, or its alarms
    could not be read (it stays where it is and they are read again next cycle)."""
    if not rollout.rollback_on_alarms:
        return False
    try:
        firing = ctx.alarms().in_alarm(rollout.rollback_on_alarms)
    except Exception:  # CloudWatch failing never halts the cycle or the other rollouts
        logger.exception("rollout alarms unreadable", rollout_id=rollout.id)
        counters["rollout_alarm_errors"] += 1
        _show_held(ctx, rollout, "its alarms cannot be read; it waits until they can", counters)
        return True
    if not firing:
        return False
    name = firing[0]
    try:
        begin_rollback(ctx, rollout, actor=f"alarm:{name}", reason=f"alarm {name} is in ALARM")
    except StaleWrite:
        counters["rollout_step_conflicts"] += 1
        return True
    except Conflict:
        # The rollback cannot start from here: the operator decides.
        logger.exception("rollback on alarm refused", rollout_id=rollout.id, alarm=name)
        counters["rollout_alarm_rollbacks_refused"] += 1
        _show_held(
            ctx,
            rollout,
            f"alarm {name} is in ALARM and its rollback was refused: decide with rollback or cancel",
            counters,
        )
        return True
    counters["rollout_alarm_rollbacks"] += 1
    return True


def _show_held(ctx: Context, rollout: Rollout, detail: str, counters: Counter[str]) -> None:
    """Say in the rollout's `blocked` why a RUNNING rollout takes no step, once (a write only when it
    changes). A PAUSED one keeps its own reason (its checkpoint); its next step sets `blocked` anew."""
    current = rollout.blocked
    if rollout.status != RolloutStatus.RUNNING or (
        current is not None and (current.reason, current.detail) == ("alarms", detail)
    ):
        return
    blocked = Blocked(reason="alarms", detail=detail, since=utcnow())
    try:
        ctx.rollouts.save(rollout, {"blocked": blocked}, actor=f"rollout:{rollout.id}")
    except StaleWrite:
        counters["rollout_step_conflicts"] += 1
