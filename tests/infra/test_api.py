"""The admin API: SigV4 on every method, validated, logged, throttled, and two policies to call it."""

from __future__ import annotations

import pytest

from infra.api import API_METHODS
from tests.infra.helpers import flat, properties, resources

STAGES = ("dev", "prod", "pinned")


@pytest.mark.parametrize("stage", STAGES)
def test_given_any_stage_then_every_method_requires_aws_iam(synthesized, stage):
    methods = properties(synthesized.template(stage), "AWS::ApiGateway::Method")
    assert len(methods) == len(API_METHODS) + 1
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
    assert sorted(m["HttpMethod"] for m in proxied) == sorted(API_METHODS)
    assert all(m["RequestParameters"] == {"method.request.path.proxy": True} for m in proxied)
    paths = {r["PathPart"] for r in properties(dev, "AWS::ApiGateway::Resource")}
    assert paths == {"api", "{proxy+}", "openapi.json"}


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


def policy_resources(template, name):
    (policy,) = [p for p in properties(template, "AWS::IAM::ManagedPolicy") if p["ManagedPolicyName"] == name]
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert statement["Action"] == "execute-api:Invoke"
    return sorted(flat(resource) for resource in statement["Resource"])


def test_given_the_operator_policy_then_it_invokes_every_method_of_this_api_stage_only(dev):
    (api,) = resources(dev, "AWS::ApiGateway::RestApi")
    arns = policy_resources(dev, "fleetkeeper-dev-api-operator")
    prefix = f"arn:aws:execute-api:eu-west-1:<AWS::AccountId>:<{api}>/dev/"
    assert arns == sorted(
        [f"{prefix}{method}/api/*" for method in API_METHODS] + [f"{prefix}GET/openapi.json"]
    )


def test_given_the_read_only_policy_then_it_invokes_get_methods_only(dev):
    (api,) = resources(dev, "AWS::ApiGateway::RestApi")
    prefix = f"arn:aws:execute-api:eu-west-1:<AWS::AccountId>:<{api}>/dev/"
    assert policy_resources(dev, "fleetkeeper-dev-api-read-only") == [
        f"{prefix}GET/api/*",
        f"{prefix}GET/openapi.json",
    ]


def test_given_the_pinned_account_then_policies_name_that_account(pinned):
    arns = policy_resources(pinned, "fleetkeeper-pinned-api-read-only")
    assert all(":123456789012:" in arn for arn in arns)
