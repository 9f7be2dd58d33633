"""Path and query parameters shared by the routes, bounded so no client value can break a DynamoDB key."""

from __future__ import annotations

from typing import Annotated

from aws_lambda_powertools.event_handler.openapi.params import Path, Query

from fleetkeeper.api.schemas import MAX_ID_LENGTH
from fleetkeeper.domain.models import NAME_PATTERN
from fleetkeeper.domain.rollouts import MAX_ID_LENGTH as MAX_ROLLOUT_ID_LENGTH

WorkerId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, examples=["w-0123456789abcdef"])]
RolloutId = Annotated[
    str, Path(min_length=1, max_length=MAX_ROLLOUT_ID_LENGTH, examples=["ro-0123456789abcdef"])
]
InstanceId = Annotated[str, Path(min_length=1, max_length=MAX_ID_LENGTH, examples=["in-0123456789abcdef"])]
ResourceName = Annotated[
    str,
    Path(pattern=NAME_PATTERN, description="letters, digits, '.', '_' or '-'; 1-64", examples=["lab"]),
]
PageToken = Annotated[
    str | None, Query(max_length=4096, description="next_token of the previous page of the same query")
]
