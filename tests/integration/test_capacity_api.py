"""A pool's capacity policy through the API: PUT, its echo, and 422s naming the field."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.integration

LAB_SMALL = {"instance_type": "m5.large", "ami_name_filter": "lab-*", "capacity": 4}
BERLIN_MORNINGS: dict[str, Any] = {
    "schedule": "0 8 * * mon-fri",
    "duration": "2h",
    "timezone": "Europe/Berlin",
    "headroom_slots": 20,
}
POLICY: dict[str, Any] = {
    "template": "lab-small",
    "min_workers": 1,
    "max_workers": 5,
    "headroom_slots": 4,
    "warm_workers": 1,
    "schedules": [BERLIN_MORNINGS],
    "bookings": True,
}


def test_given_a_capacity_policy_when_put_then_it_is_stored_echoed_and_replaced_whole(
    control_plane: Any,
) -> None:
    assert control_plane.api("PUT", "/api/v1/templates/lab-small", LAB_SMALL)[0] in (200, 201)

    status, created = control_plane.api("PUT", "/api/v1/pools/labs", {"capacity": POLICY})

    assert status == 201, created
    assert created["capacity"]["schedules"][0]["headroom_slots"] == 20
    assert created["capacity"]["max_workers"] == 5
    assert control_plane.ctx.store.get_pool("labs").capacity.warm_workers == 1
    _, kept = control_plane.api("PUT", "/api/v1/pools/labs", {"description": "labs"})
    assert kept["capacity"]["min_workers"] == 1
    _, cleared = control_plane.api("PUT", "/api/v1/pools/labs", {"capacity": {}})
    assert (cleared["capacity"]["template"], cleared["capacity"]["schedules"]) == (None, [])


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"template": "lab-large"}, "capacity.template"),
        ({"headroom_slots": 21}, "capacity.headroom_slots"),
        (
            {"schedules": [{**BERLIN_MORNINGS, "headroom_slots": 21}]},
            "capacity.schedules.0.headroom_slots",
        ),
        ({"max_workers": 0}, "body.capacity.max_workers"),
        ({"template": None}, "body.capacity.min_workers"),
        (
            {"schedules": [{"schedule": "0 8 * * *", "headroom_slots": 1}]},
            "body.capacity.schedules.0.duration",
        ),
        (
            {"schedules": [{**BERLIN_MORNINGS, "timezone": "Mars/Olympus"}]},
            "body.capacity.schedules.0.timezone",
        ),
    ],
)
def test_given_a_bad_capacity_policy_when_put_then_422_names_the_field(
    control_plane: Any, change: dict[str, Any], field: str
) -> None:
    control_plane.api("PUT", "/api/v1/templates/lab-small", LAB_SMALL)

    status, body = control_plane.api("PUT", "/api/v1/pools/labs", {"capacity": {**POLICY, **change}})

    assert status == 422, body
    assert [d["field"] for d in body["details"]][:1] == [field]
    assert control_plane.api("GET", "/api/v1/pools/labs")[0] == 404  # nothing was created


def test_given_a_pool_with_a_policy_when_its_capacity_is_read_then_the_target_and_its_rule_show(
    control_plane: Any,
) -> None:
    control_plane.api("PUT", "/api/v1/templates/lab-small", LAB_SMALL)
    control_plane.api(
        "PUT", "/api/v1/pools/labs", {"capacity": {**POLICY, "schedules": [], "min_workers": 2}}
    )

    status, view = control_plane.api("GET", "/api/v1/pools/labs/capacity")

    assert status == 200, view
    assert (view["running"], view["warm"], view["members"], view["free_slots"]) == (0, 0, 0, 0)
    # min_workers 2 against a headroom of 4 slots (one worker of 4): min_workers sets it.
    assert (view["target"]["workers"], view["target"]["rule"], view["target"]["warm"]) == (
        2,
        "min_workers",
        1,
    )
    assert (view["blocked"], view["last_cycle"], view["lead_time_seconds"]) == (None, None, 600)
    assert control_plane.api("GET", "/api/v1/pools/none/capacity")[0] == 404
