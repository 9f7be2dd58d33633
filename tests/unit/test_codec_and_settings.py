"""Record <-> item conversion, page tokens, settings."""

from __future__ import annotations

import pytest

from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.models import WorkerTemplate
from fleetkeeper.settings import Settings, SettingsError
from fleetkeeper.store.codec import (
    decode_page_token,
    encode_page_token,
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
