"""Reading the audit trail of a worker, a pool or a rollout, newest first."""

from __future__ import annotations

from typing import Literal

from fleetkeeper.domain.models import AuditEvent
from fleetkeeper.services.context import Context
from fleetkeeper.store.repository import Page

AuditedEntity = Literal["worker", "pool", "rollout"]


def events(
    ctx: Context, entity: AuditedEntity, entity_id: str, *, limit: int, next_token: str | None
) -> Page[AuditEvent]:
    """One page of the entity's events; NotFound when it never existed (an empty trail of a real one
    is an empty page)."""
    page = ctx.store.audit_page(entity, entity_id, limit=limit, next_token=next_token)
    if not page.items and next_token is None:
        # Raises NotFound for an unknown id, so a typo is not read as "nothing happened".
        if entity == "worker":
            ctx.store.get_worker(entity_id)
        elif entity == "pool":
            ctx.store.get_pool(entity_id)
        else:
            ctx.rollouts.get(entity_id)
    return page
