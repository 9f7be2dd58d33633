"""What a query string must be before any validator reads it: each parameter once, each value written as
the contract's type is written.

Read in one place (the request-validation middleware, api/app.py) for every route, so a parameter added
later follows the same rules:
- a parameter is given once: API Gateway hands `?drifted=true&drifted=false` over with both values, and
  a client's HTTP stack may keep either; a 422 names it rather than the API choosing one;
- a boolean is `true` or `false`, an integer its decimal digits 0-9: pydantic alone would also read
  `yes`, `on`, `1` and `T` as true, and ` 5`, `+5`, `5.0` and `5_0` as numbers (`5_0` as 50).
"""

from __future__ import annotations

import re
import types
from typing import Any, Final, Union, get_args, get_origin

from aws_lambda_powertools.event_handler.api_gateway import Route
from aws_lambda_powertools.event_handler.openapi.compat import ModelField, is_scalar_field
from aws_lambda_powertools.utilities.data_classes.common import BaseProxyEvent

from fleetkeeper.api.errors import ValidationFailed
from fleetkeeper.api.schemas import ErrorDetail

_INTEGER: Final = re.compile(r"-?[0-9]+")
_BOOLEAN: Final = ("true", "false")


def _plain_type(field: ModelField) -> Any:
    """The parameter's type without its `| None`."""
    annotation = field.field_info.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = [kind for kind in get_args(annotation) if kind is not type(None)]
        return kinds[0] if len(kinds) == 1 else annotation
    return annotation


def _misread(field: ModelField, value: str) -> str | None:
    """Why `value` is not the parameter's type as the contract writes it; None when it is."""
    kind = _plain_type(field)
    if kind is bool and value not in _BOOLEAN:
        return "true or false"
    if kind is int and not _INTEGER.fullmatch(value):
        return "a whole number written with the digits 0-9"
    return None


def check(route: Route, event: BaseProxyEvent) -> None:
    """ValidationFailed naming every query parameter given twice or spelt other than as its type."""
    # API Gateway's REST events carry every value in the multi-value map; a hand-made event may not.
    given = event.multi_value_query_string_parameters or {
        name: [value] for name, value in event.query_string_parameters.items()
    }
    problems = []
    for field in route.dependant.query_params:
        values = given.get(field.alias) or []
        if len(values) > 1 and is_scalar_field(field):
            problems.append((field.alias, f"given {len(values)} times; it takes one value"))
        elif len(values) == 1 and (reason := _misread(field, values[0])) is not None:
            problems.append((field.alias, reason))
    if problems:
        raise ValidationFailed([ErrorDetail(field=f"query.{name}", reason=why) for name, why in problems])
