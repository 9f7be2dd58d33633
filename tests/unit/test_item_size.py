"""DynamoDB's item-size formula, type by type (the integration test holds it to DynamoDB's own limit)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetkeeper.store.codec import serialize
from fleetkeeper.store.item_size import item_size, value_size


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ({"S": "abc"}, 3),
        ({"S": "é"}, 2),  # UTF-8 bytes, not characters
        ({"N": "0"}, 1),  # zero is one byte
        ({"N": "-0.0"}, 1),
        ({"N": "7"}, 2),
        ({"N": "12"}, 2),
        ({"N": "123"}, 3),
        ({"N": "1200"}, 2),  # trailing zeroes trimmed
        ({"N": "0.0015"}, 2),  # leading zeroes trimmed
        ({"N": "1.5"}, 3),  # digits pair from the decimal point: 01.50
        ({"N": "0.015"}, 3),  # .01 50
        ({"N": "-12.5"}, 4),  # a negative number: one byte more
        ({"N": "-1"}, 3),
        ({"N": "12345678901234567890123456789012345678"}, 20),  # 38 digits, none rounded away
        ({"NS": ["0", "10"]}, 3),
        ({"B": b"\x00\x01"}, 2),
        ({"BOOL": False}, 1),
        ({"NULL": True}, 1),
        ({"SS": ["ab", "cde"]}, 5),
        ({"L": []}, 3),
        ({"L": [{"S": "ab"}, {"N": "1"}]}, 3 + (2 + 1) + (2 + 1)),
        ({"M": {}}, 3),
        ({"M": {"k": {"S": "v"}}}, 3 + 1 + 1 + 1),
    ],
)
def test_given_a_value_then_its_size_follows_dynamodb_s_formula(value: dict[str, Any], size: int) -> None:
    assert value_size(value) == size


def test_given_an_item_then_names_count_as_much_as_values() -> None:
    item = serialize({"PK": "WORKER#w-1", "SK": "WORKER", "version": 3, "tags": {"a": "b"}})
    assert item_size(item) == (2 + 10) + (2 + 6) + (7 + 2) + (4 + 3 + 1 + 1 + 1)


def test_given_a_value_of_two_types_or_an_unknown_one_then_it_is_refused() -> None:
    with pytest.raises(ValueError, match="one type"):
        value_size({"S": "a", "N": "1"})
    with pytest.raises(ValueError, match="unknown"):
        value_size({"X": "a"})
