"""A pool budget's published schema states the validator's rules: values drawn from the schema itself are
accepted, and any value is accepted by the validator exactly when the schema accepts it.

The one rule a schema cannot state: an integer written with a fraction part (1.0) is an integer to JSON
Schema and refused by the API (domain/values.py), so whole floats are left out of the comparison.
"""

from __future__ import annotations

from typing import Any, Final

import jsonschema_rs
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fleetkeeper.api.app import contract
from fleetkeeper.domain.disruption import Budget
from fleetkeeper.domain.durations import parse_duration
from fleetkeeper.domain.windows import MAX_DURATION as MAX_WINDOW
from fleetkeeper.domain.windows import MIN_DURATION as MIN_WINDOW

SCHEMAS: Final = contract()["components"]["schemas"]
MAX: Final = SCHEMAS["Budget"]["properties"]["max"]
DURATION: Final = SCHEMAS["Budget"]["properties"]["duration"]
_COUNT, _TEXT = MAX["anyOf"]
_SCHEDULED: Final = {"max": 1, "schedule": "0 9 * * *"}


def _accepted(budget: dict[str, Any]) -> bool:
    try:
        Budget.model_validate(budget)
    except ValidationError:
        return False
    return True


def _any_value() -> st.SearchStrategy[Any]:
    """Values of every JSON type near the budget's forms, whole floats aside (see the docstring)."""
    digits = st.text(alphabet="0123456789%٣٥ +-.", max_size=8)
    return st.one_of(
        st.integers(min_value=-5, max_value=200_000),
        st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()),
        st.booleans(),
        st.none(),
        digits,
        st.text(max_size=8),
    )


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.one_of(
        st.integers(min_value=_COUNT["minimum"], max_value=_COUNT["maximum"]),
        st.from_regex(_TEXT["pattern"], fullmatch=True),
    )
)
def test_given_a_max_drawn_from_the_published_schema_then_the_validator_takes_it(value):
    assert _accepted({"max": value}), value


@settings(max_examples=150, deadline=None, derandomize=True)
@given(_any_value())
def test_given_any_max_then_the_validator_accepts_it_exactly_when_the_schema_does(value):
    published = jsonschema_rs.validator_for(MAX).is_valid(value)
    assert _accepted({"max": value}) == published, value


def test_given_other_scripts_digits_or_a_whole_float_as_a_max_then_it_is_refused():
    # "٣" (Arabic-Indic three) was stored as 3; 1.0 was read as 1.
    for value in ("٣", "٣%", "1٣", 1.0, 3.0, True, " 3", "3 ", "1e2", "101%", "100001"):
        assert not _accepted({"max": value}), value
    assert Budget.model_validate({"max": "007%"}).max == "7%"
    assert Budget.model_validate({"max": "0100000"}).max == 100_000


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.from_regex(DURATION["pattern"], fullmatch=True))
def test_given_a_duration_drawn_from_the_published_pattern_then_only_its_range_may_refuse_it(text):
    length = parse_duration(text)
    assert length is not None, text
    assert _accepted({**_SCHEDULED, "duration": text}) == (MIN_WINDOW <= length <= MAX_WINDOW), text


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(alphabet="0123456789٣dhms .-", max_size=8))
def test_given_any_duration_text_the_pattern_refuses_then_the_validator_refuses_it(text):
    if not jsonschema_rs.validator_for(DURATION).is_valid(text):
        assert not _accepted({**_SCHEDULED, "duration": text}), text
