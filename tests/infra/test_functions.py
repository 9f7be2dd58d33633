"""The five functions: shared defaults from one factory, sizing and environment per function."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.config import STAGES_KEY
from tests.infra.conftest import cdk_json_context
from tests.infra.helpers import flat, function_logical_id, function_properties, properties, resources

FUNCTIONS = ("api", "drain_tasks", "reconcile", "discover", "ec2_events")
ASYNCHRONOUS = ("reconcile", "discover", "ec2_events")
COMMON_ENV = {
    "TABLE_NAME",
    "DRAIN_STATE_MACHINE_ARN",
    "AUDIT_BUS_NAME",
    "NOTIFICATION_TOPIC_ARN",
    "DRAIN_HEARTBEAT_SECONDS",
    "IDEMPOTENCY_TTL_SECONDS",
    "POWERTOOLS_SERVICE_NAME",
    "POWERTOOLS_METRICS_NAMESPACE",
    "POWERTOOLS_LOG_LEVEL",
}
FLEET_ENV = {
    "REGION_CONFIGS",
    "GC_MODE",
    "RECONCILE_SHARDS",
    "SCALE_DOWN_ENABLED",
    "MIN_WORKERS",
    "SCALE_DOWN_COOLDOWN_SECONDS",
    "IDLE_WINDOW_SECONDS",
    "IDLE_CPU_THRESHOLD",
    "SCALE_DOWN_LOOKAHEAD_SECONDS",
    "MAX_CONCURRENT_DRAINS",
    "IMPORT_GRACE_SECONDS",
    "ORPHAN_GC_MAX_SHARE_PERCENT",
    "ORPHAN_GC_MAX_RETIRE_PER_RUN",
    "DRAIN_WATCHDOG_INTERVAL_SECONDS",
}


def name(stage: str, function: str) -> str:
    return f"fleetkeeper-{stage}-{function.replace('_', '-')}"


def stage_settings(stage: str):
    return cdk_json_context()[STAGES_KEY][stage]


def test_given_a_stage_then_it_has_exactly_the_five_functions(dev):
    names = {props["FunctionName"] for props in properties(dev, "AWS::Lambda::Function")}
    assert names == {name("dev", function) for function in FUNCTIONS}


@pytest.mark.parametrize("function", FUNCTIONS)
def test_given_a_function_then_it_runs_python_on_arm64_with_xray_and_json_logs(dev, function):
    props = function_properties(dev, name("dev", function))
    assert props["Runtime"] == "python3.12"
    assert props["Architectures"] == ["arm64"]
    assert props["Handler"] == "handler.handler"
    assert props["TracingConfig"] == {"Mode": "Active"}
    assert props["LoggingConfig"]["LogFormat"] == "JSON"
    assert props["LoggingConfig"]["ApplicationLogLevel"] == "DEBUG"
    log_group = props["LoggingConfig"]["LogGroup"]["Ref"]
    assert log_group in resources(dev, "AWS::Logs::LogGroup")


@pytest.mark.parametrize("function", FUNCTIONS)
def test_given_a_function_then_it_loads_our_dependency_layer_and_the_shared_layer_and_no_other(dev, function):
    layers = function_properties(dev, name("dev", function))["Layers"]
    layer_resources = resources(dev, "AWS::Lambda::LayerVersion")
    descriptions = [layer_resources[layer["Ref"]]["Properties"]["Description"] for layer in layers]
    assert len(descriptions) == 2
    assert descriptions[0].startswith("fleetkeeper third-party dependencies")
    assert descriptions[1].startswith("fleetkeeper package")


def test_given_the_functions_then_each_has_its_own_log_group_and_role(dev):
    log_groups = [
        function_properties(dev, name("dev", f))["LoggingConfig"]["LogGroup"]["Ref"] for f in FUNCTIONS
    ]
    roles = [function_properties(dev, name("dev", f))["Role"]["Fn::GetAtt"][0] for f in FUNCTIONS]
    assert len(set(log_groups)) == len(FUNCTIONS)
    assert len(set(roles)) == len(FUNCTIONS)


def test_given_the_functions_then_timeouts_and_memory_fit_each_job(dev):
    sizing = {
        function: (
            function_properties(dev, name("dev", function))["Timeout"],
            function_properties(dev, name("dev", function))["MemorySize"],
        )
        for function in FUNCTIONS
    }
    assert sizing["api"][0] <= 29, "API Gateway stops waiting after 29 s"
    assert sizing["reconcile"][0] < 60, "a reconcile run must end before the next 1-minute tick"
    assert sizing["discover"][0] < 300, "a discovery run must end before the next 5-minute tick"
    assert sizing["reconcile"][1] > sizing["drain_tasks"][1]
    assert len({timeout for timeout, _ in sizing.values()}) > 1


def test_given_a_slower_reconcile_schedule_then_the_reconcile_timeout_grows_with_it(pinned, dev):
    assert (
        function_properties(pinned, name("pinned", "reconcile"))["Timeout"]
        > function_properties(dev, name("dev", "reconcile"))["Timeout"]
    )


@pytest.mark.parametrize("function", FUNCTIONS)
def test_given_a_function_then_its_environment_names_the_stage_resources(dev, function):
    env = function_properties(dev, name("dev", function))["Environment"]["Variables"]
    assert set(env) >= COMMON_ENV
    assert env["POWERTOOLS_SERVICE_NAME"] == "fleetkeeper"
    assert env["POWERTOOLS_METRICS_NAMESPACE"] == "fleetkeeper"
    assert env["POWERTOOLS_LOG_LEVEL"] == "DEBUG"
    assert env["DRAIN_HEARTBEAT_SECONDS"] == "300"
    assert env["IDEMPOTENCY_TTL_SECONDS"] == "3600"
    assert env["TABLE_NAME"]["Ref"] in resources(dev, "AWS::DynamoDB::Table")
    assert env["AUDIT_BUS_NAME"]["Ref"] in resources(dev, "AWS::Events::EventBus")
    assert env["NOTIFICATION_TOPIC_ARN"]["Ref"] in resources(dev, "AWS::SNS::Topic")
    assert flat(env["DRAIN_STATE_MACHINE_ARN"]).endswith(":stateMachine:fleetkeeper-dev-drain")
    expected = {"api": {"REGION_CONFIGS"}, "reconcile": FLEET_ENV, "discover": FLEET_ENV}.get(function, set())
    assert (set(env) & FLEET_ENV) == expected


@pytest.mark.parametrize("function", ["reconcile", "discover"])
def test_given_the_fleet_settings_then_reconcile_and_discover_read_them_from_the_stage(prod, function):
    env = function_properties(prod, name("prod", function))["Environment"]["Variables"]
    settings = stage_settings("prod")
    assert json.loads(env["REGION_CONFIGS"]).keys() == settings["regions"].keys()
    assert env["GC_MODE"] == "terminate"
    assert env["SCALE_DOWN_ENABLED"] == "true"
    assert env["MIN_WORKERS"] == str(settings["scale_down"]["min_workers"])
    assert float(env["IDLE_CPU_THRESHOLD"]) == settings["scale_down"]["idle_cpu_threshold"]
    assert env["MAX_CONCURRENT_DRAINS"] == str(settings["scale_down"]["max_concurrent_drains"])


def test_given_a_stage_then_the_api_knows_the_regions_it_may_create_workers_in(prod):
    env = function_properties(prod, name("prod", "api"))["Environment"]["Variables"]
    assert json.loads(env["REGION_CONFIGS"]).keys() == stage_settings("prod")["regions"].keys()


def test_given_a_sharded_stage_then_the_reconciler_knows_its_split(pinned, prod):
    pinned_env = function_properties(pinned, name("pinned", "reconcile"))["Environment"]["Variables"]
    prod_env = function_properties(prod, name("prod", "reconcile"))["Environment"]["Variables"]
    # A cycle told another split than this refuses to run.
    assert (pinned_env["RECONCILE_SHARDS"], prod_env["RECONCILE_SHARDS"]) == ("3", "1")


def test_given_pinned_regions_then_region_configs_carry_subnets_groups_keys_and_tags(pinned):
    env = function_properties(pinned, name("pinned", "reconcile"))["Environment"]["Variables"]
    configs = json.loads(env["REGION_CONFIGS"])
    assert configs["eu-west-1"] == {
        "subnet_id": "subnet-0a1b2c3d",
        "security_group_ids": ["sg-0a1b2c3d", "sg-4e5f6a7b"],
        "key_name": "fleet-key",
        "default_tags": {"team": "labs"},
    }
    assert configs["us-east-1"]["key_name"] is None


def test_given_asynchronous_functions_then_failures_land_in_the_dlq_and_sync_ones_have_none(dev):
    configs = {
        props["FunctionName"]["Ref"]: props for props in properties(dev, "AWS::Lambda::EventInvokeConfig")
    }
    functions = resources(dev, "AWS::Lambda::Function")
    by_name = {resource["Properties"]["FunctionName"]: logical for logical, resource in functions.items()}
    queues = resources(dev, "AWS::SQS::Queue")
    assert {by_name[name("dev", function)] for function in ASYNCHRONOUS} == set(configs)
    for config in configs.values():
        destination = config["DestinationConfig"]["OnFailure"]["Destination"]["Fn::GetAtt"][0]
        assert destination in queues
        assert "MaximumRetryAttempts" in config
        assert "MaximumEventAgeInSeconds" in config


def _asset_dir(synthesized, code):
    return synthesized.outdir / ("asset." + code["S3Key"].removesuffix(".zip"))


def test_given_the_shared_layer_then_its_asset_is_the_fleetkeeper_package_and_its_bytecode_only(
    synthesized, dev
):
    (layer,) = [
        layer
        for layer in properties(dev, "AWS::Lambda::LayerVersion")
        if layer["Description"].startswith("fleetkeeper package")
    ]
    asset: Path = _asset_dir(synthesized, layer["Content"])
    assert (asset / "python" / "fleetkeeper" / "store" / "schema.py").is_file()
    compiled = {path.name.split(".")[-2] for path in asset.rglob("__pycache__/*")}
    assert compiled == {"cpython-312"}  # no bytecode of the building machine's other interpreters
    leftovers = {".mypy_cache", ".pytest_cache"}
    assert not [path for path in asset.rglob("*") if path.suffix == ".egg-info" or path.name in leftovers]
    assert layer["CompatibleArchitectures"] == ["arm64"]
    assert layer["CompatibleRuntimes"] == ["python3.12"]


@pytest.mark.parametrize("function", FUNCTIONS)
def test_given_a_function_then_its_code_asset_is_its_own_directory(synthesized, dev, function):
    code = function_properties(dev, name("dev", function))["Code"]
    asset = _asset_dir(synthesized, code)
    assert (asset / "handler.py").is_file()
    assert not list(asset.rglob("__pycache__"))


def test_given_the_default_stage_then_rebalance_drains_are_off_and_the_breaker_limit_is_20_percent(dev):
    events_env = function_properties(dev, name("dev", "ec2_events"))["Environment"]["Variables"]
    discover_env = function_properties(dev, name("dev", "discover"))["Environment"]["Variables"]
    api_env = function_properties(dev, name("dev", "api"))["Environment"]["Variables"]
    assert (events_env["REBALANCE_DRAIN_ENABLED"], events_env["REBALANCE_DRAIN_TIMEOUT_SECONDS"]) == (
        "false",
        "1800",
    )
    assert (
        discover_env["ORPHAN_GC_MAX_SHARE_PERCENT"],
        discover_env["IMPORT_GRACE_SECONDS"],
        discover_env["ORPHAN_GC_MAX_RETIRE_PER_RUN"],
    ) == ("20.0", "30", "1000")
    assert api_env["ORPHAN_GC_CONFIRMATION_TTL_SECONDS"] == "3600"


def test_given_the_api_then_it_restores_from_snapstart_and_the_gateway_invokes_its_live_alias(dev):
    api = function_logical_id(dev, name("dev", "api"))
    assert function_properties(dev, name("dev", "api"))["SnapStart"] == {"ApplyOn": "PublishedVersions"}
    others = [f for f in FUNCTIONS if f != "api"]
    assert all("SnapStart" not in function_properties(dev, name("dev", f)) for f in others)
    (version_id,) = [
        logical_id
        for logical_id, version in resources(dev, "AWS::Lambda::Version").items()
        if version["Properties"]["FunctionName"] == {"Ref": api}
    ]
    (alias,) = [a for a in properties(dev, "AWS::Lambda::Alias") if a["FunctionName"] == {"Ref": api}]
    assert alias["Name"] == "live"
    assert alias["FunctionVersion"] == {"Fn::GetAtt": [version_id, "Version"]}
    (alias_id,) = [
        i for i, a in resources(dev, "AWS::Lambda::Alias").items() if a["Properties"]["Name"] == "live"
    ]
    uris = {flat(m["Integration"]["Uri"]) for m in properties(dev, "AWS::ApiGateway::Method")}
    assert uris
    assert all(alias_id in uri for uri in uris), uris
    targets = {
        flat(p["FunctionName"])
        for p in properties(dev, "AWS::Lambda::Permission")
        if p["Principal"] == "apigateway.amazonaws.com"
    }
    assert targets in ({f"<{alias_id}>"}, {alias_id}), targets
