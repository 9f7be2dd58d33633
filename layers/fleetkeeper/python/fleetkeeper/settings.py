"""Runtime settings: read from the environment once, validated, with errors naming the variable."""

from __future__ import annotations

import json
import os
from enum import StrEnum
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from fleetkeeper.domain.operations import Catalogue
from fleetkeeper.domain.sharding import MAX_SHARDS


class SettingsError(RuntimeError):
    """A required environment variable is missing or has a bad value."""


class GcMode(StrEnum):
    """What discovery does with orphans it verified: act on them, or only report them (a dry run)."""

    TERMINATE = "terminate"
    REPORT_ONLY = "report-only"


class RegionConfig(BaseModel):
    """Where and how workers are launched in one region (seed 003, ADR-018)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    subnet_id: str | None = None
    security_group_ids: tuple[str, ...] = ()
    key_name: str | None = None
    default_tags: dict[str, str] = Field(default_factory=dict)


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME", min_length=3)
    default_region: str = Field(default="us-east-1", alias="AWS_REGION")
    service_name: str = Field(default="fleetkeeper", alias="POWERTOOLS_SERVICE_NAME")
    drain_state_machine_arn: str | None = Field(default=None, alias="DRAIN_STATE_MACHINE_ARN")
    audit_bus_name: str = Field(default="default", alias="AUDIT_BUS_NAME")
    notification_topic_arn: str | None = Field(default=None, alias="NOTIFICATION_TOPIC_ARN")
    drain_heartbeat_seconds: int = Field(default=300, gt=0, alias="DRAIN_HEARTBEAT_SECONDS")
    # The reconciler's watchdog describes an open drain's execution at most this often (0: every cycle).
    drain_watchdog_interval_seconds: int = Field(default=300, ge=0, alias="DRAIN_WATCHDOG_INTERVAL_SECONDS")
    idempotency_ttl_seconds: int = Field(default=3600, gt=0, alias="IDEMPOTENCY_TTL_SECONDS")
    # 0 keeps the audit trail forever.
    audit_retention_days: int = Field(default=365, ge=0, alias="AUDIT_RETENTION_DAYS")
    # Days a finished worker operation (and its audit items) is kept; 0 keeps them forever.
    operation_retention_days: int = Field(default=30, ge=0, alias="OPERATION_RETENTION_DAYS")

    # The IAM roles and users that may call the internal routes (cdk.json api.tooling_principals); the
    # API's resource policy denies those routes to everyone else, and the route checks it again.
    tooling_principals: tuple[str, ...] = Field(default=(), alias="TOOLING_PRINCIPALS")
    # The IAM roles that workers' agents report their health with (cdk.json api.worker_agent_principals);
    # the health route answers them and the tooling principals only.
    worker_agent_principals: tuple[str, ...] = Field(default=(), alias="WORKER_AGENT_PRINCIPALS")

    # ---- reconciler, discovery and scale-down (docs/operations.md) ----------------------------
    region_configs: dict[str, RegionConfig] = Field(default_factory=dict, alias="REGION_CONFIGS")
    gc_mode: GcMode = Field(default=GcMode.TERMINATE, alias="GC_MODE")
    discovery_ami_pattern: str | None = Field(default=None, alias="DISCOVERY_AMI_PATTERN")
    ami_owners: tuple[str, ...] = Field(default=("self",), alias="AMI_OWNERS")
    # The instance types the stage may launch (cdk.json instance_types; the RunInstances grant allows
    # no other). Empty: no bound, for a local stack that names none.
    instance_types: tuple[str, ...] = Field(default=(), alias="INSTANCE_TYPES")
    # The instance profile workers launch with (the stack creates it, or the stage names its own): the
    # SSM agent registers with Systems Manager through it, so Run Command can reach the machine.
    worker_instance_profile: str | None = Field(default=None, alias="WORKER_INSTANCE_PROFILE")
    ec2_provisioning_timeout_seconds: int = Field(default=900, gt=0, alias="EC2_PROVISIONING_TIMEOUT_SECONDS")
    metrics_interval_seconds: int = Field(default=300, ge=0, alias="METRICS_INTERVAL_SECONDS")
    # How many reconcile shards the stage schedules: a cycle told another split refuses to run, as it
    # would overlap the configured shards (docs/operations.md, "Sharding the reconciler").
    reconcile_shards: int = Field(default=1, ge=1, le=MAX_SHARDS, alias="RECONCILE_SHARDS")
    scale_down_enabled: bool = Field(default=False, alias="SCALE_DOWN_ENABLED")
    min_workers: int = Field(default=0, ge=0, alias="MIN_WORKERS")
    scale_down_cooldown_seconds: int = Field(default=600, ge=0, alias="SCALE_DOWN_COOLDOWN_SECONDS")
    idle_window_seconds: int = Field(default=1800, gt=0, alias="IDLE_WINDOW_SECONDS")
    idle_cpu_threshold: float = Field(default=5.0, ge=0, le=100, alias="IDLE_CPU_THRESHOLD")
    scale_down_lookahead_seconds: int = Field(default=900, ge=0, alias="SCALE_DOWN_LOOKAHEAD_SECONDS")
    # A managed machine younger than this is not imported: it may be a launch still in flight.
    import_grace_seconds: int = Field(default=30, ge=0, alias="IMPORT_GRACE_SECONDS")
    # Orphan GC's circuit breaker: more than this share (percent) of a region's live workers orphaned in
    # one pass retires none of them; 100 turns the breaker off.
    orphan_gc_max_share_percent: float = Field(
        default=20.0, ge=0, le=100, alias="ORPHAN_GC_MAX_SHARE_PERCENT"
    )
    # How long an operator's confirmation of a held-back set stays usable (it is spent by one pass).
    orphan_gc_confirmation_ttl_seconds: int = Field(
        default=3600, gt=0, alias="ORPHAN_GC_CONFIRMATION_TTL_SECONDS"
    )
    # Orphans one discovery pass retires at most; the rest wait for the next pass (counted as
    # `orphans_deferred`), so a mass disappearance is worked off in passes that fit the function's time.
    orphan_gc_max_retire_per_run: int = Field(default=1000, ge=1, alias="ORPHAN_GC_MAX_RETIRE_PER_RUN")
    # EC2 rebalance recommendations start a drain only when enabled (they are frequent; see docs).
    rebalance_drain_enabled: bool = Field(default=False, alias="REBALANCE_DRAIN_ENABLED")
    rebalance_drain_timeout_seconds: int = Field(
        default=1800, ge=60, le=86400, alias="REBALANCE_DRAIN_TIMEOUT_SECONDS"
    )
    # ---- worker operations through SSM Run Command (docs/operations.md) ----------------------
    operations_catalogue: Catalogue = Field(default_factory=Catalogue, alias="OPERATIONS_CATALOGUE")
    # First retry of a failed operation attempt after this long, doubling per attempt (capped).
    operation_retry_base_seconds: float = Field(default=30.0, ge=0, alias="OPERATION_RETRY_BASE_SECONDS")
    # How often each RUNNING worker runs collect-system-info; 0 turns it off.
    system_info_interval_seconds: int = Field(default=3600, ge=0, alias="SYSTEM_INFO_INTERVAL_SECONDS")
    # How long a drain's finish step waits for the template's before_stop operations before stopping.
    before_stop_timeout_seconds: int = Field(default=120, ge=1, le=600, alias="BEFORE_STOP_TIMEOUT_SECONDS")
    max_concurrent_drains: str = Field(
        default="10%", pattern=r"^\s*\d+(\.\d+)?\s*%?\s*$", alias="MAX_CONCURRENT_DRAINS"
    )

    @field_validator("region_configs", mode="before")
    @classmethod
    def _region_configs_from_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else {}
        return value

    @field_validator("operations_catalogue", mode="before")
    @classmethod
    def _catalogue_from_json(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"operations": json.loads(value)} if value.strip() else {}
        return value

    @field_validator(
        "ami_owners", "instance_types", "tooling_principals", "worker_agent_principals", mode="before"
    )
    @classmethod
    def _list_from_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @property
    def regions(self) -> list[str]:
        """The regions fleetkeeper manages: the configured ones, else the Lambda's own."""
        return sorted(self.region_configs) or [self.default_region]

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> Settings:
        source = dict(os.environ if environ is None else environ)
        try:
            return cls.model_validate(source)
        except ValidationError as exc:
            problems = []
            for error in exc.errors():
                variable = str(error["loc"][0]) if error["loc"] else "environment"
                problems.append(f"{variable}: {error['msg']}")
            raise SettingsError("bad fleetkeeper settings: " + "; ".join(problems)) from exc


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read on first use (not at import, so tests can set the env first)."""
    return Settings.from_environ()
