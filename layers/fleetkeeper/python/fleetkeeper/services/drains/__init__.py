"""Worker and pool drains: what operators ask for, and the steps the drain workflow runs.

A drain is one Step Functions execution (infra/statemachines/drain.asl.json). The worker (or pool) item
is the source of truth; the workflow only sequences the steps and owns the deadline:

    begin → await-empty (callback token, timeout = time left) → [force on timeout] → finish

Whoever ends the last active instance sends the stored token at once. A cancel fails it with
DrainCancelled. Every step re-reads the item and is safe to run twice, because Step Functions retries.

Modules: `contract` (the types that mirror the ASL), `commands` (start, plan, cancel, close, status),
`steps` (the Task states), `signals` (ending a wait, the sweep), `pools` (pool drains), `watchdog`
(drains whose execution is gone). Callers use the names re-exported here.
"""

from __future__ import annotations

from fleetkeeper.services.drains.commands import (
    cancel_worker_drain,
    close_drain,
    launch_worker_drain,
    plan_worker_drain,
    start_worker_drain,
    status_of,
    worker_drain_status,
)
from fleetkeeper.services.drains.contract import (
    WORKFLOW_ACTOR,
    DrainInput,
    DrainStatus,
    StepRequest,
    execution_name,
    wait_plan,
)
from fleetkeeper.services.drains.pools import cancel_pool_drain, launch_pool_drain, start_pool_drain
from fleetkeeper.services.drains.signals import signal_if_drained, sweep_waiting_drains
from fleetkeeper.services.drains.steps import (
    await_empty,
    begin,
    finish,
    force,
    recheck,
    record_error,
    run_step,
)
from fleetkeeper.services.drains.watchdog import MAX_RESTARTS, run_watchdog

__all__ = [
    "MAX_RESTARTS",
    "WORKFLOW_ACTOR",
    "DrainInput",
    "DrainStatus",
    "StepRequest",
    "await_empty",
    "begin",
    "cancel_pool_drain",
    "cancel_worker_drain",
    "close_drain",
    "execution_name",
    "finish",
    "force",
    "launch_pool_drain",
    "launch_worker_drain",
    "plan_worker_drain",
    "recheck",
    "record_error",
    "run_step",
    "run_watchdog",
    "signal_if_drained",
    "start_pool_drain",
    "start_worker_drain",
    "status_of",
    "sweep_waiting_drains",
    "wait_plan",
    "worker_drain_status",
]
