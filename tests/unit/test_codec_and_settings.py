"""Record <-> item conversion, page tokens, settings."""

from __future__ import annotations

import base64
import importlib
import inspect
import json
import pkgutil
import typing
from datetime import UTC, datetime

import pytest
from pydantic import BaseModel

from fleetkeeper import domain
from fleetkeeper.domain.disruption import DisruptionReason, Waiting, WaitingList
from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.settings import Settings, SettingsError
from fleetkeeper.store.codec import (
    decode_page_token,
    decode_walk_token,
    encode_page_token,
    encode_walk_token,
    load_record,
    record_attributes,
    serialize,
)
from fleetkeeper.store.schema import create_table_request


def test_given_a_record_when_stored_and_loaded_then_it_is_unchanged():
    template = WorkerTemplate(
        name="lab",
        instance_type="m5.large",
        ami_name_filter="lab-*",
        capacity=3,
        drain_timeout_hours=1.5,
        tags={"team": "net"},
    )
    item = {"PK": {"S": "TEMPLATE#lab"}, **serialize(record_attributes(template))}
    assert load_record(WorkerTemplate, item) == template


def test_given_a_page_token_then_it_round_trips():
    key = {"PK": {"S": "WORKER#w-1"}, "SK": {"S": "WORKER"}}
    assert decode_page_token(encode_page_token(key)) == key


@pytest.mark.parametrize("token", ["not-base64!!", "e30", "WzFd"])
def test_given_a_forged_page_token_then_next_token_is_named(token):
    with pytest.raises(InvalidInput) as raised:
        decode_page_token(token)
    assert raised.value.field == "next_token"


def test_given_no_table_name_then_the_error_names_the_variable():
    with pytest.raises(SettingsError, match="TABLE_NAME"):
        Settings.from_environ({})


def test_given_a_bad_heartbeat_then_the_error_names_the_variable():
    with pytest.raises(SettingsError, match="DRAIN_HEARTBEAT_SECONDS"):
        Settings.from_environ({"TABLE_NAME": "fleet", "DRAIN_HEARTBEAT_SECONDS": "-1"})


def test_given_a_short_table_name_then_the_definition_refuses_it():
    with pytest.raises(ValueError, match="3-character"):
        create_table_request("ab")


def test_given_the_definition_then_it_has_the_status_and_parent_indexes():
    indexes = {i["IndexName"] for i in create_table_request("fleet")["GlobalSecondaryIndexes"]}
    assert {"by_status", "by_parent", "by_kind", "by_ec2_instance"} <= indexes


WALK = [
    {
        "IndexName": "by_shard",
        "KeyConditionExpression": "GSI4PK = :pk",
        "ExpressionAttributeValues": {":pk": {"S": f"WORKER#RUNNING#{p:02d}"}},
    }
    for p in range(3)
]
START = {
    "GSI4PK": {"S": "WORKER#RUNNING#01"},
    "GSI4SK": {"S": "0100#w-1"},
    "PK": {"S": "WORKER#w-1"},
    "SK": {"S": "WORKER"},
}


def test_given_a_walk_token_then_it_names_the_partition_and_the_start_key_inside_it():
    assert decode_walk_token(encode_walk_token(1, START, WALK), WALK) == (1, START)
    assert decode_walk_token(encode_walk_token(2, None, WALK), WALK) == (2, None)
    assert encode_walk_token(3, None, WALK) is None  # past the last partition: the walk is over


def test_given_a_walk_token_of_another_walk_or_partition_then_next_token_is_named():
    other = [*WALK[:2], {**WALK[2], "FilterExpression": "#r = :r"}]
    token = encode_walk_token(1, START, WALK)
    moved = json.loads(base64.urlsafe_b64decode(token or ""))
    moved["p"] = 2  # the start key belongs to the second partition, not the third
    forged = base64.urlsafe_b64encode(json.dumps(moved).encode()).decode()

    for bad, reason in ((token, "belongs to another query"), (forged, "belongs to another query")):
        with pytest.raises(InvalidInput) as raised:
            decode_walk_token(bad, other if bad == token else WALK)
        assert (raised.value.field, reason in raised.value.reason) == ("next_token", True)


def _domain_models() -> list[type[BaseModel]]:
    found: list[type[BaseModel]] = []
    for module_info in pkgutil.iter_modules(domain.__path__):
        module = importlib.import_module(f"{domain.__name__}.{module_info.name}")
        found += [
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__
        ]
    return found


def test_given_any_domain_record_then_no_field_is_both_required_and_nullable():
    # Items are written without their None fields (record_attributes), so a field that is required but
    # may be None is missing when read back and the whole item fails to load: a disruption waiting
    # list with a stage-default refusal once broke every later scale-down plan of its pool.
    unreadable = [
        f"{model.__module__}.{model.__name__}.{name}"
        for model in _domain_models()
        for name, info in model.model_fields.items()
        if info.is_required() and type(None) in typing.get_args(info.annotation)
    ]

    assert _domain_models()
    assert unreadable == []


def test_given_a_waiting_refusal_under_the_stage_default_then_it_loads_back_unchanged():
    refusal = Waiting(
        worker_id="w-1",
        reason=DisruptionReason.SCALE_DOWN,
        action="stop",
        budget=None,
        allowed=1,
        in_use=1,
        refused_at=datetime(2026, 11, 27, 12, 0, tzinfo=UTC),
    )
    stored = WaitingList(version=1, entries=[refusal])

    assert load_record(WaitingList, serialize(record_attributes(stored))) == stored
