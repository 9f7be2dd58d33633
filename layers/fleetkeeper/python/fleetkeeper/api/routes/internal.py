"""Tooling only: apply a status EC2 observed.

Locked twice (docs/api.md, "Internal routes"): API Gateway's resource policy denies /api/internal/* to
every principal but the stage's tooling principals (infra/api.py), whatever identity policy a caller
holds; and the route itself checks the signing principal against the same list. The check lives in the
route function, not in a path prefix, so any spelling of the path that reaches this route is checked.
"""

from __future__ import annotations

from fleetkeeper.api.errors import Forbidden, responses
from fleetkeeper.api.params import WorkerId
from fleetkeeper.api.principal import caller, is_one_of
from fleetkeeper.api.routes import ResourceRouter
from fleetkeeper.api.schemas import InternalStatusRequest, WorkerView
from fleetkeeper.services import workers
from fleetkeeper.services.context import default_context

router = ResourceRouter(
    "internal",
    "Tooling only (the stage's tooling principals): apply what EC2 observed about a worker.",
)


def tooling_caller() -> str:
    """The signing principal, when it is one of the stage's tooling principals; 403 otherwise."""
    actor = caller(router.current_event)
    if not is_one_of(actor, default_context().settings.tooling_principals):
        raise Forbidden(
            f"{actor} may not call the internal routes: they answer only the stage's tooling principals "
            "(api.tooling_principals in the stage's settings)"
        )
    return actor


@router.post(
    "/api/internal/workers/<worker_id>/status",
    summary="Apply a status EC2 observed to a worker (tooling only)",
    description="Moves the worker to the observed status; TERMINATED keeps the record, names the signing "
    "principal as `terminated_by`, and ends its active instances. 403 unless the caller is one of the "
    "stage's tooling principals; 404 if there is no such worker; 409 if the worker's status does not "
    "allow the move.",
    responses=responses({200: ("the worker", WorkerView)}, 403, 404, 409),
)
def set_observed_status(worker_id: WorkerId, body: InternalStatusRequest) -> WorkerView:
    # Audit and terminated_by both name the signing principal: a body cannot speak for someone else.
    actor = tooling_caller()
    worker = workers.record_observed_status(
        default_context(),
        worker_id,
        body.status,
        actor=actor,
        reason=body.terminated_reason,
        terminated_by=actor,
    )
    return WorkerView.of(worker)
