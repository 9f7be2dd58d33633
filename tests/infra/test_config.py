"""Stage settings come from cdk.json context and fail with the name of the bad key."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from infra.config import STAGE_KEY, STAGES_KEY, ConfigError, StageConfig, load_stage_config
from tests.infra.conftest import cdk_json_context


def load(context: dict[str, Any], stage: str | None) -> StageConfig:
    lookup = {**context, STAGE_KEY: stage} if stage else context
    return load_stage_config(lookup.get)


def with_setting(stage: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    context = copy.deepcopy(cdk_json_context())
    target = context[STAGES_KEY][stage]
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return context


@pytest.mark.parametrize("stage", ["dev", "prod"])
def test_given_cdk_json_when_a_stage_is_selected_then_its_settings_validate(stage):
    config = load(cdk_json_context(), stage)
    assert config.name == stage
    assert config.regions


def test_given_cdk_json_then_prod_keeps_data_and_dev_does_not():
    context = cdk_json_context()
    assert load(context, "prod").retain is True
    assert load(context, "dev").retain is False
    assert load(context, "prod").gc_mode == "terminate"


def test_given_no_stage_when_loading_then_the_error_says_how_to_pick_one():
    with pytest.raises(ConfigError, match=r"-c stage=<dev\|prod>"):
        load(cdk_json_context(), None)


def test_given_an_unknown_stage_when_loading_then_the_known_stages_are_listed():
    with pytest.raises(ConfigError, match=r"unknown stage 'qa'; cdk\.json defines dev, prod"):
        load(cdk_json_context(), "qa")


def test_given_no_stages_in_context_when_loading_then_the_key_is_named():
    with pytest.raises(ConfigError, match=STAGES_KEY):
        load({}, "dev")


def test_given_a_negative_minimum_when_loading_then_the_full_key_is_named():
    context = with_setting("prod", ("scale_down", "min_workers"), -1)
    with pytest.raises(ConfigError, match=r"'fleetkeeper:stages\.prod\.scale_down\.min_workers'"):
        load(context, "prod")


def test_given_a_misspelt_key_when_loading_then_it_is_rejected_by_name():
    context = with_setting("dev", ("gc_mod",), "terminate")
    with pytest.raises(ConfigError, match=r"'fleetkeeper:stages\.dev\.gc_mod': Extra inputs"):
        load(context, "dev")


def test_given_a_retention_cloudwatch_does_not_offer_when_loading_then_the_allowed_values_are_listed():
    context = with_setting("dev", ("log_retention_days",), 10)
    with pytest.raises(ConfigError, match=r"log_retention_days.*use one of 1, 3, 5, 7, 14"):
        load(context, "dev")


def test_given_a_bad_gc_mode_when_loading_then_the_key_is_named():
    context = with_setting("dev", ("gc_mode",), "delete")
    with pytest.raises(ConfigError, match=r"'fleetkeeper:stages\.dev\.gc_mode'"):
        load(context, "dev")


def test_given_a_bad_worker_region_when_loading_then_the_region_key_is_named():
    context = with_setting("dev", ("regions",), {"europe": {}})
    with pytest.raises(ConfigError, match=r"'fleetkeeper:stages\.dev\.regions\.europe\.\[key\]'"):
        load(context, "dev")


def test_given_region_configs_then_the_environment_json_round_trips():
    config = load(cdk_json_context(), "dev")
    parsed = json.loads(config.region_configs_json())
    assert set(parsed) == set(config.regions)
    for region, settings in parsed.items():
        assert settings == config.regions[region].model_dump(mode="json")
        assert set(settings) == {"subnet_id", "security_group_ids", "key_name", "default_tags"}


def test_given_a_deferred_index_the_table_does_not_have_then_the_key_is_named():
    context = with_setting("dev", ("deferred_indexes",), ["by_nothing"])
    with pytest.raises(ConfigError, match=r"fleetkeeper:stages\.dev\.deferred_indexes.*by_nothing"):
        load(context, "dev")
