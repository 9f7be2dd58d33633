"""Orphan GC's circuit breaker: what it holds back per region, page by page, and an operator's
confirmation."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Path, Query

from fleetkeeper.api.errors import responses
from fleetkeeper.api.params import PageToken
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.schemas import ConfirmOrphansRequest, HeldBackPage, OrphanBreakerList, OrphanBreakerView
from fleetkeeper.domain.models import REGION_PATTERN
from fleetkeeper.domain.orphan_breaker import FINGERPRINT_PATTERN
from fleetkeeper.services import orphan_gc
from fleetkeeper.services.context import default_context

router = ResourceRouter(
    "orphans",
    "Orphan GC's circuit breaker: the workers it holds back per region, and an operator's confirmation.",
)

RegionPath = Annotated[str, Path(pattern=REGION_PATTERN, examples=["eu-west-1"])]


@router.get(
    "/api/v1/reconcile/orphans",
    summary="List each region's orphan GC breaker",
    description="Per region: whether the breaker holds workers back, the first of them, and the "
    "confirmation in force if any. No error but the common ones.",
    responses=responses({200: ("each region's orphan GC breaker", OrphanBreakerList)}),
)
def list_orphan_breakers() -> OrphanBreakerList:
    return OrphanBreakerList(items=[OrphanBreakerView.of(b) for b in orphan_gc.breakers(default_context())])


@router.get(
    "/api/v1/reconcile/orphans/<region>/held-back",
    summary="Page through the workers a region's breaker holds back",
    description="The held-back worker ids in order; pass the first page's `held_back_set` to make sure "
    "the set does not change while paging. 409 if it changed; 422 names a region or token of the wrong "
    "form; 404 only for a path no route takes.",
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
    summary="Confirm what a region's breaker holds back, so GC retires it",
    description="The next discovery passes retire the confirmed workers. 409 if nothing is held back, or "
    "if the set named (`worker_ids` or `held_back_set`) is no longer the one held back; 422 names a "
    "field of the wrong form.",
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
