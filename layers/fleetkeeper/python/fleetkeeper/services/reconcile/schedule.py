"""A scheduled reconcile tick: the shard's start slot inside the period, then its cycle."""

from __future__ import annotations

import time
from collections.abc import Callable

from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.stagger import start_wait
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.cycle import CycleReport, reconcile_fleet
from fleetkeeper.triggers import ScheduleInput


def scheduled_cycle(
    ctx: Context,
    request: ScheduleInput,
    *,
    time_left: Callable[[], float],
    owner: str | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> CycleReport:
    """Wait for the shard's slot (domain/stagger.py), then run its cycle in the time that is left.

    The wait never takes more than half of what is left of the invocation, so a cycle always runs.
    """
    wait = min(start_wait(request.start_delay_seconds, request.scheduled_time, utcnow()), time_left() / 2)
    if wait > 0:
        logger.info("reconcile shard waits for its slot", seconds=round(wait, 1), shard=request.shard)
        sleep(wait)
    return reconcile_fleet(ctx, shard=request.reconcile_shard, time_left=time_left, owner=owner)
