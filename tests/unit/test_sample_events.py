"""The sample events in events/ stay valid for the code that consumes them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aws_lambda_powertools.utilities.data_classes import APIGatewayProxyEvent

from fleetkeeper.domain.rollouts import RolloutRequest
from fleetkeeper.services.drains import StepRequest

EVENTS = Path(__file__).parents[2] / "events"


@pytest.mark.parametrize("path", sorted(EVENTS.glob("sfn_*.json")), ids=lambda p: p.name)
def test_given_a_step_functions_task_sample_then_the_drain_tasks_handler_accepts_it(path):
    request = StepRequest.model_validate(json.loads(path.read_text()))
    assert request.drain.target


@pytest.mark.parametrize("path", sorted(EVENTS.glob("api_*.json")), ids=lambda p: p.name)
def test_given_an_api_gateway_sample_then_it_is_a_rest_proxy_event_with_an_iam_caller(path):
    event = APIGatewayProxyEvent(json.loads(path.read_text()))
    assert event.path.startswith("/api/v1/")
    assert (event.request_context.identity.user_arn or "").startswith("arn:aws:iam::")
    if event.http_method in ("POST", "PUT", "PATCH"):
        assert json.loads(event.body or "{}") is not None
        assert event.headers["Content-Type"] == "application/json"


def test_given_the_rollout_start_sample_then_its_body_is_a_valid_rollout_request():
    event = APIGatewayProxyEvent(json.loads((EVENTS / "api_rollout_start.json").read_text()))
    request = RolloutRequest.model_validate_json(event.body or "")
    assert (event.http_method, event.path) == ("POST", "/api/v1/rollouts")
    assert (request.template, request.max_unavailable, request.checkpoints) == ("lab-small", "25%", [50])
    assert request.dry_run is False
