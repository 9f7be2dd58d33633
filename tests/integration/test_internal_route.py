"""The internal route answers only the stage's tooling principals, whatever the spelling of its path."""

from __future__ import annotations

from urllib.parse import unquote

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper_local.controlplane import DEFAULT_CALLER, TOOLING_CALLER
from fleetkeeper_local.stack import LOCAL_ACCOUNT

pytestmark = pytest.mark.integration

TERMINATE = {"status": "TERMINATED", "terminated_reason": "EC2 instance not found"}


def test_given_the_default_operator_then_the_internal_route_answers_403_and_changes_nothing(
    control_plane, running_worker
):
    worker = running_worker()

    status, body = control_plane.api("POST", f"/api/internal/workers/{worker.id}/status", TERMINATE)

    assert (status, body["error"]) == (403, "FORBIDDEN")
    assert DEFAULT_CALLER in body["message"]
    assert "tooling principals" in body["message"]
    assert control_plane.ctx.store.get_worker(worker.id).status == WorkerStatus.RUNNING


@pytest.mark.parametrize(
    "tooling",
    [
        TOOLING_CALLER,
        # How API Gateway names a caller who assumed the tooling role: a session of it.
        f"arn:aws:sts::{LOCAL_ACCOUNT}:assumed-role/fleetkeeper-local-tooling/gc-run-42",
    ],
)
def test_given_the_tooling_principal_then_the_internal_route_answers_200(
    control_plane, running_worker, tooling
):
    worker = running_worker()

    status, body = control_plane.api(
        "POST", f"/api/internal/workers/{worker.id}/status", TERMINATE, caller=tooling
    )

    assert (status, body["status"], body["terminated_by"]) == (200, "TERMINATED", tooling)


@pytest.mark.parametrize(
    "impostor",
    [
        # The tooling role's name in another account, a user of that name, a session of another role.
        "arn:aws:iam::210987654321:role/fleetkeeper-local-tooling",
        f"arn:aws:iam::{LOCAL_ACCOUNT}:user/fleetkeeper-local-tooling",
        f"arn:aws:sts::{LOCAL_ACCOUNT}:assumed-role/fleetkeeper-local-operator/fleetkeeper-local-tooling",
        f"arn:aws:iam::{LOCAL_ACCOUNT}:role/fleetkeeper-local-tooling-2",
    ],
)
def test_given_a_principal_resembling_the_tooling_one_then_403(control_plane, running_worker, impostor):
    worker = running_worker()

    status, _ = control_plane.api(
        "POST", f"/api/internal/workers/{worker.id}/status", TERMINATE, caller=impostor
    )

    assert status == 403
    assert control_plane.ctx.store.get_worker(worker.id).status == WorkerStatus.RUNNING


# Spellings of the internal path: percent-encoded, other case, doubled slashes, dot segments, trailing dots
# and slashes. On a deployed stage the resource policy's Deny names /api/internal/* as API Gateway
# matches it; a spelling that reaches the function under another resource path is the route's to refuse.
VARIANTS = [
    "/api/%69nternal/workers/{id}/status",
    "/api/%49NTERNAL/workers/{id}/status",
    "/api/INTERNAL/workers/{id}/status",
    "/api/Internal/workers/{id}/status",
    "/api//internal/workers/{id}/status",
    "//api/internal/workers/{id}/status",
    "/api/internal//workers/{id}/status",
    "/api/internal./workers/{id}/status",
    "/api/internal/workers/{id}/status.",
    "/api/internal/workers/{id}/status/",
    "/api/./internal/workers/{id}/status",
    "/api/v1/../internal/workers/{id}/status",
    "/api/internal%2Fworkers/{id}/status",
    "/api/%2569nternal/workers/{id}/status",
]


@pytest.mark.parametrize("template", VARIANTS)
@pytest.mark.parametrize("decoded", [False, True], ids=["as-sent", "percent-decoded"])
def test_given_a_variant_spelling_of_the_internal_path_then_the_operator_is_refused(
    control_plane, running_worker, template, decoded
):
    worker = running_worker()
    path = template.format(id=worker.id)
    # API Gateway may hand the function the path as sent or decoded; the local adapter decodes it.
    path = unquote(path) if decoded else path

    status, body = control_plane.api("POST", path, TERMINATE)

    assert (status, body["error"]) in ((403, "FORBIDDEN"), (404, "NOT_FOUND")), body
    assert control_plane.ctx.store.get_worker(worker.id).status == WorkerStatus.RUNNING


@pytest.mark.parametrize(
    "path", ["/api/%69nternal/workers/{id}/status", "/api/internal/workers/{id}/status/"]
)
def test_given_a_variant_that_reaches_the_internal_route_then_the_route_itself_answers_403(
    control_plane, running_worker, path
):
    # Decoded, `%69nternal` is `internal`; the router ignores a trailing slash. Either request may carry
    # an IAM resource path the gateway's Deny does not name: the route's own check is what refuses it.
    worker = running_worker()

    status, body = control_plane.api("POST", unquote(path.format(id=worker.id)), TERMINATE)

    assert (status, body["error"]) == (403, "FORBIDDEN")
    assert control_plane.ctx.store.get_worker(worker.id).status == WorkerStatus.RUNNING
