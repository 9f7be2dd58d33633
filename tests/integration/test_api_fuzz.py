"""schemathesis drives every operation of the OpenAPI contract: no input may earn a 5xx."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from fleetkeeper.api.app import app
from fleetkeeper_local.controlplane import ApiServer
from fleetkeeper_local.stack import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]

schema = schemathesis.openapi.from_dict(
    app.get_openapi_schema(title="fleetkeeper admin API", version="1").model_dump(
        mode="json", by_alias=True, exclude_none=True
    )
)


@pytest.fixture
def api_url(control_plane, running_worker):
    running_worker(pool="labs")  # something real for the generated calls to hit now and then
    server = ApiServer(port=free_port()).start()
    yield server.url
    server.stop()


# 503 is part of the contract for two things only: no capacity, and a drain workflow that cannot start.
CONTRACT_503 = {"NO_CAPACITY", "WORKFLOW_UNAVAILABLE"}


@schema.parametrize()
@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
def test_given_any_generated_request_then_the_api_never_answers_5xx(case, api_url):
    response = case.call(base_url=api_url, headers={"Content-Type": "application/json"})
    if response.status_code == 503:
        assert response.json()["error"] in CONTRACT_503, response.text
    else:
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path}: {response.status_code} {response.text}"
        )
