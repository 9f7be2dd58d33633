"""Templates and pools."""

from __future__ import annotations

from fleetkeeper.domain.models import Pool, WorkerTemplate
from fleetkeeper.store.repository import FleetStore


def put_template(store: FleetStore, template: WorkerTemplate, *, actor: str) -> WorkerTemplate:
    """Create or replace a template (last writer wins only if nobody wrote in between)."""
    current = store.find_template(template.name)
    expected_version = current.version if current else 0
    return store.put_template(template.model_copy(update={"version": expected_version}), actor=actor)


def ensure_pool(store: FleetStore, name: str, *, actor: str, description: str | None = None) -> Pool:
    """The pool, created active if it does not exist yet."""
    existing = store.find_pool(name)
    if existing is not None:
        return existing
    return store.create_pool(Pool(name=name, description=description), actor=actor)
