"""The audit trail of workers, pools and rollouts: who did what, from which status to which, why and when."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Query
from pydantic import BaseModel, Field

from fleetkeeper.api.errors import responses
from fleetkeeper.api.params import PageToken, ResourceName, RolloutId, WorkerId
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.domain.models import AuditEvent
from fleetkeeper.services import audit
from fleetkeeper.services.context import default_context
from fleetkeeper.store.audit import MAX_AUDIT_PAGE

router = ResourceRouter(
    "audit",
    "Who did what to a worker, pool or rollout, from which status to which, why and when.",
)


class AuditEventView(BaseModel):
    at: datetime = Field(description="when")
    actor: str = Field(
        description="who: the authenticated principal (an IAM ARN) or the fleetkeeper component"
    )
    action: str = Field(description="what, e.g. DrainStarted, WorkerTransitioned")
    from_status: str | None = Field(description="status before")
    to_status: str | None = Field(description="status after")
    reason: str | None = Field(description="why, as given by the caller or the component")
    details: dict[str, str | int | None]

    @classmethod
    def of(cls, event: AuditEvent) -> AuditEventView:
        return cls.model_validate(event.model_dump(exclude={"entity", "entity_id"}))


class AuditPage(BaseModel):
    items: list[AuditEventView] = Field(description="newest first")
    next_token: str | None


def _page(entity: audit.AuditedEntity, entity_id: str, limit: int, next_token: str | None) -> AuditPage:
    page = audit.events(default_context(), entity, entity_id, limit=limit, next_token=next_token)
    return AuditPage(items=[AuditEventView.of(e) for e in page.items], next_token=page.next_token)


@router.get(
    "/api/v1/workers/<worker_id>/events",
    summary="The worker's audit trail, newest first",
    description="One page of the worker's audit events; follow `next_token` until there is none. 404 if "
    "there is no such worker.",
    responses=responses({200: ("one page of the trail", AuditPage)}, 404, 422),
)
def worker_events(
    worker_id: WorkerId,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 50,
    next_token: PageToken = None,
) -> AuditPage:
    return _page("worker", worker_id, limit, next_token)


@router.get(
    "/api/v1/pools/<name>/events",
    summary="The pool's audit trail, newest first",
    description="One page of the pool's audit events; follow `next_token` until there is none. 404 if "
    "there is no such pool.",
    responses=responses({200: ("one page of the trail", AuditPage)}, 404, 422),
)
def pool_events(
    name: ResourceName,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 50,
    next_token: PageToken = None,
) -> AuditPage:
    return _page("pool", name, limit, next_token)


@router.get(
    "/api/v1/rollouts/<rollout_id>/events",
    summary="The rollout's audit trail, newest first",
    description="One page of the rollout's audit events; follow `next_token` until there is none. 404 if "
    "there is no such rollout.",
    responses=responses({200: ("one page of the trail", AuditPage)}, 404, 422),
)
def rollout_events(
    rollout_id: RolloutId,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 50,
    next_token: PageToken = None,
) -> AuditPage:
    return _page("rollout", rollout_id, limit, next_token)
