"""Drift: how a worker's machine differs from what its template would launch now (docs/rollouts.md).

A worker is drifted when its image is not the newest one its template's `ami_name_filter` selects, when
its instance type is not the template's, or when it has lived longer than the template's
`max_lifetime_hours`. Only what is known counts: a worker launched before its image was recorded is
never reported for its image, and its age runs from its creation when its launch time is unknown.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import DesiredLaunch, Drift, DriftReason, Worker, WorkerTemplate

# Statuses in which a worker has a machine that runs (or will run again) what it was launched with.
# In any other status it has no machine to differ, so it has no drift.
DRIFT_STATUSES: Final = frozenset(
    {
        WorkerStatus.PROVISIONING,
        WorkerStatus.STARTING,
        WorkerStatus.RUNNING,
        WorkerStatus.DRAINING,
        WorkerStatus.STOPPING,
        WorkerStatus.STOPPED,
    }
)


def current_drift(worker: Worker) -> Drift | None:
    """The worker's recorded drift while it has a machine; a worker that ended keeps its last drift as
    history, but is no longer drifted."""
    return worker.drift if worker.status in DRIFT_STATUSES else None


def expires_at(worker: Worker, template: WorkerTemplate) -> datetime | None:
    """When the worker passes its template's lifetime; None when the template sets none."""
    if template.max_lifetime_hours is None:
        return None
    born = worker.launched_at or worker.created_at
    return born + timedelta(hours=template.max_lifetime_hours)


def drift_of(
    worker: Worker, template: WorkerTemplate, desired_image_id: str | None, now: datetime
) -> Drift | None:
    """The worker's drift from `template` at `now`, or None.

    `desired_image_id` is the newest image the template's filter selects in the worker's region (None
    when none matches: no image drift can be stated then). A drift already recorded keeps its `since`,
    so an unchanged drift compares equal and is not written again.
    """
    if worker.status not in DRIFT_STATUSES:
        return None
    reasons: list[DriftReason] = []
    if desired_image_id is not None and worker.image_id is not None and worker.image_id != desired_image_id:
        reasons.append(DriftReason.IMAGE)
    if worker.instance_type is not None and worker.instance_type != template.instance_type:
        reasons.append(DriftReason.INSTANCE_TYPE)
    expiry = expires_at(worker, template)
    expired = expiry is not None and expiry <= now
    if expired:
        reasons.append(DriftReason.EXPIRED)
    if not reasons:
        return None
    if worker.drift is not None:
        since = worker.drift.since
    elif expired and expiry is not None:
        # The moment it expired is known exactly; any other drift is known from when it was found.
        since = min(expiry, now)
    else:
        since = now
    return Drift(
        reasons=reasons,
        desired=DesiredLaunch(image_id=desired_image_id, instance_type=template.instance_type),
        since=since,
    )
