"""Runtime settings: read from the environment once, validated, with errors naming the variable."""

from __future__ import annotations

import os
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class SettingsError(RuntimeError):
    """A required environment variable is missing or has a bad value."""


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME", min_length=3)
    default_region: str = Field(default="us-east-1", alias="AWS_REGION")
    service_name: str = Field(default="fleetkeeper", alias="POWERTOOLS_SERVICE_NAME")
    drain_state_machine_arn: str | None = Field(default=None, alias="DRAIN_STATE_MACHINE_ARN")
    audit_bus_name: str = Field(default="default", alias="AUDIT_BUS_NAME")
    notification_topic_arn: str | None = Field(default=None, alias="NOTIFICATION_TOPIC_ARN")
    drain_heartbeat_seconds: int = Field(default=300, gt=0, alias="DRAIN_HEARTBEAT_SECONDS")
    idempotency_ttl_seconds: int = Field(default=3600, gt=0, alias="IDEMPOTENCY_TTL_SECONDS")

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
