"""The local API adapter under concurrent clients: each request is served with its own event.

Powertools keeps the current event on the resolver, as Lambda runs one event per instance; the local
adapter must serve concurrent clients without mixing their bodies, path arguments or callers.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests

from fleetkeeper.domain.models import Worker
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.controlplane import ApiServer
from fleetkeeper_local.stack import free_port
from tests.integration.conftest import ControlPlane, WorkerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CLIENTS = 16
PLACEMENTS_PER_CLIENT = 3


def _caller(index: int) -> str:
    return f"arn:aws:iam::123456789012:user/client-{index:02d}"


def _client(
    url: str, index: int, worker: Worker, start: threading.Barrier, results: list[dict[str, Any]]
) -> None:
    session = requests.Session()
    headers = {"X-Fleetkeeper-Caller": _caller(index)}
    start.wait()
    for _ in range(PLACEMENTS_PER_CLIENT):
        placed = session.post(
            f"{url}/api/v1/instances", json={"worker_id": worker.id}, headers=headers, timeout=60
        )
        read = session.get(f"{url}/api/v1/workers/{worker.id}", headers=headers, timeout=60)
        results.append(
            {
                "client": index,
                "worker_id": worker.id,
                "placed_status": placed.status_code,
                "placed": placed.json(),
                "read_status": read.status_code,
                "read": read.json(),
            }
        )


@pytest.mark.parametrize("instances", [1, 2], ids=["one-instance", "two-instance-processes"])
def test_given_16_concurrent_clients_when_each_places_on_its_own_worker_then_every_answer_is_its_own(
    control_plane: ControlPlane, running_worker: WorkerFactory, store: FleetStore, instances: int
) -> None:
    # Given one worker per client, each with room for all of that client's placements
    workers = [running_worker(capacity=PLACEMENTS_PER_CLIENT) for _ in range(CLIENTS)]
    server = ApiServer(port=free_port(), instances=instances).start()
    results: list[dict[str, Any]] = []
    start = threading.Barrier(CLIENTS)
    try:
        # When 16 clients, each with its own caller, place onto their own worker at the same time
        threads = [
            threading.Thread(target=_client, args=(server.url, i, worker, start, results))
            for i, worker in enumerate(workers)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        server.stop()

    # Then no request failed, and each answer is about the request that asked
    assert len(results) == CLIENTS * PLACEMENTS_PER_CLIENT
    assert [r for r in results if r["placed_status"] != 201 or r["read_status"] != 200] == []
    assert [r for r in results if r["placed"]["worker_id"] != r["worker_id"]] == []
    assert [r for r in results if r["read"]["id"] != r["worker_id"]] == []
    # And each placement's audit item names the caller that made it
    wrong_actor = []
    for result in results:
        trail = store.audit_trail("instance", result["placed"]["id"])
        placed = [e for e in trail if e.action == "InstancePlaced"]
        if [e.actor for e in placed] != [_caller(result["client"])]:
            wrong_actor.append((result["client"], [e.actor for e in placed]))
    assert wrong_actor == []
    # And every worker holds exactly its client's placements
    assert {store.get_worker(w.id).active_instances for w in workers} == {PLACEMENTS_PER_CLIENT}
