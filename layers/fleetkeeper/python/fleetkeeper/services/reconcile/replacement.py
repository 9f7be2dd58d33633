"""Replacing a worker surge-first through the door: what expiry and repair both do (docs/rollouts.md,
"Replacing expired workers"; docs/repair.md).

1. The door admits the disruption ahead of its drain: from then on the worker is owned (nobody else
   replaces or drains it) and counted in its pool's budgets. One held back waits for a later cycle.
2. A new worker of the same template, pool and region, its id derived from the old one's and the
   purpose, so an attempt repeated after a crash finds the replacement it made instead of making a
   second. One that ended (its launch failed, it was terminated) does not count: the next id of the
   sequence is tried, until MAX_REPLACEMENT_ATTEMPTS of them ended in this episode (`episode_since`):
   a repair that ended before its drain leaves its replacement to scale-down, and a later sickness of
   the same worker is a new episode with attempts of its own. In a pool at its `max_workers` there is
   no room to surge: the old worker is drained first, and the pool's capacity policy brings the pool
   back to its target (max_workers exists only with a policy; counted `_drain_first`).
3. The drain of the old worker, through the same door as the same owner: at once, or (`wait_running`)
   once the replacement is RUNNING, or at `start_by` whatever the replacement does.

Counters are named `<counted_as>_<what>`: `_held_<why>`, `_changed`, `_replacements`,
`_replacement_exists`, `_replacement_failed`, `_waiting_replacement`, `_drains`, `_drain_refused`,
`_no_longer_due` (the worker read afresh failed the plan's `expect`).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from fleetkeeper.domain.admission import Ask, Held, WaitReason
from fleetkeeper.domain.errors import Conflict, NoLongerDue, PoolFull, PoolNotActive
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, DrainThen, Worker
from fleetkeeper.observability import logger
from fleetkeeper.services import admission, drains, workers
from fleetkeeper.services.context import Context

# Replacements of one worker that may end before it is drained, in one episode; then it waits for an
# operator.
MAX_REPLACEMENT_ATTEMPTS: Final = 3
# A replacement in one of these can no longer take the old worker's place.
_ENDED: Final = frozenset({WorkerStatus.FAILED, WorkerStatus.TERMINATING, WorkerStatus.TERMINATED})


def replacement_id(worker_id: str, purpose: str, attempt: int = 0) -> str:
    """The id of the worker that replaces `worker_id` for `purpose` on its `attempt`-th try: the same on
    every cycle."""
    key = f"{worker_id}#{purpose}" if attempt == 0 else f"{worker_id}#{purpose}#{attempt}"
    return "w-" + hashlib.sha256(key.encode()).hexdigest()[:16]


def may_replace(worker: Worker) -> bool:
    """RUNNING, no drain running and no other status asked for: what an actor proposes; whether it may
    go is the door's to say."""
    return (
        worker.status == WorkerStatus.RUNNING
        and (worker.drain is None or worker.drain.outcome != DrainOutcome.RUNNING)
        and worker.desired_status in {None, WorkerStatus.RUNNING}
    )


@dataclass(frozen=True)
class Replacement:
    """One surge-first replacement: who asks, for what, and how the old worker's drain goes."""

    ask: Ask
    # What the replacement ids derive from, and the prefix of the counters.
    purpose: str
    counted_as: str
    reason: str
    then: DrainThen = DrainThen.TERMINATE
    timeout_seconds: int | None = None
    wait_running: bool = False
    start_by: datetime | None = None
    # What the worker must still be when its admission and its drain are written (a repair: sick).
    expect: admission.Expect | None = None
    # When this episode began (a repair: the sickness); ended replacements made before it belong to an
    # earlier episode and use up none of this one's attempts. None: every one counts.
    episode_since: datetime | None = None


def replace(
    ctx: Context,
    door: admission.Door,
    worker_id: str,
    plan: Replacement,
    counters: Counter[str],
    *,
    now: datetime,
) -> None:
    """Admit, replace and (when due) drain one worker, as the module says."""
    prefix = plan.counted_as
    ask = plan.ask
    # The caller read the worker before: the door reads it afresh; its admission holds it meanwhile.
    try:
        admitted = admission.hold_ahead(ctx, door, worker_id, ask, expect=plan.expect)
    except NoLongerDue:
        counters[f"{prefix}_no_longer_due"] += 1
        door.release(worker_id, ask)  # an admission an earlier cycle made ahead, if any
        return
    if isinstance(admitted, Held):
        counters[f"{prefix}_held_{admitted.why}"] += 1
        door.release(worker_id, ask)  # an admission an earlier cycle made ahead, if any
        return
    if not may_replace(admitted):
        counters[f"{prefix}_changed"] += 1
        door.release(admitted, ask)
        return
    late = plan.start_by is not None and now >= plan.start_by
    full = False
    try:
        made = ensure_replacement(ctx, admitted, plan, counters)
    except PoolFull:
        made, full = None, True
        counters[f"{prefix}_drain_first"] += 1
    except PoolNotActive:
        # The pool closed since the door read it: no replacement, so no drain either, unless it is late.
        made = None
        if not late:
            counters[f"{prefix}_held_{WaitReason.POOL_NOT_ACTIVE}"] += 1
            door.release(admitted, ask)
            return
    if made is None and not late and not full:
        counters[f"{prefix}_replacement_failed"] += 1
        logger.error("every replacement of a worker ended; it is not drained", worker_id=worker_id)
        door.release(admitted, ask)
        return
    if plan.wait_running and not late and made is not None and made.status != WorkerStatus.RUNNING:
        counters[f"{prefix}_waiting_replacement"] += 1
        return
    try:
        started = drains.open_drain(
            ctx,
            door,
            worker_id,
            ask,
            actor=ask.actor,
            reason=plan.reason,
            timeout_seconds=plan.timeout_seconds,
            then=plan.then,
            expect=plan.expect,
        )
    except NoLongerDue:
        # Healthy again since the cycle read it: the replacement stays, scale-down judges it.
        counters[f"{prefix}_no_longer_due"] += 1
        door.release(worker_id, ask)
        return
    if isinstance(started, Held):
        # Protected or its pool closed meanwhile: the admission made ahead is given back now, not at
        # its lease's end. The replacement stays; the pool's scale-down judges it as any other worker.
        counters[f"{prefix}_drain_refused"] += 1
        door.release(worker_id, ask)
        return
    counters[f"{prefix}_drains"] += 1


def ensure_replacement(
    ctx: Context, worker: Worker, plan: Replacement, counters: Counter[str]
) -> Worker | None:
    """Make the worker's replacement, or find the live one an earlier attempt made; None when the
    episode's every attempt has ended."""
    ended = attempt = 0
    while ended < MAX_REPLACEMENT_ATTEMPTS:
        new_id = replacement_id(worker.id, plan.purpose, attempt)
        attempt += 1
        try:
            made = workers.create_worker(
                ctx.store,
                template=worker.template,
                region=worker.region,
                pool=worker.pool,
                actor=plan.ask.actor,
                worker_id=new_id,
                # A worker a rollback pinned to an older launch keeps that launch: its replacement must
                # not bring back the image the rollback took out.
                pinned_image_id=worker.pinned_image_id,
                pinned_instance_type=worker.pinned_instance_type,
            )
        except (PoolNotActive, PoolFull):
            raise
        except Conflict:
            found = ctx.store.find_worker(new_id)
            if found is None or found.status in _ENDED:
                # It cannot take the place: the next id of the sequence.
                since = plan.episode_since
                earlier = found is not None and since is not None and found.created_at < since
                ended += 0 if earlier else 1
                continue
            counters[f"{plan.counted_as}_replacement_exists"] += 1  # an earlier attempt made it
            return found
        counters[f"{plan.counted_as}_replacements"] += 1
        return made
    return None
