"""A worker's capacity has a ceiling, and at that ceiling every item of the worker stays under 100 KB.

Nothing on the worker item grows with its active instances (their ids are slot items beside it), so a
placement rewrites an item of the same size whatever the count; the API refuses a capacity above the
ceiling with a 422 naming the field.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.domain.errors import Conflict
from fleetkeeper.domain.lifecycle import InstanceState
from fleetkeeper.domain.models import MAX_WORKER_CAPACITY, utcnow
from fleetkeeper.services import placement
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.item_size import ITEM_BUDGET_BYTES, item_size
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.bounds import fill_worker, largest_items, largest_worker_changes
from tests.integration.conftest import ControlPlane, WorkerFactory

pytestmark = pytest.mark.integration

TEMPLATE = {"instance_type": "m5.large", "ami_name_filter": "lab-*"}


def worker_item_size(dynamodb: Any, store: FleetStore, worker_id: str) -> int:
    key = serialize({"PK": f"WORKER#{worker_id}", "SK": "WORKER"})
    return item_size(dynamodb.get_item(TableName=store.table_name, Key=key, ConsistentRead=True)["Item"])


def test_given_placements_moves_and_ends_then_the_worker_item_keeps_its_size(
    store: FleetStore, running_worker: WorkerFactory, dynamodb: Any
) -> None:
    worker = running_worker(template="wide", capacity=MAX_WORKER_CAPACITY)
    placed = [placement.place_instance(store, actor="t", worker_id=worker.id) for _ in range(12)]
    after_twelve = worker_item_size(dynamodb, store, worker.id)
    placed += [placement.place_instance(store, actor="t", worker_id=worker.id) for _ in range(12)]
    after_twenty_four = worker_item_size(dynamodb, store, worker.id)
    for instance in placed[:6]:
        store.end_instance(instance, InstanceState.COMPLETED, actor="t")

    # Only `version` and `active_instances` change with a placement: a digit more at most.
    assert after_twenty_four - after_twelve <= 2
    assert [i.id for i in store.active_instances_of(worker.id)] == sorted(i.id for i in placed[6:])
    assert store.get_worker(worker.id).active_instances == 18


def test_given_a_capacity_above_the_ceiling_then_422_names_it_and_the_ceiling_itself_is_accepted(
    control_plane: ControlPlane,
) -> None:
    above = control_plane.api(
        "PUT", "/api/v1/templates/wide", {**TEMPLATE, "capacity": MAX_WORKER_CAPACITY + 1}
    )
    at = control_plane.api("PUT", "/api/v1/templates/wide", {**TEMPLATE, "capacity": MAX_WORKER_CAPACITY})
    status, contract = control_plane.api("GET", "/openapi.json")

    assert above[0] == 422
    assert [d["field"] for d in above[1]["details"]] == ["body.capacity"]
    assert (at[0], at[1]["capacity"]) == (201, MAX_WORKER_CAPACITY)
    published = contract["components"]["schemas"]["TemplateRequest"]["properties"]["capacity"]
    assert (status, published["maximum"]) == (200, MAX_WORKER_CAPACITY)


# At the ceiling the fill writes 20,000 items: a `scale` figure; `make test` fills a worker of 200.
@pytest.mark.slow
@pytest.mark.parametrize("capacity", [pytest.param(MAX_WORKER_CAPACITY, marks=pytest.mark.scale), 200])
def test_given_a_full_worker_with_its_largest_fields_then_no_item_reaches_100_kb(
    store: FleetStore, running_worker: WorkerFactory, dynamodb: Any, capacity: int
) -> None:
    worker = running_worker(template="wide", pool="wide-pool", capacity=capacity)
    worker = store.update_worker(worker, largest_worker_changes(utcnow()), actor="t", action="Enlarged")
    last = placement.place_instance(store, actor="t", worker_id=worker.id)
    fill_worker(store, store.get_worker(worker.id))

    with pytest.raises(Conflict, match="is full"):
        placement.place_instance(store, actor="t", worker_id=worker.id)
    active = store.active_instances_of(worker.id)
    largest = largest_items(dynamodb, store.table_name)

    assert len(active) == capacity
    assert last.id in {i.id for i in active}
    size, pk, sk = largest[0]
    assert (pk, sk) == (f"WORKER#{worker.id}", "WORKER")  # the worker item is the largest...
    assert size < ITEM_BUDGET_BYTES  # ... and far under DynamoDB's 400 KB
