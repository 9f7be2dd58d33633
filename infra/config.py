"""Stage settings, read from the CDK context (cdk.json or `-c`) and validated once.

Every error names the context key that is wrong, e.g. `fleetkeeper:stages.prod.scale_down.min_workers`,
so a bad cdk.json fails the synth with a message an operator can act on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Final, Literal

from aws_cdk import aws_logs as logs
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fleetkeeper.domain.models import INSTANCE_TYPE_PATTERN
from fleetkeeper.domain.operations import Catalogue, OperationSpec
from fleetkeeper.domain.sharding import MAX_SHARDS
from fleetkeeper.store import schema

STAGE_KEY: Final = "stage"
STAGES_KEY: Final = "fleetkeeper:stages"

# CloudWatch Logs accepts only these retention periods; the CDK enum names them, CloudFormation counts days.
RETENTION_DAYS: Final[dict[int, logs.RetentionDays]] = {
    1: logs.RetentionDays.ONE_DAY,
    3: logs.RetentionDays.THREE_DAYS,
    5: logs.RetentionDays.FIVE_DAYS,
    7: logs.RetentionDays.ONE_WEEK,
    14: logs.RetentionDays.TWO_WEEKS,
    30: logs.RetentionDays.ONE_MONTH,
    60: logs.RetentionDays.TWO_MONTHS,
    90: logs.RetentionDays.THREE_MONTHS,
    120: logs.RetentionDays.FOUR_MONTHS,
    150: logs.RetentionDays.FIVE_MONTHS,
    180: logs.RetentionDays.SIX_MONTHS,
    365: logs.RetentionDays.ONE_YEAR,
    400: logs.RetentionDays.THIRTEEN_MONTHS,
    545: logs.RetentionDays.EIGHTEEN_MONTHS,
    731: logs.RetentionDays.TWO_YEARS,
    1096: logs.RetentionDays.THREE_YEARS,
    1827: logs.RetentionDays.FIVE_YEARS,
    3653: logs.RetentionDays.TEN_YEARS,
}

RegionName = Annotated[str, Field(pattern=r"^[a-z]{2}(-gov)?-[a-z]+-\d$")]
# A role or a user, with its path when it has one; the role's sessions are that role (aws:PrincipalArn).
IamPrincipalArn = Annotated[
    str, Field(pattern=r"^arn:aws[a-z-]*:iam::\d{12}:(role|user)/([\w+=,.@-]+/)*[\w+=,.@-]{1,64}$")
]
ResourceId = Annotated[str, Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9._:/-]+$")]


class ConfigError(ValueError):
    """The CDK context does not describe a valid stage; the message names the bad key."""


class _Section(BaseModel):
    # Unknown keys are typos until proven otherwise: a silently ignored setting is worse than a failed synth.
    model_config = ConfigDict(extra="forbid", frozen=True)


class RegionConfig(_Section):
    """Where and how the reconciler launches workers in one region."""

    subnet_id: ResourceId | None = None
    security_group_ids: tuple[ResourceId, ...] = ()
    key_name: ResourceId | None = None
    default_tags: dict[str, str] = Field(default_factory=dict)


class ScheduleConfig(_Section):
    reconcile_rate_minutes: int = Field(default=1, ge=1, le=60)
    discovery_rate_minutes: int = Field(default=5, ge=1, le=1440)
    # Parallel reconcile cycles, one schedule each, splitting the workers by a hash of their id
    # (docs/operations.md, "Sharding the reconciler").
    reconcile_shards: int = Field(default=1, ge=1, le=MAX_SHARDS)


class ScaleDownConfig(_Section):
    enabled: bool = False
    min_workers: int = Field(default=0, ge=0)
    cooldown_seconds: int = Field(default=900, gt=0)
    idle_window_seconds: int = Field(default=1800, gt=0)
    idle_cpu_threshold: float = Field(default=5.0, ge=0, le=100)
    lookahead_seconds: int = Field(default=900, ge=0)
    max_concurrent_drains: int = Field(default=2, ge=1)


class OrphanGcConfig(_Section):
    # More than this share of a region's live workers orphaned in one pass: GC retires none of them.
    max_share_percent: float = Field(default=20.0, ge=0, le=100)
    confirmation_ttl_seconds: int = Field(default=3600, gt=0)
    # Orphans one discovery run retires at most; the rest are retired by the next runs.
    max_retire_per_run: int = Field(default=1000, ge=1, le=10_000)


class RebalanceConfig(_Section):
    # Off by default: rebalance recommendations are far more frequent than interruptions.
    enabled: bool = False
    drain_timeout_seconds: int = Field(default=1800, ge=60, le=86400)


class OperationsConfig(_Section):
    """Worker operations (SSM Run Command): the stage's catalogue and how they are run."""

    # Operation name -> SSM document, accepted parameters, cleanup or not (fleetkeeper.domain.operations).
    catalogue: dict[str, OperationSpec] = Field(default_factory=dict)
    retry_base_seconds: float = Field(default=30.0, ge=0, le=900)
    # 0 turns the collect-system-info schedule off.
    system_info_interval_seconds: int = Field(default=3600, ge=0)
    # How long a drain's finish step waits for before_stop operations (the drain_tasks timeout grows by it).
    before_stop_timeout_seconds: int = Field(default=120, ge=1, le=600)
    # Days a finished operation and its audit items are kept (the table's TTL); 0 keeps them forever.
    retention_days: int = Field(default=30, ge=0)

    @field_validator("catalogue")
    @classmethod
    def _valid_catalogue(cls, value: dict[str, OperationSpec]) -> dict[str, OperationSpec]:
        Catalogue(operations=value)  # operation names are checked by the runtime's own rules
        return value

    def environment(self) -> dict[str, str]:
        """The settings the functions read (fleetkeeper.settings), as environment variables."""
        catalogue = {name: spec.model_dump(mode="json") for name, spec in sorted(self.catalogue.items())}
        return {
            "OPERATIONS_CATALOGUE": json.dumps(catalogue, sort_keys=True, separators=(",", ":")),
            "OPERATION_RETRY_BASE_SECONDS": str(self.retry_base_seconds),
            "SYSTEM_INFO_INTERVAL_SECONDS": str(self.system_info_interval_seconds),
            "BEFORE_STOP_TIMEOUT_SECONDS": str(self.before_stop_timeout_seconds),
            "OPERATION_RETENTION_DAYS": str(self.retention_days),
        }


class ApiConfig(_Section):
    throttling_rate_limit: float = Field(default=20, gt=0)
    throttling_burst_limit: int = Field(default=40, gt=0)
    # API Gateway logs to CloudWatch through ONE role per account and region. A stack that manages it
    # overwrites whatever another stack set; turn this off where another stage already owns that setting.
    manage_account_logging_role: bool = True
    # Swagger UI at /docs, behind the same SigV4 (AWS_IAM) authorization as every other method.
    swagger_ui: bool = False
    # Lambda SnapStart for the api function: API Gateway invokes the published version behind the alias
    # `live`, restored from a snapshot taken after init (docs/performance.md). Off: the unqualified
    # function, initialised on every cold start.
    snap_start: bool = True
    # The IAM roles and users that may call POST /api/internal/... (GC and admin tooling): the API's
    # resource policy denies those routes to every other principal, whatever its identity policies
    # allow, and the route checks the caller against the same list. Empty: nobody may call them.
    tooling_principals: tuple[IamPrincipalArn, ...] = ()
    # The IAM roles workers' agents sign with to report their health (POST /api/v1/workers/{id}/health):
    # the API's resource policy denies that route to every principal but these and the tooling ones, and
    # the route checks the caller again. Empty: only tooling may report.
    worker_agent_principals: tuple[IamPrincipalArn, ...] = ()


class WorkerProfileConfig(_Section):
    """An instance profile the deployer manages, used instead of the one the stage creates."""

    name: str = Field(pattern=r"^[\w+=,.@-]{1,128}$")
    # The profile's role, as iam:PassRole names it: the role name, after its IAM path when it has one
    # (e.g. "platform/fleet-worker"). CloudFormation cannot read it from the profile at synthesis.
    role: str = Field(pattern=r"^([\w+=,.@-]+/)*[\w+=,.@-]{1,64}$")


class StageConfig(_Section):
    """One deployment of fleetkeeper: an account/region pair and its tuning."""

    name: str = Field(pattern=r"^[a-z][a-z0-9-]{1,15}$")
    account: str | None = Field(default=None, pattern=r"^\d{12}$")
    region: RegionName
    regions: dict[RegionName, RegionConfig] = Field(min_length=1)
    schedules: ScheduleConfig = ScheduleConfig()
    scale_down: ScaleDownConfig = ScaleDownConfig()
    gc_mode: Literal["terminate", "report-only"] = "report-only"
    orphan_gc: OrphanGcConfig = OrphanGcConfig()
    # Discovery does not import a managed machine launched less than this long ago.
    import_grace_seconds: int = Field(default=30, ge=0)
    rebalance: RebalanceConfig = RebalanceConfig()
    alarm_email: str | None = Field(default=None, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_retention_days: int = 30
    removal_policy: Literal["retain", "destroy"] = "retain"
    drain_heartbeat_seconds: int = Field(default=300, gt=0)
    # The reconciler's watchdog describes an open drain's execution at most this often (0: every cycle).
    drain_watchdog_interval_seconds: int = Field(default=300, ge=0)
    idempotency_ttl_seconds: int = Field(default=3600, gt=0)
    # Days an audit item is kept (the table's TTL); 0 keeps the trail forever.
    audit_retention_days: int = Field(default=365, ge=0)
    api: ApiConfig = ApiConfig()
    operations: OperationsConfig = OperationsConfig()
    # Whose AMIs a launch may use: account ids, "amazon", or "self" (the stack's account). The reconciler
    # passes them to DescribeImages as they are; the ec2:Owner condition on RunInstances gets "self"
    # resolved to the account id, the only form IAM compares (infra/ec2_access.py).
    ami_owners: tuple[Annotated[str, Field(pattern=r"^(self|amazon|\d{12})$")], ...] = Field(
        default=("self",), min_length=1
    )
    # The instance types the stage's templates may use: the RunInstances grant allows no other (an
    # ec2:InstanceType condition), and the API refuses a template of another type (422 instance_type).
    instance_types: tuple[Annotated[str, Field(pattern=INSTANCE_TYPE_PATTERN)], ...] = Field(min_length=1)
    # The instance profile workers launch with (the SSM agent's permissions and the stage's operation
    # parameters). None: the stage creates one (infra/worker_profile.py).
    worker_instance_profile: WorkerProfileConfig | None = None
    # A stage that must launch only into named subnets and security groups refuses to synthesize
    # without them, instead of granting RunInstances on any subnet and any security group.
    require_pinned_network: bool = False
    # Table indexes this deploy leaves out: CloudFormation adds one index per stack update, so an
    # upgrade that brings two deploys once with the second deferred, then without (docs/deploy.md).
    deferred_indexes: tuple[str, ...] = ()

    @field_validator("deferred_indexes")
    @classmethod
    def _known_indexes(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = sorted(set(value) - set(schema.GSI_KEYS))
        if unknown:
            raise ValueError(
                f"no such table index: {', '.join(unknown)}; the table has {', '.join(schema.GSI_KEYS)}"
            )
        return value

    @model_validator(mode="after")
    def _network_pinned_where_required(self) -> StageConfig:
        if self.require_pinned_network:
            for region, settings in self.regions.items():
                if not settings.subnet_id:
                    raise ValueError(f"regions.{region}.subnet_id must be set (require_pinned_network)")
                if not settings.security_group_ids:
                    raise ValueError(
                        f"regions.{region}.security_group_ids must be set (require_pinned_network)"
                    )
        return self

    def unpinned_network_notes(self) -> list[str]:
        """One line per worker region whose launches are not pinned to a subnet and security groups,
        saying what that grants and how to pin it; `cdk synth` prints them."""
        notes = []
        for region, settings in sorted(self.regions.items()):
            missing = [
                key
                for key, value in (
                    ("subnet_id", settings.subnet_id),
                    ("security_group_ids", settings.security_group_ids),
                )
                if not value
            ]
            if not missing:
                continue
            notes.append(
                f"stage {self.name}: launches in {region} are not pinned ({' and '.join(missing)} unset in "
                f"{STAGES_KEY}.{self.name}.regions.{region}): the reconciler may launch into any subnet and "
                "security group of the account there, and without them EC2 uses the default VPC's. A "
                "checked-in stage cannot name them (they belong to the account it deploys into): set them "
                "for your account, and require_pinned_network to refuse such a synth, as prod does."
            )
        return notes

    @field_validator("log_retention_days")
    @classmethod
    def _known_retention(cls, value: int) -> int:
        if value not in RETENTION_DAYS:
            allowed = ", ".join(str(days) for days in RETENTION_DAYS)
            raise ValueError(f"{value} is not a CloudWatch Logs retention period; use one of {allowed}")
        return value

    @property
    def parameter_prefix(self) -> str:
        """Where the stage's operation parameters live in Parameter Store (e.g. its license token)."""
        return f"/fleetkeeper/{self.name}/"

    @property
    def retain(self) -> bool:
        return self.removal_policy == "retain"

    @property
    def log_retention(self) -> logs.RetentionDays:
        return RETENTION_DAYS[self.log_retention_days]

    def region_configs_json(self) -> str:
        """REGION_CONFIGS as the reconciler and discovery read it; sorted, so the template is stable."""
        payload = {region: config.model_dump(mode="json") for region, config in self.regions.items()}
        return json.dumps(payload, sort_keys=True, separators=(",", ":"))


ContextLookup = Callable[[str], Any]


def load_stage_config(try_get_context: ContextLookup) -> StageConfig:
    """The stage selected with `-c stage=<name>`, validated against its entry in `fleetkeeper:stages`."""
    stages = try_get_context(STAGES_KEY)
    if not isinstance(stages, dict) or not stages:
        raise ConfigError(f"cdk.json context '{STAGES_KEY}' is missing or not an object of stage settings")
    stage = try_get_context(STAGE_KEY)
    known = ", ".join(sorted(stages))
    if not stage:
        raise ConfigError(
            f"context '{STAGE_KEY}' is not set: pass -c {STAGE_KEY}=<{known.replace(', ', '|')}>"
        )
    if stage not in stages:
        raise ConfigError(f"context '{STAGE_KEY}': unknown stage '{stage}'; cdk.json defines {known}")
    settings = stages[stage]
    if not isinstance(settings, dict):
        raise ConfigError(f"cdk.json context '{STAGES_KEY}.{stage}' must be an object")
    try:
        return StageConfig.model_validate({**settings, "name": stage})
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in (STAGES_KEY, stage, *error["loc"]))
            problems.append(f"'{where}': {error['msg']}")
        raise ConfigError("bad cdk.json context " + "; ".join(problems)) from exc
