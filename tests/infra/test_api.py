"""The admin API: SigV4 on every method, validated, logged, throttled, and two policies to call it."""

from __future__ import annotations

import pytest

from infra.api import API_METHODS, INTERNAL_METHODS
from infra.config import ConfigError, load_stage_config
from tests.infra.conftest import PINNED_AGENT, PINNED_TOOLING, shipped_cdk_json_context
from tests.infra.helpers import flat, function_properties, properties, resources
from tests.infra.test_config import load, with_setting

STAGES = ("dev", "prod", "pinned")


@pytest.mark.parametrize("stage", STAGES)
def test_given_any_stage_then_every_method_requires_aws_iam(synthesized, stage):
    methods = properties(synthesized.template(stage), "AWS::ApiGateway::Method")
    docs = 1 if stage in ("dev", "pinned") else 0  # Swagger UI is a stage setting, off in prod
    assert len(methods) == len(API_METHODS) + len(INTERNAL_METHODS) + 1 + docs
    assert {method["AuthorizationType"] for method in methods} == {"AWS_IAM"}


def test_given_the_api_then_every_method_goes_through_the_request_validator(dev):
    (validator_id,) = resources(dev, "AWS::ApiGateway::RequestValidator")
    validator = resources(dev, "AWS::ApiGateway::RequestValidator")[validator_id]["Properties"]
    assert validator["ValidateRequestParameters"] is True
    assert validator["ValidateRequestBody"] is True
    for method in properties(dev, "AWS::ApiGateway::Method"):
        assert method["RequestValidatorId"] == {"Ref": validator_id}
        assert method["Integration"]["Type"] == "AWS_PROXY"


def test_given_the_proxy_resource_then_its_methods_require_the_proxy_path(dev):
    proxied = [m for m in properties(dev, "AWS::ApiGateway::Method") if "RequestParameters" in m]
    assert sorted(m["HttpMethod"] for m in proxied) == sorted(API_METHODS + INTERNAL_METHODS)
    assert all(m["RequestParameters"] == {"method.request.path.proxy": True} for m in proxied)
    paths = sorted(r["PathPart"] for r in properties(dev, "AWS::ApiGateway::Resource"))
    assert paths == sorted(["api", "{proxy+}", "internal", "{proxy+}", "openapi.json", "docs"])


def test_given_prod_then_there_is_no_docs_page_and_no_delete(prod):
    paths = {r["PathPart"] for r in properties(prod, "AWS::ApiGateway::Resource")}
    assert "docs" not in paths
    verbs = {m["HttpMethod"] for m in properties(prod, "AWS::ApiGateway::Method")}
    # PATCH moves a running drain's deadline; nothing is ever deleted.
    assert verbs == {"GET", "POST", "PUT", "PATCH"}


def test_given_the_stage_then_it_is_throttled_traced_and_access_logged(dev, prod):
    for template, rate, burst in ((dev, 10, 20), (prod, 50, 100)):
        (stage,) = properties(template, "AWS::ApiGateway::Stage")
        (settings,) = stage["MethodSettings"]
        assert (settings["HttpMethod"], settings["ResourcePath"]) == ("*", "/*")
        assert settings["ThrottlingRateLimit"] == rate
        assert settings["ThrottlingBurstLimit"] == burst
        assert settings["LoggingLevel"] == "ERROR"
        assert settings["DataTraceEnabled"] is False
        assert stage["TracingEnabled"] is True
        assert "$context.identity.userArn" in stage["AccessLogSetting"]["Format"]
        destination = flat(stage["AccessLogSetting"]["DestinationArn"])
        access_log_group = [
            g for g in resources(template, "AWS::Logs::LogGroup") if g.startswith("ApiAccessLogs")
        ]
        assert destination.endswith(f":log-group:<{access_log_group[0]}>")


def test_given_the_account_logging_role_is_managed_then_the_stack_sets_it_and_retains_it(dev, pinned):
    (account,) = resources(dev, "AWS::ApiGateway::Account").values()
    role = account["Properties"]["CloudWatchRoleArn"]["Fn::GetAtt"][0]
    assert resources(dev, "AWS::IAM::Role")[role]["DeletionPolicy"] == "Retain"
    assert resources(pinned, "AWS::ApiGateway::Account") == {}


def test_given_the_execution_logs_then_their_group_exists_with_retention(dev):
    names = [flat(group.get("LogGroupName", "")) for group in properties(dev, "AWS::Logs::LogGroup")]
    assert any(
        name.startswith("API-Gateway-Execution-Logs_<ApiRestApi") and name.endswith("/dev") for name in names
    )


def policy_statements(template, name):
    (policy,) = [p for p in properties(template, "AWS::IAM::ManagedPolicy") if p["ManagedPolicyName"] == name]
    statements = {}
    for statement in policy["PolicyDocument"]["Statement"]:
        assert statement["Action"] == "execute-api:Invoke"
        resources_ = (
            statement["Resource"] if isinstance(statement["Resource"], list) else [statement["Resource"]]
        )
        statements[statement["Effect"]] = sorted(flat(resource) for resource in resources_)
    return statements


def api_prefix(template, stage="dev"):
    (api,) = resources(template, "AWS::ApiGateway::RestApi")
    return f"arn:aws:execute-api:eu-west-1:<AWS::AccountId>:<{api}>/{stage}/"


def test_given_the_operator_policy_then_it_invokes_this_api_stage_but_never_the_internal_routes(dev):
    prefix = api_prefix(dev)
    statements = policy_statements(dev, "fleetkeeper-dev-api-operator")
    assert statements["Allow"] == sorted(
        [f"{prefix}{method}/api/*" for method in API_METHODS]
        + [f"{prefix}GET/openapi.json", f"{prefix}GET/docs"]
    )
    # /api/* also matches /api/internal/* and the health route: the explicit Deny keeps operators out.
    assert statements["Deny"] == sorted(
        [
            *(f"{prefix}{method}/api/internal/*" for method in API_METHODS),
            f"{prefix}POST/api/v1/workers/*/health",
        ]
    )


def test_given_the_read_only_policy_then_it_invokes_get_methods_only(dev):
    prefix = api_prefix(dev)
    statements = policy_statements(dev, "fleetkeeper-dev-api-read-only")
    assert statements["Allow"] == [f"{prefix}GET/api/*", f"{prefix}GET/docs", f"{prefix}GET/openapi.json"]
    assert f"{prefix}GET/api/internal/*" in statements["Deny"]


def test_given_the_tooling_policy_then_it_invokes_the_internal_routes_and_the_health_route_only(dev):
    prefix = api_prefix(dev)
    statements = policy_statements(dev, "fleetkeeper-dev-api-internal-tooling")
    assert statements == {"Allow": [f"{prefix}POST/api/internal/*", f"{prefix}POST/api/v1/workers/*/health"]}


def test_given_the_worker_agent_policy_then_it_invokes_the_health_route_only(dev):
    prefix = api_prefix(dev)
    statements = policy_statements(dev, "fleetkeeper-dev-api-worker-agent")
    assert statements == {"Allow": [f"{prefix}POST/api/v1/workers/*/health"]}


def test_given_the_pinned_account_then_policies_name_that_account(pinned):
    arns = policy_statements(pinned, "fleetkeeper-pinned-api-read-only")["Allow"]
    assert all(":123456789012:" in arn for arn in arns)


def test_given_prod_as_shipped_without_a_subnet_then_it_refuses_to_synthesize():
    context = {**shipped_cdk_json_context(), "stage": "prod"}
    with pytest.raises(ConfigError, match=r"subnet_id must be set"):
        load_stage_config(context.get)


INTERNAL_RESOURCES = ["execute-api:/*/*/api/internal", "execute-api:/*/*/api/internal/*"]


def resource_policy(template):
    (api,) = properties(template, "AWS::ApiGateway::RestApi")
    return api["Policy"]


HEALTH_RESOURCES = "execute-api:/*/POST/api/v1/workers/*/health"


def test_given_no_tooling_principals_then_the_api_denies_the_internal_routes_to_everyone(dev):
    statement, health = resource_policy(dev)["Statement"]
    assert (health["Effect"], health["Resource"], health.get("Condition")) == ("Deny", HEALTH_RESOURCES, None)
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == {"AWS": "*"}
    assert statement["Action"] == "execute-api:Invoke"
    assert statement["Resource"] == INTERNAL_RESOURCES
    assert "Condition" not in statement
    env = function_properties(dev, "fleetkeeper-dev-api")["Environment"]["Variables"]
    assert env["TOOLING_PRINCIPALS"] == ""


def test_given_tooling_principals_then_the_api_denies_the_internal_routes_to_every_other_principal(pinned):
    # Deny-only: an explicit Deny on the API wins over AdministratorAccess or any broad Invoke grant,
    # and it allows nothing by itself (callers still need the tooling policy).
    statement, health = resource_policy(pinned)["Statement"]
    assert (statement["Effect"], statement["Resource"]) == ("Deny", INTERNAL_RESOURCES)
    assert statement["Condition"] == {"ArnNotLike": {"aws:PrincipalArn": PINNED_TOOLING}}
    # The health route: the stage's worker agents and its tooling principals, nobody else.
    assert (health["Effect"], health["Resource"]) == ("Deny", HEALTH_RESOURCES)
    assert health["Condition"] == {"ArnNotLike": {"aws:PrincipalArn": [PINNED_AGENT, *PINNED_TOOLING]}}
    env = function_properties(pinned, "fleetkeeper-pinned-api")["Environment"]["Variables"]
    assert env["WORKER_AGENT_PRINCIPALS"] == PINNED_AGENT
    # The route checks the caller against the same list.
    env = function_properties(pinned, "fleetkeeper-pinned-api")["Environment"]["Variables"]
    assert env["TOOLING_PRINCIPALS"] == ",".join(PINNED_TOOLING)


@pytest.mark.parametrize(
    "principal",
    [
        "arn:aws:iam::123456789012:root",
        "arn:aws:sts::123456789012:assumed-role/gc/session",
        "arn:aws:iam::123456789012:role/*",
        "fleetkeeper-gc",
    ],
)
def test_given_a_tooling_principal_that_is_not_a_role_or_user_arn_then_the_synth_names_the_key(principal):
    context = with_setting("dev", ("api", "tooling_principals"), [principal])
    with pytest.raises(ConfigError, match=r"'fleetkeeper:stages\.dev\.api\.tooling_principals\.0'"):
        load(context, "dev")
