"""Workers: list, create, read, and the desired status an operator asks for."""

from __future__ import annotations

from http import HTTPStatus
from typing import Annotated

from aws_lambda_powertools.event_handler import Response
from aws_lambda_powertools.event_handler.openapi.params import Query

from fleetkeeper.api.errors import JSON, Forbidden, responses
from fleetkeeper.api.params import PageToken, WorkerId
from fleetkeeper.api.principal import caller, is_one_of, session_name
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.schemas import (
    CreateWorkerRequest,
    DesiredStatusRequest,
    DoNotDisruptRequest,
    HealthRequest,
    WorkerPage,
    WorkerView,
)
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.repair import HealthSource, Signal
from fleetkeeper.services import repair, workers
from fleetkeeper.services.context import default_context

router = ResourceRouter(
    "workers",
    "The machines of the fleet: list, create, read, what an operator wants of one (desired status, "
    "protection from disruption) and what its agent says of its health. Drains, operations and audit "
    "trails have their own tags.",
)


@router.get(
    "/api/v1/workers",
    summary="List workers, filtered and page by page",
    description="One page of workers, filtered by status, region, pool, template and drift; follow "
    "`next_token` until there is none. 422 names a filter of the wrong form or a `next_token` this "
    "query did not issue.",
    responses=responses({200: ("one page of workers", WorkerPage)}),
)
def list_workers(
    *,
    status: Annotated[WorkerStatus | None, Query()] = None,
    region: Annotated[str | None, Query(max_length=32)] = None,
    pool: Annotated[str | None, Query(max_length=64)] = None,
    template: Annotated[str | None, Query(max_length=64)] = None,
    drifted: Annotated[
        bool | None,
        Query(
            description="true: only workers whose machine differs from their template (docs/rollouts.md); "
            "false: only those that do not. Decided per worker read, so a page may hold fewer than `limit`"
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    next_token: PageToken = None,
) -> WorkerPage:
    page = default_context().store.list_workers(
        status=status,
        region=region,
        pool=pool,
        template=template,
        drifted=drifted,
        limit=limit,
        next_token=next_token,
    )
    return WorkerPage(items=[WorkerView.of(w) for w in page.items], next_token=page.next_token)


@router.post(
    "/api/v1/workers",
    summary="Create a worker of a template, PENDING until the reconciler launches it",
    description="Stores a PENDING worker with its template's capacity, in a pool if one is named; the "
    "reconciler launches its machine within a cycle. 422 names an unknown `template` or `pool`, or a "
    "`region` the stage does not manage; 409 if the worker's id is taken, POOL_NOT_ACTIVE if the pool is "
    "draining or inactive, POOL_FULL if it already has its capacity policy's `max_workers` workers.",
    responses=responses({201: ("the new worker, PENDING", WorkerView)}, 409),
)
def create_worker(body: CreateWorkerRequest) -> Response[WorkerView]:
    context = default_context()
    worker = workers.create_worker(
        context.store,
        template=body.template,
        region=body.region or context.settings.default_region,
        pool=body.pool,
        actor=caller(router.current_event),
        regions=context.settings.regions,
    )
    return Response(status_code=HTTPStatus.CREATED, content_type=JSON, body=WorkerView.of(worker))


@router.get(
    "/api/v1/workers/<worker_id>",
    summary="Read a worker",
    description="The worker as stored, with its latest drain and its drift from its template. 404 if "
    "there is no such worker (a terminated worker is kept, TERMINATED).",
    responses=responses({200: ("the worker", WorkerView)}, 404),
)
def get_worker(worker_id: WorkerId) -> WorkerView:
    return WorkerView.of(default_context().store.get_worker(worker_id))


@router.put(
    "/api/v1/workers/<worker_id>/desired-status",
    summary="Ask for a worker to be RUNNING, STOPPED or TERMINATED",
    description="Records the status the operator wants; the reconciler moves the worker there, draining "
    "it first when it runs instances. 404 if there is no such worker; 409 if it is TERMINATED; 422 for "
    "any other status.",
    responses=responses({200: ("the worker", WorkerView)}, 404, 409),
)
def put_desired_status(worker_id: WorkerId, body: DesiredStatusRequest) -> WorkerView:
    worker = workers.set_desired_status(
        default_context().store,
        worker_id,
        WorkerStatus(body.desired_status),
        actor=caller(router.current_event),
    )
    return WorkerView.of(worker)


@router.put(
    "/api/v1/workers/<worker_id>/do-not-disrupt",
    summary="Protect a worker from voluntary disruption until a moment, or lift it",
    description="Keeps scale-down, expiry and rollouts away from the worker until `do_not_disrupt_until` "
    "(a timestamp or a duration from now, within 366 days); null lifts it. 404 if there is no such "
    "worker; 409 if it is TERMINATED; 422 for a moment past or too far ahead.",
    responses=responses({200: ("the worker", WorkerView)}, 404, 409),
)
def put_do_not_disrupt(worker_id: WorkerId, body: DoNotDisruptRequest) -> WorkerView:
    worker = workers.set_do_not_disrupt_until(
        default_context().store, worker_id, body.do_not_disrupt_until, actor=caller(router.current_event)
    )
    return WorkerView.of(worker)


@router.post(
    "/api/v1/workers/<worker_id>/health",
    summary="Report a worker's health, as its agent sees it",
    description="`unhealthy` (with a reason, at most 500 characters) starts a repair once it has stood "
    "for the pool's `repair.reported` toleration (docs/repair.md); `healthy` withdraws it. Allowed to "
    "the stage's worker-agent and tooling principals only (403 to others); a worker agent's session, "
    "named after its instance as an instance profile's is, may report on its own worker only (403 "
    "otherwise). 404 if there is no such worker; "
    "409 if it is TERMINATED; 422 names a field of the wrong form.",
    responses=responses({200: ("the worker, with its health", WorkerView)}, 403, 404, 409),
)
def post_health(worker_id: WorkerId, body: HealthRequest) -> WorkerView:
    context = default_context()
    actor = caller(router.current_event)
    settings = context.settings
    # The gateway's resource policy denies the route to everyone else too (infra/api.py); this is the
    # check for a spelling of the path that reaches the route through another resource.
    if is_one_of(actor, settings.tooling_principals):
        pass
    elif is_one_of(actor, settings.worker_agent_principals):
        # One machine's agent must not make another worker sick: an instance profile's session is
        # named after its instance.
        worker = context.store.get_worker(worker_id)
        session = session_name(actor)
        if session is None or session != worker.ec2_instance_id:
            raise Forbidden(
                f"{actor} may report only on its own worker: its session {session or '(none)'} is not "
                f"worker {worker.id}'s instance {worker.ec2_instance_id or '(none)'}"
            )
    else:
        raise Forbidden(
            f"{actor} may not report a worker's health: only the stage's worker-agent and tooling "
            "principals may (api.worker_agent_principals, api.tooling_principals)"
        )
    signal = Signal(body.status, HealthSource.REPORTED, body.reason)
    return WorkerView.of(repair.record_health(context, worker_id, [signal], actor=actor))
