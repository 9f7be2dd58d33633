"""The admin REST API: AWS_IAM on every method, and the IAM policies operators attach to call it."""

from __future__ import annotations

import json
from typing import Final

from aws_cdk import RemovalPolicy
from aws_cdk import aws_apigateway as apigw
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.config import StageConfig
from infra.permissions import acknowledge, acknowledge_aws_managed_policy, acknowledge_wildcards

API_PREFIX: Final = "api"
OPENAPI_PATH: Final = "openapi.json"
# The verbs the API function routes; anything else never reaches Lambda.
API_METHODS: Final = ("GET", "POST", "PUT", "PATCH", "DELETE")
READ_ONLY_METHODS: Final = ("GET",)

_ACCESS_LOG_FIELDS: Final = {
    "requestId": apigw.AccessLogField.context_request_id(),
    "time": apigw.AccessLogField.context_request_time(),
    "ip": apigw.AccessLogField.context_identity_source_ip(),
    # Who called: with AWS_IAM this is the signing principal, the audit trail of every admin action.
    "caller": apigw.AccessLogField.context_identity_caller(),
    "userArn": apigw.AccessLogField.context_identity_user_arn(),
    "method": apigw.AccessLogField.context_http_method(),
    "resourcePath": apigw.AccessLogField.context_resource_path(),
    "path": apigw.AccessLogField.context_path(),
    "status": apigw.AccessLogField.context_status(),
    "protocol": apigw.AccessLogField.context_protocol(),
    "responseLength": apigw.AccessLogField.context_response_length(),
    "responseLatency": apigw.AccessLogField.context_response_latency(),
    "integrationLatency": apigw.AccessLogField.context_integration_latency(),
    "error": apigw.AccessLogField.context_error_message(),
}


class AdminApi(Construct):
    """REST API proxying /api/{proxy+} and /openapi.json to the api function."""

    def __init__(
        self, scope: Construct, construct_id: str, *, config: StageConfig, handler: lambda_.IFunction
    ) -> None:
        super().__init__(scope, construct_id)
        removal = RemovalPolicy.RETAIN if config.retain else RemovalPolicy.DESTROY
        self.stage_name = config.name
        self.access_logs = logs.LogGroup(
            self, "AccessLogs", retention=config.log_retention, removal_policy=removal
        )
        manage_role = config.api.manage_account_logging_role
        self.rest_api = apigw.RestApi(
            self,
            "RestApi",
            rest_api_name=f"fleetkeeper-{config.name}",
            description=f"fleetkeeper {config.name} admin API (SigV4 only)",
            endpoint_types=[apigw.EndpointType.REGIONAL],
            cloud_watch_role=manage_role,
            # Other stacks in the account rely on the logging role once it is set: never delete it.
            cloud_watch_role_removal_policy=RemovalPolicy.RETAIN if manage_role else None,
            default_method_options=apigw.MethodOptions(authorization_type=apigw.AuthorizationType.IAM),
            deploy_options=apigw.StageOptions(
                stage_name=config.name,
                throttling_rate_limit=config.api.throttling_rate_limit,
                throttling_burst_limit=config.api.throttling_burst_limit,
                access_log_destination=apigw.LogGroupLogDestination(self.access_logs),
                access_log_format=apigw.AccessLogFormat.custom(json.dumps(_ACCESS_LOG_FIELDS)),
                logging_level=apigw.MethodLoggingLevel.ERROR,
                # Request and response bodies stay out of the logs: they name machines and operators.
                data_trace_enabled=False,
                metrics_enabled=True,
                tracing_enabled=True,
            ),
        )
        # The stack exports the URL under a stable output name of its own; drop CDK's hashed duplicate.
        self.rest_api.node.try_remove_child("Endpoint")
        # API Gateway creates its execution log group on first use, with no retention: create it first.
        execution_logs = logs.LogGroup(
            self,
            "ExecutionLogs",
            log_group_name=f"API-Gateway-Execution-Logs_{self.rest_api.rest_api_id}/{config.name}",
            retention=config.log_retention,
            removal_policy=removal,
        )
        self.rest_api.deployment_stage.node.add_dependency(execution_logs)

        # The gateway rejects requests missing a required parameter before Lambda runs. Body validation
        # applies only to methods that declare a request model, and none do: bodies are validated once,
        # by the function's pydantic models, which are also what /openapi.json publishes.
        validator = self.rest_api.add_request_validator(
            "Validator",
            request_validator_name=f"fleetkeeper-{config.name}-requests",
            validate_request_parameters=True,
            validate_request_body=True,
        )
        integration = apigw.LambdaIntegration(handler, proxy=True, allow_test_invoke=False)
        self.methods: list[apigw.Method] = []
        proxy = self.rest_api.root.add_resource(API_PREFIX).add_resource("{proxy+}")
        for method in API_METHODS:
            self.methods.append(
                proxy.add_method(
                    method,
                    integration,
                    authorization_type=apigw.AuthorizationType.IAM,
                    request_validator=validator,
                    request_parameters={"method.request.path.proxy": True},
                )
            )
        self.methods.append(
            self.rest_api.root.add_resource(OPENAPI_PATH).add_method(
                "GET",
                integration,
                authorization_type=apigw.AuthorizationType.IAM,
                request_validator=validator,
            )
        )

        self.operator_policy = self._invoke_policy(
            "OperatorPolicy",
            name=f"fleetkeeper-{config.name}-api-operator",
            description="Call every fleetkeeper admin API method: reads, drains, cancels and writes.",
            methods=API_METHODS,
        )
        self.read_only_policy = self._invoke_policy(
            "ReadOnlyPolicy",
            name=f"fleetkeeper-{config.name}-api-read-only",
            description="Call the fleetkeeper admin API's GET methods only.",
            methods=READ_ONLY_METHODS,
        )

        acknowledge(
            self.rest_api,
            "APIG3",
            "Operators' control API: every method requires SigV4 (AWS_IAM), unsigned requests are refused "
            "before any integration runs, and the stage is throttled; there is no public traffic to filter.",
        )
        acknowledge(
            self.rest_api,
            "COG4",
            "Callers are operators and tools signing with IAM credentials, authorised by the exported IAM "
            "policies; there are no end users for a Cognito user pool.",
        )
        if manage_role:
            acknowledge_aws_managed_policy(
                self.rest_api,
                "service-role/AmazonAPIGatewayPushToCloudWatchLogs",
                "API Gateway's account-wide logging role uses the policy AWS maintains for exactly that "
                "role; only apigateway.amazonaws.com can assume it.",
            )

    def method_arns(self, methods: tuple[str, ...]) -> list[str]:
        arns = [
            self.rest_api.arn_for_execute_api(method, f"/{API_PREFIX}/*", self.stage_name)
            for method in methods
        ]
        arns.append(self.rest_api.arn_for_execute_api("GET", f"/{OPENAPI_PATH}", self.stage_name))
        return arns

    def _invoke_policy(
        self, construct_id: str, *, name: str, description: str, methods: tuple[str, ...]
    ) -> iam.ManagedPolicy:
        resources = self.method_arns(methods)
        policy = iam.ManagedPolicy(
            self,
            construct_id,
            managed_policy_name=name,
            description=description,
            statements=[iam.PolicyStatement(actions=["execute-api:Invoke"], resources=resources)],
        )
        acknowledge_wildcards(
            policy,
            resources,
            "The API routes every path under /api through one proxy resource; the grant is limited to this "
            "API, this stage and the listed HTTP methods.",
        )
        return policy
