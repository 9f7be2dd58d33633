"""The size of a DynamoDB item, by DynamoDB's documented formula ("DynamoDB item sizes and formats").

An item is the sum of its attribute names and values: a string or binary counts its bytes, a number
1 byte plus 1 per pair of significant digits (and 1 if negative; zero is 1 byte), a null or Boolean 1
byte, a set the sum of its elements, a list or map 3 bytes plus each element's size and 1 byte per
element (a map entry also counts its name).
DynamoDB refuses an item above `MAX_ITEM_BYTES`; fleetkeeper keeps every item it writes far below, and
uses this to cut lists into items that fit (store/breakers.py) and to prove the bounds in its tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

# DynamoDB's item limit: 400 KB, names and values together.
MAX_ITEM_BYTES: Final = 400 * 1024
# What fleetkeeper allows its largest item, so that a write costs at most 100 write units and the
# limit stays four times away (docs/data-model.md, "Bounded items").
ITEM_BUDGET_BYTES: Final = 100 * 1024
_CONTAINER_OVERHEAD: Final = 3
_ELEMENT_OVERHEAD: Final = 1


def _number_size(text: str) -> int:
    # DynamoDB keeps a number as base-100 digits, paired from the decimal point, between its first and
    # last significant digits, plus 1 byte, and 1 more for a negative number; zero is 1 byte (the counts
    # DynamoDB Local accepts to the byte at its limit, tests/integration/test_item_size.py). No context
    # arithmetic: it would round a number of more than 28 digits.
    number = Decimal(text)
    if number.is_zero():
        return 1
    _, digits, exponent = number.as_tuple()
    significant = "".join(map(str, digits)).rstrip("0")
    last = int(exponent) + len(digits) - len(significant)  # the power of ten of the last significant digit
    first = int(exponent) + len(digits) - 1
    return 1 + (first // 2 - last // 2 + 1) + (1 if number.is_signed() else 0)


def value_size(value: Mapping[str, Any]) -> int:
    """The size of one typed attribute value (`{"S": ...}`, `{"N": ...}`, `{"L": [...]}`...), its name
    not counted."""
    (kind, inner), *rest = value.items()
    if rest:
        raise ValueError(f"an attribute value has one type, not {sorted(value)}")
    match kind:
        case "S":
            return len(str(inner).encode())
        case "N":
            return _number_size(str(inner))
        case "B":
            return len(inner)
        case "BOOL" | "NULL":
            return 1
        case "SS":
            return sum(len(str(s).encode()) for s in inner)
        case "NS":
            return sum(_number_size(str(n)) for n in inner)
        case "BS":
            return sum(len(b) for b in inner)
        case "L":
            return _CONTAINER_OVERHEAD + sum(value_size(v) + _ELEMENT_OVERHEAD for v in inner)
        case "M":
            return _CONTAINER_OVERHEAD + sum(
                len(k.encode()) + value_size(v) + _ELEMENT_OVERHEAD for k, v in inner.items()
            )
    raise ValueError(f"unknown attribute type {kind!r}")


def item_size(item: Mapping[str, Mapping[str, Any]]) -> int:
    """The size of a whole item in DynamoDB's wire form (store/codec.serialize), in bytes."""
    return sum(len(name.encode()) + value_size(value) for name, value in item.items())
