"""The item-size formula agrees with DynamoDB's own sizing: an item of exactly 400 KB by it is stored,
one byte more is refused, for every type fleetkeeper writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.exceptions import ClientError

from fleetkeeper.domain.models import MAX_WORKER_CAPACITY, utcnow
from fleetkeeper.store.codec import serialize
from fleetkeeper.store.item_size import MAX_ITEM_BYTES, item_size
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.bounds import check_against_limit, largest_worker_changes
from tests.integration.conftest import WorkerFactory

pytestmark = pytest.mark.integration

Shape = Callable[[int], dict[str, Any]]


def _strings(n: int) -> dict[str, Any]:
    return {"pad": {"S": "x" * n}}


def _list_of_strings(n: int) -> dict[str, Any]:
    # Ids of 18 bytes, as a worker or instance id, and one shorter string to land on the byte.
    per = 18 + 1
    count, rest = divmod(n - 3, per)
    values = [{"S": f"w-{i:016x}"} for i in range(count)]
    if rest:
        values.append({"S": "y" * (rest - 1)})
    return {"ids": {"L": values}}


def _map_and_numbers(n: int) -> dict[str, Any]:
    return {
        "version": {"N": "123456789"},
        "share": {"N": "12.5"},
        "zero": {"N": "0"},
        "negative": {"N": "-3.25"},
        "m": {"M": {"a": {"BOOL": True}, "b": {"NULL": True}, "c": {"S": "z" * (n - 60)}}},
        "set": {"SS": ["alpha", "beta"]},
    }


def _fill(shape: Shape, total: int) -> dict[str, Any]:
    """An item of the shape whose size by the formula is exactly `total`."""
    base = {"PK": {"S": "SIZE#probe"}, "SK": {"S": "SIZE"}}
    guess = total - item_size({**base, **shape(100)}) + 100
    # Nearest first: the guess is usually exact, and a filler of 21,000 ids costs 15 ms a try.
    for n in sorted(range(guess - 64, guess + 64), key=lambda n: abs(n - guess)):
        item = {**base, **shape(n)}
        if item_size(item) == total:
            return item
    raise AssertionError("no filler reaches the size exactly")


@pytest.mark.parametrize("shape", [_strings, _list_of_strings, _map_and_numbers], ids=lambda s: s.__name__)
def test_given_an_item_of_exactly_400_kb_by_the_formula_then_dynamodb_stores_it_and_refuses_one_byte_more(
    dynamodb: Any, table_name: str, shape: Shape
) -> None:
    dynamodb.put_item(TableName=table_name, Item=_fill(shape, MAX_ITEM_BYTES))

    with pytest.raises(ClientError) as refused:
        dynamodb.put_item(TableName=table_name, Item=_fill(shape, MAX_ITEM_BYTES + 1))

    assert refused.value.response["Error"]["Code"] == "ValidationException"
    assert "size" in refused.value.response["Error"]["Message"].lower()


def test_given_the_largest_worker_item_then_dynamodb_counts_it_as_the_formula_does(
    dynamodb: Any, store: FleetStore, running_worker: WorkerFactory
) -> None:
    worker = running_worker(template="wide", pool="p" * 64, capacity=MAX_WORKER_CAPACITY)
    store.update_worker(worker, largest_worker_changes(utcnow()), actor="t", action="Enlarged")
    key = serialize({"PK": f"WORKER#{worker.id}", "SK": "WORKER"})
    item = dynamodb.get_item(TableName=store.table_name, Key=key, ConsistentRead=True)["Item"]

    check = check_against_limit(dynamodb, store.table_name, item)

    assert check.size == item_size(item) > 30 * 1024  # every field at its largest
    assert (check.accepted_at_limit, check.refused_above) == (True, True)
