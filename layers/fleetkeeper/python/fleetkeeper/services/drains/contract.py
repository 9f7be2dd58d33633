"""The workflow contract: the types that mirror infra/statemachines/drain.asl.json, and execution names."""

from __future__ import annotations

import hashlib
import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from fleetkeeper.domain.drain_policy import (
    deadline_passed,
    drain_deadline,
    drain_heartbeat,
    recheck_heartbeat,
    seconds_left,
)
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import (
    DrainRecord,
    DrainThen,
    Pool,
    utcnow,
)
from fleetkeeper.services.context import Context
from fleetkeeper.services.disruption import BudgetExceeded

WORKFLOW_ACTOR = "drain-workflow"
_EXECUTION_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# Step Functions execution names are at most 80 characters.
_EXECUTION_NAME_LIMIT = 80
# A callback task's timeout must exceed its heartbeat, and both must be at least a second.
_MINIMUM_WAIT_SECONDS = 2


class DrainStatus(BaseModel):
    """What a worker's latest drain is doing (seed 002's status endpoint)."""

    model_config = ConfigDict(extra="forbid")

    worker_id: str
    status: Literal["NOT_RUN", "RUNNING", "SUCCESS", "ERROR", "CANCELLED", "TIMED_OUT"]
    worker_status: WorkerStatus
    generation: int | None = None
    started_at: datetime | None = None
    deadline: datetime | None = None
    timeout_seconds: int | None = None
    reason: str | None = None
    requested_by: str | None = None
    then: DrainThen | None = None
    active_instances: int
    forced_instances: int = 0
    # Rescheduling (docs/drains.md): whether this drain moves SCHEDULED instances, how many it moved
    # (a dry run: would move now), and how many it leaves to wait for (a dry run: would leave).
    reschedule: bool | None = None
    moved_instances: int = 0
    left_instances: int | None = None
    estimated_completion: datetime | None = None
    execution_arn: str | None = None
    # When Finish began (before-stop operations, then the stop): from then on a cancel is refused.
    finishing_at: datetime | None = None
    finished_at: datetime | None = None
    cancelled_by: str | None = None
    error: str | None = None
    # Moving the deadline, forcing (docs/drains.md): how often the deadline moved, and who forced the
    # drain, when and why.
    deadline_moves: int = 0
    forced_at: datetime | None = None
    forced_by: str | None = None
    force_reason: str | None = None
    dry_run: bool = False
    may_start: bool | None = None
    refusal: str | None = None
    # An operator's drain is never refused for a budget; its answer says which one it goes beyond.
    budget_exceeded: BudgetExceeded | None = None


class DrainInput(BaseModel):
    """The input of one drain execution, as the workflow passes it to every step."""

    model_config = ConfigDict(extra="ignore")

    kind: Literal["worker", "pool"]
    worker_id: str | None = None
    pool: str | None = None
    generation: int
    timeout_seconds: int
    started_at: datetime
    deadline: datetime
    reason: str | None = None
    requested_by: str
    then: str
    heartbeat_seconds: int
    # 0 for the execution the request started; n for the watchdog's n-th replacement. A step of any
    # other execution finds the drain "no longer its own" and ends (DrainCancelled).
    restart: int = 0
    reschedule: bool = True

    @model_validator(mode="after")
    def _names_its_target(self) -> DrainInput:
        if (self.kind == "worker" and not self.worker_id) or (self.kind == "pool" and not self.pool):
            raise ValueError(
                f"a {self.kind} drain needs its {'worker_id' if self.kind == 'worker' else 'pool'}"
            )
        return self

    def record(self, **overrides: Any) -> DrainRecord:
        """The drain record this execution stands for, as the request wrote it."""
        fields: dict[str, Any] = {
            "generation": self.generation,
            "started_at": self.started_at,
            "deadline": self.deadline,
            "timeout_seconds": self.timeout_seconds,
            "reason": self.reason,
            "requested_by": self.requested_by,
            "then": DrainThen(self.then),
            "reschedule": self.reschedule,
        }
        return DrainRecord(**{**fields, **overrides})

    @property
    def target(self) -> str:
        """The worker id or pool name this drain serves."""
        return self.worker_id or self.pool or ""

    @property
    def execution_name(self) -> str:
        kind = "drain" if self.kind == "worker" else "pool"
        return execution_name(kind, self.target, self.generation, self.restart)

    @classmethod
    def of_worker(cls, ctx: Context, worker_id: str, record: DrainRecord) -> DrainInput:
        """The input of the execution that serves this worker drain record (restarts included)."""
        return cls(
            kind="worker",
            worker_id=worker_id,
            generation=record.generation,
            timeout_seconds=record.timeout_seconds,
            started_at=record.started_at,
            deadline=record.deadline,
            reason=record.reason,
            requested_by=record.requested_by,
            then=record.then.value,
            heartbeat_seconds=ctx.settings.drain_heartbeat_seconds,
            restart=record.restarts,
            reschedule=record.reschedule,
        )

    @classmethod
    def of_pool(cls, ctx: Context, pool: Pool) -> DrainInput:
        """The input of the execution that serves the pool's current drain (restarts included)."""
        if pool.drain_started_at is None or pool.drain_timeout_seconds is None or pool.drain_then is None:
            raise ValueError(f"pool {pool.name} has no drain to serve")
        return cls(
            kind="pool",
            pool=pool.name,
            generation=pool.drain_generation,
            timeout_seconds=pool.drain_timeout_seconds,
            started_at=pool.drain_started_at,
            deadline=drain_deadline(pool.drain_started_at, pool.drain_timeout_seconds),
            requested_by=pool.drain_requested_by or "unknown",
            then=pool.drain_then.value,
            heartbeat_seconds=ctx.settings.drain_heartbeat_seconds,
            restart=pool.drain_restarts,
        )


def execution_name(kind: str, key: str, generation: int, restart: int = 0) -> str:
    """Deterministic per (worker or pool, generation, restart): a repeated request can never start two
    drains, and a watchdog restart of the same generation gets its own name (suffix -r<n>)."""
    suffix = f"-g{generation}" + (f"-r{restart}" if restart else "")
    name = f"{kind}-{_EXECUTION_NAME_UNSAFE.sub('_', key)}{suffix}"
    if len(name) <= _EXECUTION_NAME_LIMIT:
        return name
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{kind}-{digest}{suffix}"


def wait_plan(deadline: datetime, heartbeat_seconds: int, now: datetime | None = None) -> dict[str, Any]:
    """Timeout and heartbeat for the await-empty callback task, and the deadline they were armed for.

    The heartbeat is stretched for long drains so that their re-checks cannot exhaust the execution's
    history (see domain/drain_policy.recheck_heartbeat). The deadline goes back to await-empty, which
    refuses to wait on a plan whose deadline has moved since (DrainDeadlineMoved).
    """
    now = now or utcnow()
    left = max(seconds_left(deadline, now), _MINIMUM_WAIT_SECONDS)
    heartbeat = max(1, min(heartbeat_seconds, left - 1))
    return {
        "seconds_left": left,
        "heartbeat_seconds": heartbeat,
        "expired": deadline_passed(deadline, now),
        "deadline": deadline.isoformat(),
    }


def worker_wait_plan(ctx: Context, record: DrainRecord, now: datetime | None = None) -> dict[str, Any]:
    """The wait plan of a worker drain, with its heartbeat kept within its re-check budget."""
    return wait_plan(record.deadline, drain_heartbeat(ctx.settings.drain_heartbeat_seconds, record), now)


def pool_wait_plan(
    ctx: Context, deadline: datetime, timeout_seconds: int, now: datetime | None = None
) -> dict[str, Any]:
    """The wait plan of a pool drain (whose deadline never moves)."""
    heartbeat = recheck_heartbeat(ctx.settings.drain_heartbeat_seconds, timeout_seconds)
    return wait_plan(deadline, heartbeat, now)


# ---- the drain_tasks Lambda: one entry for every Task state of the state machine ---------------------


class StepRequest(BaseModel):
    """The Payload a Task state sends (see infra/statemachines/drain.asl.json)."""

    model_config = ConfigDict(extra="ignore")

    step: Literal[
        "begin",
        "await_empty",
        "recheck",
        "force",
        "finish",
        "record_error",
        "pool_begin",
        "pool_await_empty",
        "pool_recheck",
        "pool_finish",
    ]
    drain: DrainInput
    task_token: str | None = None
    # await_empty: the deadline its timeout was computed for (the wait plan's), to compare with the
    # drain's deadline now. Absent from executions of an older definition: not compared.
    armed_deadline: datetime | None = None
    error: dict[str, Any] | None = None
    timed_out: bool = False
