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
INTERNAL_PREFIX: Final = "internal"
OPENAPI_PATH: Final = "openapi.json"
DOCS_PATH: Final = "docs"
# The verbs the API function routes; anything else never reaches Lambda.
API_METHODS: Final = ("GET", "POST", "PUT", "PATCH")
READ_ONLY_METHODS: Final = ("GET",)
# The internal routes apply what EC2 observed; only tooling calls them, with its own policy.
INTERNAL_METHODS: Final = ("POST",)
# A worker's agent reports its health here; only worker agents and tooling call it (docs/repair.md).
HEALTH_PATH: Final = "v1/workers/*/health"

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


def internal_routes_policy(
    tooling_principals: tuple[str, ...], worker_agent_principals: tuple[str, ...] = ()
) -> iam.PolicyDocument:
    """The API's resource policy: /api/internal/* is denied to every principal but the tooling ones, and
    the health route to every principal but the worker agents and the tooling ones.

    An explicit Deny on the API itself wins over any identity policy (AdministratorAccess included), so
    the internal routes do not depend on every policy in the account leaving them out. Nothing here
    allows: same-account callers still need execute-api:Invoke from their own policies. The resource is
    spelled relative to this API (`execute-api:/stage/method/path`), for every stage and method.
    """
    deny = iam.PolicyStatement(
        sid="InternalRoutesAreForToolingOnly",
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=["execute-api:Invoke"],
        resources=[
            f"execute-api:/*/*/{API_PREFIX}/{INTERNAL_PREFIX}",
            f"execute-api:/*/*/{API_PREFIX}/{INTERNAL_PREFIX}/*",
        ],
    )
    if tooling_principals:
        # aws:PrincipalArn of a role's session is the role's ARN (with its path): the sessions pass too.
        deny.add_condition("ArnNotLike", {"aws:PrincipalArn": list(tooling_principals)})
    health = iam.PolicyStatement(
        sid="HealthRouteIsForWorkerAgents",
        effect=iam.Effect.DENY,
        principals=[iam.AnyPrincipal()],
        actions=["execute-api:Invoke"],
        resources=[f"execute-api:/*/POST/{API_PREFIX}/{HEALTH_PATH}"],
    )
    reporters = [*worker_agent_principals, *tooling_principals]
    if reporters:
        health.add_condition("ArnNotLike", {"aws:PrincipalArn": reporters})
    return iam.PolicyDocument(statements=[deny, health])


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
        resource_policy = internal_routes_policy(
            config.api.tooling_principals, config.api.worker_agent_principals
        )
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
            policy=resource_policy,
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
        # API Gateway applies a changed resource policy only with a new deployment.
        if self.rest_api.latest_deployment is not None:
            self.rest_api.latest_deployment.add_to_logical_id({"resource_policy": resource_policy.to_json()})
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

        def add_methods(resource: apigw.IResource, methods: tuple[str, ...], *, proxy: bool) -> None:
            for method in methods:
                self.methods.append(
                    resource.add_method(
                        method,
                        integration,
                        authorization_type=apigw.AuthorizationType.IAM,
                        request_validator=validator,
                        request_parameters={"method.request.path.proxy": True} if proxy else None,
                    )
                )

        api = self.rest_api.root.add_resource(API_PREFIX)
        add_methods(api.add_resource("{proxy+}"), API_METHODS, proxy=True)
        # Its own resource, so tooling's grant and the operators' Deny name it exactly.
        add_methods(api.add_resource(INTERNAL_PREFIX).add_resource("{proxy+}"), INTERNAL_METHODS, proxy=True)
        add_methods(self.rest_api.root.add_resource(OPENAPI_PATH), READ_ONLY_METHODS, proxy=False)
        self.swagger_ui = config.api.swagger_ui
        if self.swagger_ui:
            add_methods(self.rest_api.root.add_resource(DOCS_PATH), READ_ONLY_METHODS, proxy=False)

        internal = self.internal_arns(INTERNAL_METHODS)
        health = [self._arn("POST", f"/{API_PREFIX}/{HEALTH_PATH}")]
        self.operator_policy = self._invoke_policy(
            "OperatorPolicy",
            name=f"fleetkeeper-{config.name}-api-operator",
            description="Call the fleetkeeper admin API: reads, drains, cancels and writes; never the "
            "internal routes, nor a worker's health report.",
            resources=self.method_arns(API_METHODS),
            deny=[*self.internal_arns(API_METHODS), *health],
        )
        self.read_only_policy = self._invoke_policy(
            "ReadOnlyPolicy",
            name=f"fleetkeeper-{config.name}-api-read-only",
            description="Call the fleetkeeper admin API's GET methods only.",
            resources=self.method_arns(READ_ONLY_METHODS),
            deny=[*self.internal_arns(API_METHODS), *health],
        )
        self.tooling_policy = self._invoke_policy(
            "ToolingPolicy",
            name=f"fleetkeeper-{config.name}-api-internal-tooling",
            description="Report what EC2 observed about a worker (POST /api/internal/...) and a worker's "
            "health: tooling only.",
            resources=[*internal, *health],
        )
        self.worker_agent_policy = self._invoke_policy(
            "WorkerAgentPolicy",
            name=f"fleetkeeper-{config.name}-api-worker-agent",
            description="Report a worker's health (POST /api/v1/workers/{id}/health): worker agents only.",
            resources=health,
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

    def _arn(self, method: str, path: str) -> str:
        return self.rest_api.arn_for_execute_api(method, path, self.stage_name)

    def method_arns(self, methods: tuple[str, ...]) -> list[str]:
        """The public routes (everything under /api), the contract, and the docs page when deployed."""
        arns = [self._arn(method, f"/{API_PREFIX}/*") for method in methods]
        arns.append(self._arn("GET", f"/{OPENAPI_PATH}"))
        if self.swagger_ui:
            arns.append(self._arn("GET", f"/{DOCS_PATH}"))
        return arns

    def internal_arns(self, methods: tuple[str, ...]) -> list[str]:
        return [self._arn(method, f"/{API_PREFIX}/{INTERNAL_PREFIX}/*") for method in methods]

    def _invoke_policy(
        self,
        construct_id: str,
        *,
        name: str,
        description: str,
        resources: list[str],
        deny: list[str] | None = None,
    ) -> iam.ManagedPolicy:
        statements = [iam.PolicyStatement(actions=["execute-api:Invoke"], resources=resources)]
        if deny:
            # /api/* above also matches /api/internal/* and the health route: an explicit Deny wins.
            statements.append(
                iam.PolicyStatement(effect=iam.Effect.DENY, actions=["execute-api:Invoke"], resources=deny)
            )
        policy = iam.ManagedPolicy(
            self,
            construct_id,
            managed_policy_name=name,
            description=description,
            statements=statements,
        )
        acknowledge_wildcards(
            policy,
            resources,
            "The API routes every path under a prefix through one proxy resource; the grant is limited to "
            "this API, this stage and the listed HTTP methods.",
        )
        return policy
