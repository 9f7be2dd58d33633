"""Reconciler, discovery and scale-down settings: parsed from the environment, bad values named."""

from __future__ import annotations

import pytest

from fleetkeeper.settings import GcMode, Settings, SettingsError

BASE = {"TABLE_NAME": "fleet"}


def test_given_no_reconciler_variables_then_safe_defaults():
    settings = Settings.from_environ(BASE)
    assert settings.gc_mode is GcMode.TERMINATE
    assert settings.scale_down_enabled is False
    assert settings.scale_down_cooldown_seconds == 600
    assert settings.min_workers == 0
    assert settings.regions == [settings.default_region]


def test_given_region_configs_as_json_then_each_region_is_parsed():
    settings = Settings.from_environ(
        {
            **BASE,
            "REGION_CONFIGS": '{"eu-west-1": {"subnet_id": "subnet-1", "security_group_ids": ["sg-1"],'
            ' "key_name": "ops", "default_tags": {"team": "net"}}, "us-east-2": {}}',
            "GC_MODE": "report-only",
            "MAX_CONCURRENT_DRAINS": "25%",
        }
    )
    assert settings.regions == ["eu-west-1", "us-east-2"]
    config = settings.region_configs["eu-west-1"]
    assert (config.subnet_id, config.security_group_ids, config.key_name) == ("subnet-1", ("sg-1",), "ops")
    assert config.default_tags == {"team": "net"}
    assert settings.gc_mode is GcMode.REPORT_ONLY


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("REGION_CONFIGS", "{not json"),
        ("REGION_CONFIGS", '{"eu-west-1": {"subnet": "typo"}}'),
        ("GC_MODE", "delete-everything"),
        ("MAX_CONCURRENT_DRAINS", "ten"),
        ("MIN_WORKERS", "-1"),
        ("IDLE_CPU_THRESHOLD", "101"),
    ],
)
def test_given_a_bad_value_then_the_error_names_the_variable(variable, value):
    with pytest.raises(SettingsError, match=variable):
        Settings.from_environ({**BASE, variable: value})
