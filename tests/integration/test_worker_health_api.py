"""POST /api/v1/workers/{id}/health: a worker's agent (its own worker only) or tooling (any worker)
reports its machine's health, which GET /api/v1/workers/{id} shows; everyone else gets 403."""

from __future__ import annotations

import pytest

from fleetkeeper.domain.repair import HealthSource, HealthStatus, Signal
from fleetkeeper.services import repair
from fleetkeeper_local.controlplane import (
    DEFAULT_CALLER,
    TOOLING_CALLER,
    WORKER_AGENT_CALLER,
    worker_agent_session,
)

pytestmark = pytest.mark.integration

SICK = {"status": "unhealthy", "reason": "disk /var full"}


def test_given_the_worker_agent_then_a_report_is_recorded_and_shown(control_plane, running_worker) -> None:
    worker = running_worker()

    status, body = control_plane.api(
        "POST",
        f"/api/v1/workers/{worker.id}/health",
        SICK,
        caller=worker_agent_session(worker.ec2_instance_id),
    )

    assert status == 200, body
    health = body["health"]
    assert (health["status"], health["source"], health["reason"]) == (
        "unhealthy",
        "reported",
        "disk /var full",
    )
    assert health["repair_in_progress"] is False
    status, shown = control_plane.api("GET", f"/api/v1/workers/{worker.id}")
    assert (status, shown["health"]["status"], shown["health"]["since"]) == (
        200,
        "unhealthy",
        health["since"],
    )


def test_given_a_report_and_a_failed_check_then_get_shows_every_signal_the_one_that_counts_first(
    control_plane, running_worker
) -> None:
    worker = running_worker()
    control_plane.api("POST", f"/api/v1/workers/{worker.id}/health", SICK, caller=TOOLING_CALLER)
    failed = Signal(HealthStatus.UNHEALTHY, HealthSource.STATUS_CHECK, "instance status impaired")
    repair.record_health(control_plane.ctx, worker.id, [failed], actor="discovery-gc")

    status, shown = control_plane.api("GET", f"/api/v1/workers/{worker.id}")

    assert status == 200
    health = shown["health"]
    assert [(s["status"], s["source"], s["reason"]) for s in health["signals"]] == [
        ("unhealthy", "reported", "disk /var full"),
        ("unhealthy", "status_check", "instance status impaired"),
    ]
    assert health["signals"][0]["since"] == health["since"]
    assert health["signals"][1]["since"] >= health["since"]
    assert (health["repair_in_progress"], health["repair"]) == (False, None)

    control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/health", {"status": "healthy"}, caller=TOOLING_CALLER
    )
    status, shown = control_plane.api("GET", f"/api/v1/workers/{worker.id}")

    assert [s["source"] for s in shown["health"]["signals"]] == ["status_check"]
    assert (shown["health"]["status"], shown["health"]["source"]) == ("unhealthy", "status_check")


def test_given_a_report_then_healthy_withdraws_it(control_plane, running_worker) -> None:
    worker = running_worker()
    control_plane.api("POST", f"/api/v1/workers/{worker.id}/health", SICK, caller=TOOLING_CALLER)

    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/health", {"status": "healthy"}, caller=TOOLING_CALLER
    )

    assert (status, body["health"]["status"], body["health"]["source"]) == (200, "healthy", "reported")


def test_given_an_operator_then_the_health_route_answers_403_and_records_nothing(
    control_plane, running_worker
) -> None:
    worker = running_worker()

    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/health", SICK, caller=DEFAULT_CALLER
    )

    assert (status, body["error"]) == (403, "FORBIDDEN")
    assert DEFAULT_CALLER in body["message"]
    assert control_plane.ctx.store.get_worker(worker.id).health is None


@pytest.mark.parametrize("whose", ["another machine", "the role itself"])
def test_given_a_worker_agent_not_of_the_worker_then_403_names_why_and_records_nothing(
    control_plane, running_worker, whose
) -> None:
    worker, other = running_worker(), running_worker()
    agent = worker_agent_session(other.ec2_instance_id) if whose == "another machine" else WORKER_AGENT_CALLER

    status, body = control_plane.api("POST", f"/api/v1/workers/{worker.id}/health", SICK, caller=agent)

    assert (status, body["error"]) == (403, "FORBIDDEN"), body
    assert "may report only on its own worker" in body["message"]
    assert worker.ec2_instance_id in body["message"]
    assert control_plane.ctx.store.get_worker(worker.id).health is None


def test_given_tooling_then_it_reports_on_any_worker(control_plane, running_worker) -> None:
    worker = running_worker()

    status, body = control_plane.api(
        "POST", f"/api/v1/workers/{worker.id}/health", SICK, caller=TOOLING_CALLER
    )

    assert (status, body["health"]["status"], body["health"]["source"]) == (200, "unhealthy", "reported")


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"status": "sick"}, "body.status"),
        ({"status": "unhealthy", "reason": "x" * 501}, "body.reason"),
        ({"status": "unhealthy", "source": "status_check"}, "body.source"),
        ({}, "body.status"),
    ],
)
def test_given_a_bad_body_then_422_names_the_field(control_plane, running_worker, payload, field) -> None:
    worker = running_worker()

    status, body = control_plane.api(
        "POST",
        f"/api/v1/workers/{worker.id}/health",
        payload,
        caller=worker_agent_session(worker.ec2_instance_id),
    )

    assert status == 422, body
    assert field in [d["field"] for d in body["details"]]


def test_given_an_unknown_worker_then_404(control_plane) -> None:
    status, body = control_plane.api(
        "POST", "/api/v1/workers/w-nope/health", SICK, caller=worker_agent_session("i-0123456789abcdef0")
    )

    assert (status, body["error"]) == (404, "NOT_FOUND")


def test_given_a_pools_repair_settings_then_they_are_kept_and_a_bad_one_is_named(control_plane) -> None:
    status, body = control_plane.api(
        "PUT", "/api/v1/pools/labs", {"repair": {"max_unhealthy_percent": 40, "status_check": "3m"}}
    )

    assert status == 201, body
    assert body["repair"] == {
        "max_unhealthy_percent": 40,
        "status_check": "3m",
        "unreachable": "15m",
        "connection_lost": "15m",
        "reported": "5m",
    }
    status, view = control_plane.api("GET", "/api/v1/pools/labs/disruption")
    assert (status, view["repair"]) == (200, {"max_unhealthy_percent": 40, "blocked": None})
    status, body = control_plane.api("PUT", "/api/v1/pools/labs", {"repair": {"reported": "soon"}})
    assert status == 422, body
    assert "body.repair.reported" in [d["field"] for d in body["details"]]
