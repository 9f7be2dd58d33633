"""/docs and /openapi.json name the same server: the one the caller reached them on."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, cast

import pytest
from aws_lambda_powertools.utilities.typing import LambdaContext

from fleetkeeper.api.app import app
from fleetkeeper_local.controlplane import api_event
from fleetkeeper_local.lambdas import LocalLambdaContext

CONTEXT = cast(LambdaContext, LocalLambdaContext(function_name="fleetkeeper-api"))
EMBEDDED_SERVERS = re.compile(r'"servers": (\[[^\]]*\])')


def on_stage(event: dict[str, Any], stage: str) -> dict[str, Any]:
    """The event of the same request made on a stage's execute-api URL: its path carries the stage."""
    context = {**event["requestContext"], "stage": stage, "path": f"/{stage}{event['path']}"}
    return {**event, "requestContext": context}


def servers(event: Callable[[str], dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """(the servers of the spec embedded in /docs, the servers of /openapi.json) for this caller."""
    page = app.resolve(event("/docs"), CONTEXT)
    document = app.resolve(event("/openapi.json"), CONTEXT)
    assert (page["statusCode"], document["statusCode"]) == (200, 200)
    match = EMBEDDED_SERVERS.search(page["body"])
    assert match, "the page embeds its spec"
    return json.loads(match.group(1)), json.loads(document["body"])["servers"]


@pytest.mark.parametrize(
    ("event", "url"),
    [
        (lambda path: api_event("GET", path), "/"),
        (lambda path: on_stage(api_event("GET", path), "prod"), "/prod"),
    ],
    ids=["local", "execute-api"],
)
def test_given_a_caller_then_docs_and_openapi_json_name_the_server_it_reached(
    event: Callable[[str], dict[str, Any]], url: str
):
    embedded, published = servers(event)

    assert embedded == published == [{"url": url}]
