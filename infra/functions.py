"""The Lambda functions: one factory, shared defaults, per-function sizing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from aws_cdk import Annotations, Duration, RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_lambda_destinations as destinations
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from infra.config import StageConfig
from infra.dependencies import LAMBDA_PYTHON, layer_dir
from infra.permissions import acknowledge
from infra.shared_layer import shared_layer_dir

ROOT: Final = Path(__file__).resolve().parents[1]
FUNCTIONS_DIR: Final = ROOT / "functions"
# Local caches and build leftovers must not change the asset hash or ship to Lambda.
ASSET_EXCLUDES: Final = ["**/__pycache__", "**/*.pyc", "**/*.egg-info", ".mypy_cache", ".pytest_cache"]

# The runtime runs the Python minor version the tests run on (.python-version); the dependency layer is
# built for it and for this CPU (infra/dependencies.py), so the three move together.
RUNTIME: Final = lambda_.Runtime(
    f"python{LAMBDA_PYTHON}",
    lambda_.RuntimeFamily.PYTHON,
    # Lambda restores Python functions from SnapStart snapshots from Python 3.12 on.
    supports_snap_start=tuple(map(int, LAMBDA_PYTHON.split("."))) >= (3, 12),
)
ARCHITECTURE: Final = lambda_.Architecture.ARM_64
POWERTOOLS_LOG_LEVELS: Final = {
    "DEBUG": lambda_.ApplicationLogLevel.DEBUG,
    "INFO": lambda_.ApplicationLogLevel.INFO,
    "WARNING": lambda_.ApplicationLogLevel.WARN,
    "ERROR": lambda_.ApplicationLogLevel.ERROR,
}


@dataclass(frozen=True)
class FunctionSpec:
    """What differs between functions; everything else is a shared default of the factory."""

    name: str
    description: str
    memory_mb: int
    timeout: Duration
    # Invoked asynchronously (schedules, EventBridge rules): failures go to the DLQ after these retries.
    asynchronous: bool = False
    retry_attempts: int = 2
    max_event_age: Duration | None = None
    fleet_settings: bool = False
    environment: Mapping[str, str] = field(default_factory=dict)
    # Restore from a snapshot of the initialised function; callers invoke the alias `live`.
    snap_start: bool = False


def function_specs(config: StageConfig) -> tuple[FunctionSpec, ...]:
    reconcile_period = Duration.minutes(config.schedules.reconcile_rate_minutes)
    discovery_period = Duration.minutes(config.schedules.discovery_rate_minutes)
    return (
        # API Gateway gives up after 29 s; a longer timeout would only hide a hung request.
        FunctionSpec(
            "api",
            "fleetkeeper admin API",
            memory_mb=512,
            timeout=Duration.seconds(29),
            snap_start=config.api.snap_start,
            # The regions the stage manages: a worker asked for anywhere else is refused (422).
            environment={"REGION_CONFIGS": config.region_configs_json()},
        ),
        # The finish step may wait for the template's before_stop operations on top of its own work.
        FunctionSpec(
            "drain_tasks",
            "Steps of the drain state machine",
            memory_mb=256,
            timeout=Duration.seconds(60 + config.operations.before_stop_timeout_seconds),
        ),
        # A reconcile run must end before the next tick, so two runs rarely overlap; a failed run is not
        # retried because the next tick does the same work with fresher data.
        FunctionSpec(
            "reconcile",
            "Per-status reconciliation of the workers needing action",
            memory_mb=1024,
            timeout=Duration.seconds(min(55 * config.schedules.reconcile_rate_minutes, 300)),
            asynchronous=True,
            retry_attempts=0,
            max_event_age=Duration.seconds(max(60, reconcile_period.to_seconds())),
            fleet_settings=True,
        ),
        FunctionSpec(
            "discover",
            "Discovery of managed EC2 instances and orphan garbage collection",
            memory_mb=512,
            timeout=Duration.seconds(min(60 * config.schedules.discovery_rate_minutes - 30, 900)),
            asynchronous=True,
            retry_attempts=0,
            max_event_age=Duration.seconds(max(60, discovery_period.to_seconds())),
            fleet_settings=True,
        ),
        # EC2 events are not repeated by EC2: retry them, for up to an hour.
        FunctionSpec(
            "ec2_events",
            "Applies EC2 state-change and spot interruption events",
            memory_mb=256,
            timeout=Duration.seconds(30),
            asynchronous=True,
            retry_attempts=2,
            max_event_age=Duration.hours(1),
            # Rebalance recommendations: on or off, and their drain's deadline.
            environment={
                "REBALANCE_DRAIN_ENABLED": "true" if config.rebalance.enabled else "false",
                "REBALANCE_DRAIN_TIMEOUT_SECONDS": str(config.rebalance.drain_timeout_seconds),
            },
        ),
    )


def fleet_settings_environment(config: StageConfig) -> dict[str, str]:
    """The reconciler's and discovery's settings, as the handlers read them from the environment."""
    scale_down = config.scale_down
    return {
        "REGION_CONFIGS": config.region_configs_json(),
        "GC_MODE": config.gc_mode,
        "AMI_OWNERS": ",".join(config.ami_owners),
        "RECONCILE_SHARDS": str(config.schedules.reconcile_shards),
        "SCALE_DOWN_ENABLED": "true" if scale_down.enabled else "false",
        "MIN_WORKERS": str(scale_down.min_workers),
        "SCALE_DOWN_COOLDOWN_SECONDS": str(scale_down.cooldown_seconds),
        "IDLE_WINDOW_SECONDS": str(scale_down.idle_window_seconds),
        "IDLE_CPU_THRESHOLD": str(scale_down.idle_cpu_threshold),
        "SCALE_DOWN_LOOKAHEAD_SECONDS": str(scale_down.lookahead_seconds),
        "MAX_CONCURRENT_DRAINS": str(scale_down.max_concurrent_drains),
        "IMPORT_GRACE_SECONDS": str(config.import_grace_seconds),
        "ORPHAN_GC_MAX_SHARE_PERCENT": str(config.orphan_gc.max_share_percent),
        "ORPHAN_GC_MAX_RETIRE_PER_RUN": str(config.orphan_gc.max_retire_per_run),
        "DRAIN_WATCHDOG_INTERVAL_SECONDS": str(config.drain_watchdog_interval_seconds),
    }


class Functions(Construct):
    """Every function: its own role, its own log group, ARM64, X-Ray, Powertools settings, shared layers."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: StageConfig,
        environment: Mapping[str, str],
        async_failures: sqs.IQueue,
    ) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self._environment = {
            **environment,
            "POWERTOOLS_SERVICE_NAME": "fleetkeeper",
            "POWERTOOLS_METRICS_NAMESPACE": "fleetkeeper",
            "POWERTOOLS_LOG_LEVEL": config.log_level,
        }
        self._async_failures = async_failures
        self.shared_layer = lambda_.LayerVersion(
            self,
            "SharedLayer",
            # Staged with its bytecode: /opt is read-only, and a cold start would compile every module.
            code=lambda_.Code.from_asset(str(shared_layer_dir())),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="fleetkeeper package (domain, store, cloud, services)",
        )
        # Our own build of requirements/lambda.txt rather than the AWS-managed Powertools layer and the
        # runtime's boto3: the versions the tests ran are the versions that deploy (docs/dependencies.md).
        self.dependencies_layer = lambda_.LayerVersion(
            self,
            "DependenciesLayer",
            code=lambda_.Code.from_asset(str(layer_dir())),
            compatible_runtimes=[RUNTIME],
            compatible_architectures=[ARCHITECTURE],
            description="fleetkeeper third-party dependencies, from requirements/lambda.txt",
        )
        self.by_name: dict[str, lambda_.Function] = {}
        self.roles: dict[str, iam.Role] = {}
        # What callers invoke: the alias of a SnapStart function, otherwise the function itself.
        self.entry_points: dict[str, lambda_.IFunction] = {}
        for spec in function_specs(config):
            self._create(spec)

    def _create(self, spec: FunctionSpec) -> None:
        config = self._config
        construct_id = spec.name.title().replace("_", "")
        removal = RemovalPolicy.RETAIN if config.retain else RemovalPolicy.DESTROY
        log_group = logs.LogGroup(
            self, f"{construct_id}Logs", retention=config.log_retention, removal_policy=removal
        )
        # No AWSLambdaBasicExecutionRole: the function writes to its own log group and nowhere else.
        role = iam.Role(
            self,
            f"{construct_id}Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"fleetkeeper {config.name} {spec.name} function",
        )
        log_group.grant_write(role)
        acknowledge(
            role,
            "IAM5[Resource::*]",
            "X-Ray PutTraceSegments and PutTelemetryRecords, added for active tracing, support no "
            "resource-level permissions.",
        )
        environment = dict(self._environment)
        if spec.fleet_settings:
            environment.update(fleet_settings_environment(config))
        environment.update(spec.environment)
        function = lambda_.Function(
            self,
            construct_id,
            function_name=f"fleetkeeper-{config.name}-{spec.name.replace('_', '-')}",
            description=spec.description,
            code=lambda_.Code.from_asset(str(FUNCTIONS_DIR / spec.name), exclude=ASSET_EXCLUDES),
            handler="handler.handler",
            runtime=RUNTIME,
            architecture=ARCHITECTURE,
            memory_size=spec.memory_mb,
            timeout=spec.timeout,
            role=role,
            layers=[self.dependencies_layer, self.shared_layer],
            environment=environment,
            tracing=lambda_.Tracing.ACTIVE,
            log_group=log_group,
            logging_format=lambda_.LoggingFormat.JSON,
            application_log_level_v2=POWERTOOLS_LOG_LEVELS[config.log_level],
            system_log_level_v2=lambda_.SystemLogLevel.WARN,
            on_failure=destinations.SqsDestination(self._async_failures) if spec.asynchronous else None,
            retry_attempts=spec.retry_attempts if spec.asynchronous else None,
            max_event_age=spec.max_event_age if spec.asynchronous else None,
            snap_start=lambda_.SnapStartConf.ON_PUBLISHED_VERSIONS if spec.snap_start else None,
        )
        acknowledge(
            function,
            "L1",
            f"{RUNTIME.name} is the Python the tests run on (.python-version) and the dependency layer is "
            "built for; moving to a newer runtime is a change of that file and a `make lock`.",
        )
        self.by_name[spec.name] = function
        self.roles[spec.name] = role
        # SnapStart restores published versions only: each deployment publishes one (current_version
        # changes with the code and configuration) and moves the alias to it.
        self.entry_points[spec.name] = function
        if spec.snap_start:
            self.entry_points[spec.name] = lambda_.Alias(
                self, f"{construct_id}Live", alias_name="live", version=function.current_version
            )
            Annotations.of(function).acknowledge_warning(
                "@aws-cdk/aws-lambda:snapStartRequirePublish",
                "Published: current_version is a new version on each change; the alias `live` follows it.",
            )

    @property
    def api(self) -> lambda_.Function:
        return self.by_name["api"]

    @property
    def api_entry_point(self) -> lambda_.IFunction:
        return self.entry_points["api"]

    @property
    def drain_tasks(self) -> lambda_.Function:
        return self.by_name["drain_tasks"]

    @property
    def reconcile(self) -> lambda_.Function:
        return self.by_name["reconcile"]

    @property
    def discover(self) -> lambda_.Function:
        return self.by_name["discover"]

    @property
    def ec2_events(self) -> lambda_.Function:
        return self.by_name["ec2_events"]
