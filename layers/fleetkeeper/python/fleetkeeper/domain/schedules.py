"""A scheduled window as a request states it: `schedule`, `duration` and `timezone`, validated once.

Disruption budgets (domain/disruption.py) and capacity schedules (domain/capacity.py) both apply in
such windows; both inherit this model, so a cron, a duration or a zone is accepted or refused alike
wherever it is written, and the windows are those of domain/windows.py.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from functools import lru_cache
from zoneinfo import ZoneInfo

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from fleetkeeper.domain.durations import DURATION_PATTERN, parse_duration
from fleetkeeper.domain.windows import CronWindow, Window, check_duration, check_schedule, zone_of


class ScheduledWindow(BaseModel):
    """Windows `duration` long from each start of `schedule` in `timezone`; without a schedule, always."""

    # domain/models.Record's rules; models.Pool holds these, so this module cannot import it.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)

    schedule: str | None = Field(
        default=None,
        max_length=200,
        description="a five-field cron expression (minute hour day month weekday) when windows start",
        examples=["0 9 * * mon-fri"],
    )
    # Checked even when left out, so that a schedule without a duration names the missing field.
    duration: str | None = Field(
        default=None,
        max_length=32,
        validate_default=True,
        description="how long each window lasts: 8h, 90m, 1h30m, 1d (1m to 366d); required with a schedule",
        json_schema_extra={"pattern": DURATION_PATTERN},
    )
    timezone: str | None = Field(
        default=None, max_length=64, description="the IANA time zone of the schedule; UTC by default"
    )

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str | None) -> str | None:
        return None if value is None else check_schedule(value)

    @field_validator("duration")
    @classmethod
    def _window(cls, value: str | None, info: ValidationInfo) -> str | None:
        # A schedule that failed its own check is absent from info.data: nothing to pair with then.
        if "schedule" in info.data and (info.data["schedule"] is None) != (value is None):
            if value is None:
                raise ValueError("required with a schedule: how long each window lasts, e.g. 8h")
            raise ValueError("only applies to a schedule")
        if value is None:
            return None
        check_duration(value)
        return value.strip()

    @field_validator("timezone")
    @classmethod
    def _zone(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        zone_of(value)
        if info.data.get("schedule", "") is None:
            raise ValueError("only applies to a schedule")
        return value

    @property
    def window_length(self) -> timedelta | None:
        return parse_duration(self.duration) if self.duration else None

    @property
    def zone(self) -> ZoneInfo:
        return zone_of(self.timezone or "UTC")

    @property
    def windows(self) -> CronWindow | None:
        """Its cron windows; None without a schedule (it always applies)."""
        if self.schedule is None or self.duration is None:
            return None
        return _cron_window(self.schedule, self.duration, self.timezone or "UTC")

    def window_at(self, at: datetime) -> Window:
        """The window at `at` (domain/windows.py); without a schedule it always applies."""
        windows = self.windows
        return Window(active=True) if windows is None else windows.window_at(at)


@lru_cache(maxsize=1024)
def _cron_window(schedule: str, duration: str, timezone: str) -> CronWindow:
    # Made once per window's fields: a pool's view and `blocked_until` ask each budget dozens of times.
    return CronWindow(schedule, check_duration(duration), timezone)
