"""Creating workers and moving them through their lifecycle."""

from __future__ import annotations

from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker, new_id
from fleetkeeper.store.repository import FleetStore


def create_worker(
    store: FleetStore,
    *,
    template: str,
    region: str,
    pool: str | None = None,
    actor: str,
    worker_id: str | None = None,
) -> Worker:
    """A new PENDING worker of a known template, in a known pool; the reconciler launches it."""
    known_template = store.find_template(template)
    if known_template is None:
        raise InvalidInput("template", f"unknown template '{template}'")
    if pool is not None and store.find_pool(pool) is None:
        raise InvalidInput("pool", f"unknown pool '{pool}'")
    worker = Worker(
        id=worker_id or new_id("w"),
        template=template,
        region=region,
        pool=pool,
        status=WorkerStatus.PENDING,
        capacity=known_template.capacity,
    )
    return store.create_worker(worker, actor=actor)
