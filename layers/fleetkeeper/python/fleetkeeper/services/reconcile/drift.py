"""Drift in the reconcile cycle: what each due worker's machine differs in from its template now.

The newest image of each template is read once per cycle and region (one DescribeImages per distinct
`ami_name_filter` and region, shared by every worker of those templates), never once per worker. A
worker's drift rides on the conditional write its step makes anyway, and a step that writes nothing
gets one only when the drift changed: an unchanged drift costs no write. A DescribeImages that fails
leaves the drift of that template's workers as it was (counted `drift_image_errors`); every other
template's drift is still computed, and no step waits for it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Final

from fleetkeeper.domain.drift import DRIFT_STATUSES, drift_of
from fleetkeeper.domain.reconcile import Ec2Call, Outcome
from fleetkeeper.observability import logger
from fleetkeeper.pool import ContextThreadPool
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.actions import Work
from fleetkeeper.services.reconcile.images import ImageKey, NewestImages

# DescribeImages of one cycle run on this many threads; the calls are few (templates x regions).
IMAGE_PARALLELISM: Final = 4
# The steps that write the worker with their changes (apply_step, scale_down). A launch, a retirement
# of an abandoned launch, a drain to start or a backoff write what they always write: the worker's
# drift waits for a cycle in which its step is one of these.
_UNWRITTEN_CALLS: Final = frozenset({Ec2Call.LAUNCH, Ec2Call.RETIRE_LAUNCHED})


def _writes_changes(item: Work) -> bool:
    step = item.step
    return (
        item.error is None
        and step.call not in _UNWRITTEN_CALLS
        and step.drain_then is None
        and step.outcome != Outcome.RETRY
    )


def desired_images(
    keys: Sequence[ImageKey], images: NewestImages, counters: Counter[str]
) -> dict[ImageKey, str | None]:
    """The newest image of each (filter, region), one DescribeImages each; a key whose read failed is
    left out (logged and counted), so its templates' drift stays as it was."""

    def newest(key: ImageKey) -> tuple[ImageKey, str | None, BaseException | None]:
        name_filter, region = key
        try:
            return key, images.newest(name_filter, region), None
        except Exception as error:  # one template's images, not the cycle
            return key, None, error

    found: dict[ImageKey, str | None] = {}
    with ContextThreadPool(max_workers=IMAGE_PARALLELISM) as pool:
        for key, image_id, error in pool.map(newest, keys):
            if error is None:
                found[key] = image_id
                continue
            counters["drift_image_errors"] += 1
            counters["reconcile_errors"] += 1
            logger.error(
                "DescribeImages failed; drift of its templates left as it was",
                ami_name_filter=key[0],
                region=key[1],
                error=f"{type(error).__name__}: {error}"[:500],
            )
    return found


def plan_drift(
    ctx: Context,
    work: Sequence[Work],
    now: datetime,
    counters: Counter[str],
    images: NewestImages | None = None,
) -> None:
    """Add each due worker's changed drift to the changes its step writes.

    Runs after every other planning step (scale-down rewrites a step's changes), before any acts.
    """
    eligible = [item for item in work if _writes_changes(item)]
    # The status the step leaves the worker in decides whether it has a machine to differ.
    relevant = [
        item
        for item in eligible
        if (item.step.target or item.worker.status) in DRIFT_STATUSES or item.worker.drift is not None
    ]
    if not relevant:
        return
    catalogue = {t.name: t for t in ctx.store.list_templates()}
    keys = sorted(
        {
            (catalogue[item.worker.template].ami_name_filter, item.worker.region)
            for item in relevant
            if item.worker.template in catalogue
            and (item.step.target or item.worker.status) in DRIFT_STATUSES
        }
    )
    found = desired_images(keys, images or NewestImages(ctx), counters)
    for item in relevant:
        worker = item.worker
        status = item.step.target or worker.status
        template = catalogue.get(worker.template)
        if status not in DRIFT_STATUSES:
            drift = None
        elif template is None:
            continue  # a worker of a deleted template: nothing to compare with
        else:
            key = (template.ami_name_filter, worker.region)
            if key not in found:
                counters["drift_unknown"] += 1
                continue
            drift = drift_of(worker.model_copy(update={"status": status}), template, found[key], now)
        if drift == worker.drift:
            continue
        if worker.drift is None:
            counters["drift_found"] += 1
        else:
            counters["drift_cleared" if drift is None else "drift_changed"] += 1
        item.step = replace(item.step, changes={**item.step.changes, "drift": drift})
