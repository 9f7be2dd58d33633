"""Orphan GC's circuit breaker: what it holds back per region, page by page, and an operator's
confirmation."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Path, Query

from fleetkeeper.api.errors import responses
from fleetkeeper.api.params import PageToken
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import new_router
from fleetkeeper.api.schemas import ConfirmOrphansRequest, HeldBackPage, OrphanBreakerList, OrphanBreakerView
from fleetkeeper.domain.models import REGION_PATTERN
from fleetkeeper.domain.orphan_breaker import FINGERPRINT_PATTERN
from fleetkeeper.services import orphan_gc
from fleetkeeper.services.context import default_context

router = new_router()

RegionPath = Annotated[str, Path(pattern=REGION_PATTERN, examples=["eu-west-1"])]


@router.get(
    "/api/v1/reconcile/orphans",
    responses=responses({200: ("each region's orphan GC breaker", OrphanBreakerList)}),
)
def list_orphan_breakers() -> OrphanBreakerList:
    return OrphanBreakerList(items=[OrphanBreakerView.of(b) for b in orphan_gc.breakers(default_context())])


@router.get(
    "/api/v1/reconcile/orphans/<region>/held-back",
    responses=responses(
        {200: ("one page of the workers held back in the region, in order", HeldBackPage)}, 409
    ),
)
def held_back(
    region: RegionPath,
    next_token: PageToken = None,
    held_back_set: Annotated[
        str | None,
        Query(
            pattern=FINGERPRINT_PATTERN,
            description="the held_back_set of the first page: 409 if the set changed while paging",
        ),
    ] = None,
) -> HeldBackPage:
    found = orphan_gc.held_back_page(
        default_context(), region, next_token=next_token, expected_set=held_back_set
    )
    return HeldBackPage.of(found)


@router.post(
    "/api/v1/reconcile/orphans/confirm",
    responses=responses(
        {200: ("the breaker, with the confirmation the next discovery passes use", OrphanBreakerView)},
        409,
    ),
)
def confirm_orphans(body: ConfirmOrphansRequest) -> OrphanBreakerView:
    summary = orphan_gc.confirm(
        default_context(),
        body.region,
        actor=caller(router.current_event),
        expected=body.worker_ids,
        expected_set=body.held_back_set,
    )
    return OrphanBreakerView.of(summary)
