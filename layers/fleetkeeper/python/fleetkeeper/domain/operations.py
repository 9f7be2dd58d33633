"""Worker operations: commands fleetkeeper runs on a worker's machine (license registration, system
information), their catalogue, their lifecycle and their retry rules. Pure: no AWS types, no I/O.

An operation is PENDING until the reconciler sends it, RUNNING while the command runs, and ends SUCCESS,
FAILED (every attempt failed) or CANCELLED (the machine went away before it could run). A failed attempt
goes back to PENDING with a backoff until the operation's attempts are spent. docs/operations.md.
"""

from __future__ import annotations

import json
import re
import uuid
import zlib
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Final

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fleetkeeper.domain.errors import Conflict, InvalidInput
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import OPERATION_NAME_PATTERN, Record, UtcDatetime, utcnow

# Parameter names as the API and the catalogue spell them (operation names: domain/models.py).
PARAMETER_NAME_PATTERN: Final = r"^[A-Za-z][A-Za-z0-9_]{0,63}$"
# SSM accepts document names of letters, digits, '_', '-', '.' (3-128).
DOCUMENT_NAME_PATTERN: Final = r"^[A-Za-z0-9_.-]{3,128}$"
MAX_PARAMETER_VALUE: Final = 1024
MAX_PARAMETERS: Final = 20
# How much of a command's output an operation keeps: enough to read an error, never a log file.
OUTPUT_EXCERPT_CHARS: Final = 2000
# system_info larger than this (as JSON) is not stored: a worker item must stay far below 400 KB.
MAX_SYSTEM_INFO_BYTES: Final = 16 * 1024

SYSTEM_INFO_OPERATION: Final = "collect-system-info"


class OperationStatus(StrEnum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


FINISHED: Final = frozenset({OperationStatus.SUCCESS, OperationStatus.FAILED, OperationStatus.CANCELLED})


class OperationOrigin(StrEnum):
    """Who asked for the operation: an operator, a drain before stopping, or the system-info schedule."""

    REQUEST = "request"
    BEFORE_STOP = "before_stop"
    SCHEDULE = "schedule"


class ParameterSpec(BaseModel):
    """One parameter an operation accepts. Values are strings (as SSM takes them), checked by pattern.

    A secret never is a parameter: a parameter may name where the secret lives (an SSM Parameter Store
    SecureString), and the document reads it on the machine.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    pattern: str = Field(default=r"^[A-Za-z0-9_./:@-]{1,256}$", min_length=1)
    required: bool = False
    default: str | None = Field(default=None, max_length=MAX_PARAMETER_VALUE)
    description: str = ""

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from exc
        return value


class OperationSpec(BaseModel):
    """A catalogue entry: the SSM document that performs the operation and what it accepts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    document: str = Field(pattern=DOCUMENT_NAME_PATTERN)
    parameters: dict[str, ParameterSpec] = Field(default_factory=dict, max_length=MAX_PARAMETERS)
    # A cleanup operation may also run on a DRAINING worker (and so before a stop).
    cleanup: bool = False
    # How long one attempt may run once sent; past it the command is cancelled and the attempt failed.
    timeout_seconds: int = Field(default=600, ge=30, le=172800)
    max_attempts: int = Field(default=3, ge=1, le=10)

    @field_validator("parameters")
    @classmethod
    def _parameter_names(cls, value: dict[str, ParameterSpec]) -> dict[str, ParameterSpec]:
        for name in value:
            if not re.match(PARAMETER_NAME_PATTERN, name):
                raise ValueError(f"parameter name '{name}' must match {PARAMETER_NAME_PATTERN}")
        return value

    def runs_on(self, status: WorkerStatus) -> bool:
        return status == WorkerStatus.RUNNING or (self.cleanup and status == WorkerStatus.DRAINING)

    @property
    def allowed_statuses(self) -> tuple[WorkerStatus, ...]:
        if self.cleanup:
            return (WorkerStatus.RUNNING, WorkerStatus.DRAINING)
        return (WorkerStatus.RUNNING,)


class Catalogue(BaseModel):
    """The operations a stage offers, by name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    operations: dict[str, OperationSpec] = Field(default_factory=dict)

    @field_validator("operations")
    @classmethod
    def _operation_names(cls, value: dict[str, OperationSpec]) -> dict[str, OperationSpec]:
        for name in value:
            if not re.match(OPERATION_NAME_PATTERN, name):
                raise ValueError(f"operation name '{name}' must match {OPERATION_NAME_PATTERN}")
        return value

    def spec(self, name: str, *, field: str = "name") -> OperationSpec:
        spec = self.operations.get(name)
        if spec is None:
            known = ", ".join(sorted(self.operations)) or "none"
            raise InvalidInput(field, f"unknown operation '{name}'; this stage offers: {known}")
        return spec

    def collects_system_info(self, interval_seconds: int) -> bool:
        """Whether every RUNNING worker runs collect-system-info, once per interval."""
        return interval_seconds > 0 and SYSTEM_INFO_OPERATION in self.operations

    def used_by(self, before_stop: Sequence[str], system_info_interval_seconds: int) -> bool:
        """Whether a worker whose template runs `before_stop` relies on Run Command, so that its SSM
        agent must answer: it runs operations before it stops, or collects its system information."""
        return bool(self.operations) and (
            bool(before_stop) or self.collects_system_info(system_info_interval_seconds)
        )

    def parameters_for(self, name: str, given: Mapping[str, str]) -> dict[str, str]:
        """The parameters an operation runs with: the given ones checked, defaults filled in.

        Every mistake names its field: `parameters.<key>` for an unknown, missing or malformed value.
        """
        spec = self.spec(name)
        for key in sorted(given):
            if key not in spec.parameters:
                accepted = ", ".join(sorted(spec.parameters)) or "none"
                raise InvalidInput(
                    f"parameters.{key}", f"'{name}' accepts no such parameter (accepted: {accepted})"
                )
        resolved: dict[str, str] = {}
        for key, parameter in sorted(spec.parameters.items()):
            value = given.get(key, parameter.default)
            if value is None:
                if parameter.required:
                    raise InvalidInput(f"parameters.{key}", f"'{name}' requires it")
                continue
            if len(value) > MAX_PARAMETER_VALUE or not re.fullmatch(parameter.pattern, value):
                raise InvalidInput(f"parameters.{key}", f"must match {parameter.pattern}")
            resolved[key] = value
        return resolved

    def check_before_stop(self, names: list[str], *, field: str = "before_stop") -> None:
        """Names a template may run before its workers stop: cleanup operations that need no parameter."""
        for index, name in enumerate(names):
            where = f"{field}.{index}"
            spec = self.spec(name, field=where)
            if not spec.cleanup:
                raise InvalidInput(where, f"'{name}' is not a cleanup operation; only those run on DRAINING")
            missing = [k for k, p in spec.parameters.items() if p.required and p.default is None]
            if missing:
                raise InvalidInput(where, f"'{name}' requires parameters ({', '.join(missing)})")


class OperationInFlight(Conflict):
    """The worker already has an operation that is not finished: one at a time per worker."""

    code = "OPERATION_IN_FLIGHT"

    def __init__(self, worker_id: str, status: str | None, operation_id: str | None) -> None:
        super().__init__(
            "worker",
            worker_id,
            status,
            f"worker {worker_id} already runs operation {operation_id}; wait for it to finish",
        )
        self.operation_id = operation_id

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "operation_id": self.operation_id}


def new_operation_id(now: datetime) -> str:
    """Ids sort by creation time, so a worker's operations list newest first by key alone."""
    return f"{operation_id_floor(now)}-{uuid.uuid4().hex[:8]}"


def operation_id_floor(moment: datetime) -> str:
    """The smallest id of an operation created at or after `moment` (UTC): a key range starts there."""
    return f"op-{moment.astimezone(UTC).strftime('%Y%m%d%H%M%S%f')}"


class Operation(Record):
    id: str
    worker_id: str
    name: str = Field(pattern=OPERATION_NAME_PATTERN)
    document: str
    parameters: dict[str, str] = Field(default_factory=dict)
    status: OperationStatus = OperationStatus.PENDING
    origin: OperationOrigin = OperationOrigin.REQUEST
    requested_by: str
    # For before-stop operations: the drain they serve.
    drain_generation: int | None = None
    attempts: int = Field(default=0, ge=0)
    max_attempts: int = Field(default=3, ge=1)
    timeout_seconds: int = Field(default=600, gt=0)
    # The attempt in progress: when it was claimed, and the SSM command once sent.
    attempt_started_at: UtcDatetime | None = None
    command_id: str | None = None
    # The machine the command went to (not `ec2_instance_id`: that attribute feeds the worker index).
    target_instance_id: str | None = None
    next_attempt_at: UtcDatetime | None = None
    output: str | None = Field(default=None, max_length=OUTPUT_EXCERPT_CHARS)
    error: str | None = Field(default=None, max_length=500)
    created_at: UtcDatetime = Field(default_factory=utcnow)
    updated_at: UtcDatetime = Field(default_factory=utcnow)
    finished_at: UtcDatetime | None = None
    version: int = Field(default=0, ge=0)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def due(self, now: datetime) -> bool:
        return self.status == OperationStatus.PENDING and (
            self.next_attempt_at is None or self.next_attempt_at <= now
        )

    def attempt_expired(self, now: datetime) -> bool:
        started = self.attempt_started_at
        return started is not None and now >= started + timedelta(seconds=self.timeout_seconds)


# ---- rules ------------------------------------------------------------------------------------------

# A claim older than this with no command id: the claimer died before (or while) sending.
CLAIM_GRACE_SECONDS: Final = 60
MAX_BACKOFF_SECONDS: Final = 900


def backoff(attempts: int, base_seconds: float) -> timedelta:
    """Wait before the next attempt after `attempts` failed ones: base, 2x base, 4x base... capped."""
    return timedelta(seconds=min(base_seconds * 2 ** max(attempts - 1, 0), MAX_BACKOFF_SECONDS))


def after_failed_attempt(op: Operation, reason: str, now: datetime, base_seconds: float) -> dict[str, Any]:
    """The changes that record a failed attempt: PENDING again after a backoff, or FAILED when spent."""
    common: dict[str, Any] = {"error": reason[:500], "command_id": None, "attempt_started_at": None}
    if op.attempts >= op.max_attempts:
        return {**common, "status": OperationStatus.FAILED, "finished_at": now, "next_attempt_at": None}
    return {
        **common,
        "status": OperationStatus.PENDING,
        "next_attempt_at": now + backoff(op.attempts, base_seconds),
    }


def excerpt(stdout: str | None, stderr: str | None = None) -> str | None:
    """The end of a command's output (where results and errors are), stderr after stdout."""
    out = (stdout or "").strip()
    err = (stderr or "").strip()
    text = f"{out}\n--- stderr ---\n{err}" if out and err else out or err
    if not text:
        return None
    if len(text) <= OUTPUT_EXCERPT_CHARS:
        return text
    return "…" + text[-(OUTPUT_EXCERPT_CHARS - 1) :]


def parse_system_info(stdout: str | None) -> dict[str, Any]:
    """The JSON object a collect-system-info command prints; ValueError naming what is wrong otherwise."""
    if not stdout or not stdout.strip():
        raise ValueError("the command printed nothing")
    try:
        value = json.loads(stdout)
    except json.JSONDecodeError as exc:
        raise ValueError(f"the output is not JSON: {exc.msg} at {exc.pos}") from exc
    if not isinstance(value, dict):
        raise ValueError("the output is not a JSON object")
    if len(json.dumps(value)) > MAX_SYSTEM_INFO_BYTES:
        raise ValueError(f"the output is larger than {MAX_SYSTEM_INFO_BYTES} bytes")
    return value


def system_info_due(
    worker_id: str, last_collected: datetime | None, now: datetime, interval_seconds: int, cycle_seconds: int
) -> bool:
    """Whether this cycle asks the worker for its system information: once per interval at most, each
    worker in its own slot so a fleet's requests are spread over the interval, not sent all at once."""
    if interval_seconds <= 0:
        return False
    if last_collected is not None and now - last_collected < timedelta(seconds=interval_seconds / 2):
        return False
    buckets = max(1, -(-interval_seconds // max(cycle_seconds, 1)))
    slot = int(now.timestamp() // max(cycle_seconds, 1)) % buckets
    return zlib.crc32(worker_id.encode()) % buckets == slot
