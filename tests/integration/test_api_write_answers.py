"""A write answers exactly what the next GET of the same entity returns: the same fields, the same values,
the same JSON spelling (4, not 4.0; a count, not null). Every write route of the contract is here, or
named below with the reason it has no GET to compare with."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Final

import pytest

from fleetkeeper.api.app import contract
from fleetkeeper.domain.orphan_breaker import OrphanBreaker
from fleetkeeper.services import orphan_gc
from fleetkeeper_local.controlplane import DEFAULT_CALLER, TOOLING_CALLER, api_event, call_api

pytestmark = pytest.mark.integration

LAB: Final = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 4}
REGION: Final = "us-east-1"


def _raw(method: str, path: str, body: Any = None, *, caller: str | None = None) -> tuple[int, str]:
    """The status and the JSON text exactly as the API wrote it."""
    text = json.dumps(body) if body is not None else None
    answer = call_api(api_event(method, path, body=text, caller=caller or DEFAULT_CALLER))
    return int(answer["statusCode"]), str(answer["body"])


def _spelt(text: str) -> str:
    """JSON in one spelling that keeps what a client sees: 4 and 4.0 stay apart, key order does not."""
    return json.dumps(json.loads(text), sort_keys=True)


class Scenario:
    """One write: the set-up it needs, the write itself, and the GET that reads the entity back."""

    def __init__(self, control_plane: Any, running_worker: Any) -> None:
        self.api = control_plane.api
        self.ctx = control_plane.ctx
        self.running_worker = running_worker

    def busy_worker(self, **kwargs: Any) -> str:
        """A RUNNING worker with an instance on it, so a drain stays open while the test reads it."""
        worker = self.running_worker(**kwargs)
        assert self.api("POST", "/api/v1/instances", {"worker_id": worker.id})[0] == 201
        return str(worker.id)

    def draining_worker(self) -> str:
        worker_id = self.busy_worker(pool="labs")
        assert self.api("POST", f"/api/v1/workers/{worker_id}/drain", {})[0] == 202
        return worker_id

    def rollout(self) -> str:
        worker_id = self.running_worker(template="lab").id
        status, started = self.api("POST", "/api/v1/rollouts", {"worker_ids": [worker_id]})
        assert status == 202, started
        return str(started["id"])


Write = tuple[str, str, Any]  # method, path, body
Setup = Callable[[Scenario], tuple[Write, str]]  # the write, and the path of the GET that reads it back


def _template(s: Scenario) -> tuple[Write, str]:
    # Without drain_timeout_hours: the default once answered 4.0 where every read says 4.
    return ("PUT", "/api/v1/templates/lab", LAB), "/api/v1/templates/lab"


def _pool(s: Scenario) -> tuple[Write, str]:
    return ("PUT", "/api/v1/pools/labs", {"description": "lab sessions"}), "/api/v1/pools/labs"


def _pool_drain(s: Scenario) -> tuple[Write, str]:
    s.busy_worker(pool="labs")
    return ("POST", "/api/v1/pools/labs/drain", {"timeout_seconds": 3600}), "/api/v1/pools/labs"


def _pool_cancel(s: Scenario) -> tuple[Write, str]:
    s.busy_worker(pool="labs")
    assert s.api("POST", "/api/v1/pools/labs/drain", {"timeout_seconds": 3600})[0] == 202
    return ("POST", "/api/v1/pools/labs/cancel-drain", {"reason": "not today"}), "/api/v1/pools/labs"


def _worker(s: Scenario) -> tuple[Write, str]:
    assert s.api("PUT", "/api/v1/templates/lab", LAB)[0] == 201
    # The write under test creates a second worker; the GET reads the one it answered about.
    assert s.api("POST", "/api/v1/workers", {"template": "lab"})[0] == 201
    return ("POST", "/api/v1/workers", {"template": "lab"}), "/api/v1/workers/{id}"


def _desired(s: Scenario) -> tuple[Write, str]:
    worker_id = s.running_worker().id
    path = f"/api/v1/workers/{worker_id}"
    return ("PUT", f"{path}/desired-status", {"desired_status": "STOPPED"}), path


def _do_not_disrupt(s: Scenario) -> tuple[Write, str]:
    worker_id = s.running_worker().id
    until = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    path = f"/api/v1/workers/{worker_id}"
    return ("PUT", f"{path}/do-not-disrupt", {"do_not_disrupt_until": until}), path


def _drain(s: Scenario) -> tuple[Write, str]:
    worker_id = s.busy_worker(pool="labs")
    path = f"/api/v1/workers/{worker_id}/drain"
    return ("POST", path, {"reason": "kernel patch", "timeout_seconds": 3600}), path


def _move_deadline(s: Scenario) -> tuple[Write, str]:
    path = f"/api/v1/workers/{s.draining_worker()}/drain"
    return ("PATCH", path, {"timeout_seconds": 7200, "reason": "the exam runs late"}), path


def _cancel_drain(s: Scenario) -> tuple[Write, str]:
    path = f"/api/v1/workers/{s.draining_worker()}"
    return ("POST", f"{path}/cancel-drain", {"reason": "patch postponed"}), path


def _operation(s: Scenario) -> tuple[Write, str]:
    path = f"/api/v1/workers/{s.running_worker().id}/operations"
    return ("POST", path, {"name": "collect-system-info"}), path + "#items/0"


def _instance(s: Scenario) -> tuple[Write, str]:
    worker_id = s.running_worker().id
    return ("POST", "/api/v1/instances", {"worker_id": worker_id}), "/api/v1/instances/{id}"


def _instance_state(s: Scenario) -> tuple[Write, str]:
    worker_id = s.running_worker().id
    _, placed = s.api("POST", "/api/v1/instances", {"worker_id": worker_id})
    path = f"/api/v1/instances/{placed['id']}"
    return ("POST", f"{path}/state", {"state": "RUNNING", "reason": "booted"}), path


def _rollout(s: Scenario) -> tuple[Write, str]:
    worker_id = s.running_worker().id
    return ("POST", "/api/v1/rollouts", {"worker_ids": [worker_id], "reason": "AMI"}), "/api/v1/rollouts/{id}"


def _rollout_move(move: str, *before: str) -> Setup:
    def setup(s: Scenario) -> tuple[Write, str]:
        path = f"/api/v1/rollouts/{s.rollout()}"
        for earlier in before:
            assert s.api("POST", f"{path}/{earlier}", {})[0] == 200
        return ("POST", f"{path}/{move}", {"reason": "error rate up"}), path

    return setup


def _observed_status(s: Scenario) -> tuple[Write, str]:
    path = f"/api/v1/workers/{s.running_worker().id}"
    write = ("POST", f"/api/internal/workers/{path.rsplit('/', 1)[1]}/status", {"status": "STOPPED"})
    return write, path


def _health(s: Scenario) -> tuple[Write, str]:
    path = f"/api/v1/workers/{s.running_worker().id}"
    return ("POST", f"{path}/health", {"status": "unhealthy", "reason": "disk /var full"}), path


def _confirm_orphans(s: Scenario) -> tuple[Write, str]:
    held = s.ctx.breakers.write_ids(REGION, ["w-gone-1", "w-gone-2"])
    tripped = OrphanBreaker(
        region=REGION, held=held, live_workers=4, share_percent=50.0, tripped_at=datetime.now(UTC)
    )
    s.ctx.breakers.save(None, tripped)
    assert [b.breaker.region for b in orphan_gc.breakers(s.ctx)] == [REGION]
    write = ("POST", "/api/v1/reconcile/orphans/confirm", {"region": REGION})
    return write, "/api/v1/reconcile/orphans#items/0"


SCENARIOS: Final[dict[tuple[str, str], Setup]] = {
    ("PUT", "/api/v1/templates/{name}"): _template,
    ("PUT", "/api/v1/pools/{name}"): _pool,
    ("POST", "/api/v1/pools/{name}/drain"): _pool_drain,
    ("POST", "/api/v1/pools/{name}/cancel-drain"): _pool_cancel,
    ("POST", "/api/v1/workers"): _worker,
    ("PUT", "/api/v1/workers/{worker_id}/desired-status"): _desired,
    ("PUT", "/api/v1/workers/{worker_id}/do-not-disrupt"): _do_not_disrupt,
    ("POST", "/api/v1/workers/{worker_id}/drain"): _drain,
    ("PATCH", "/api/v1/workers/{worker_id}/drain"): _move_deadline,
    ("POST", "/api/v1/workers/{worker_id}/cancel-drain"): _cancel_drain,
    ("POST", "/api/v1/workers/{worker_id}/operations"): _operation,
    ("POST", "/api/v1/instances"): _instance,
    ("POST", "/api/v1/instances/{instance_id}/state"): _instance_state,
    ("POST", "/api/v1/rollouts"): _rollout,
    ("POST", "/api/v1/rollouts/{rollout_id}/pause"): _rollout_move("pause"),
    ("POST", "/api/v1/rollouts/{rollout_id}/resume"): _rollout_move("resume", "pause"),
    ("POST", "/api/v1/rollouts/{rollout_id}/cancel"): _rollout_move("cancel"),
    ("POST", "/api/v1/rollouts/{rollout_id}/rollback"): _rollout_move("rollback"),
    ("POST", "/api/internal/workers/{worker_id}/status"): _observed_status,
    ("POST", "/api/v1/workers/{worker_id}/health"): _health,
    ("POST", "/api/v1/reconcile/orphans/confirm"): _confirm_orphans,
}
# Writes whose answer is not an entity a GET reads back, each with its reason.
NOT_READ_BACK: Final[dict[tuple[str, str], str]] = {
    # The force step starts at once and ends what runs on the worker: the drain moves on by itself
    # between the answer and any read (its answer is checked against the drain in test_drain_controls).
    ("POST", "/api/v1/workers/{worker_id}/drain/force"): "the drain moves on by itself at once",
}


def test_given_the_contract_then_every_write_route_is_compared_with_its_get_or_says_why_not():
    writes = {
        (method.upper(), path)
        for path, item in contract()["paths"].items()
        for method in item
        if method in ("post", "put", "patch")
    }
    assert writes == set(SCENARIOS) | set(NOT_READ_BACK)


def _read_back(get: str, written: dict[str, Any]) -> tuple[int, str]:
    path, _, pointer = get.partition("#")
    status, text = _raw("GET", path.replace("{id}", str(written.get("id"))))
    if not pointer:
        return status, text
    found: Any = json.loads(text)
    for part in pointer.split("/"):
        found = found[int(part)] if part.isdigit() else found[part]
    return status, json.dumps(found)


@pytest.mark.parametrize("route", list(SCENARIOS), ids=[f"{m} {p}" for m, p in SCENARIOS])
def test_given_a_write_then_its_answer_is_what_the_next_get_returns(control_plane, running_worker, route):
    (method, path, body), get = SCENARIOS[route](Scenario(control_plane, running_worker))
    caller = TOOLING_CALLER if path.startswith("/api/internal/") or path.endswith("/health") else None

    status, written = _raw(method, path, body, caller=caller)
    read_status, read = _read_back(get, json.loads(written))

    assert 200 <= status < 300, written
    assert read_status == 200, read
    assert _spelt(written) == _spelt(read)
