"""Tooling only: apply a status EC2 observed. Deployed on its own API resource with its own IAM policy
(infra/api.py); the operator policy explicitly denies it."""

from __future__ import annotations

from fleetkeeper.api.errors import responses
from fleetkeeper.api.params import WorkerId
from fleetkeeper.api.principal import caller
from fleetkeeper.api.routes import new_router
from fleetkeeper.api.schemas import InternalStatusRequest, WorkerView
from fleetkeeper.services import workers
from fleetkeeper.services.context import default_context

router = new_router()


@router.post(
    "/api/internal/workers/<worker_id>/status",
    responses=responses({200: ("the worker", WorkerView)}, 404, 409),
)
def set_observed_status(worker_id: WorkerId, body: InternalStatusRequest) -> WorkerView:
    # Audit and terminated_by both name the signing principal: a body cannot speak for someone else.
    actor = caller(router.current_event)
    worker = workers.record_observed_status(
        default_context(),
        worker_id,
        body.status,
        actor=actor,
        reason=body.terminated_reason,
        terminated_by=actor,
    )
    return WorkerView.of(worker)
