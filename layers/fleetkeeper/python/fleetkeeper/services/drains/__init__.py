"""Worker and pool drains: what operators ask for, and the steps the drain workflow runs.

A drain is one Step Functions execution (infra/statemachines/drain.asl.json). The worker (or pool) item
is the source of truth; the workflow only sequences the steps and owns the deadline:

    begin → await-empty (callback token, timeout = time left) → [force on timeout] → finish

Whoever ends the last active instance sends the stored token at once. A cancel fails it with
DrainCancelled; a moved (or forced) deadline answers it with a re-arm, and the workflow waits again for
the new deadline. Every step re-reads the item and is safe to run twice, because Step Functions retries.

Modules: `contract` (the types that mirror the ASL), `commands` (start, plan, cancel, close, status,
move the deadline, force now), `steps` (the Task states), `signals` (ending a wait), `sweep` (the
reconcile cycle's budgeted sweep of open drains), `pools` (pool drains), `watchdog` (drains whose
execution is gone). Callers use the names re-exported here.
"""

from __future__ import annotations

from fleetkeeper.services.drains.commands import (
    cancel_worker_drain,
    close_drain,
    force_worker_drain,
    launch_worker_drain,
    move_worker_drain_deadline,
    open_drain,
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
from fleetkeeper.services.drains.signals import signal_if_drained
from fleetkeeper.services.drains.steps import (
    await_empty,
    begin,
    finish,
    force,
    recheck,
    record_error,
    run_step,
)
from fleetkeeper.services.drains.sweep import SWEEP_COUNTS, run_watchdog, sweep_waiting_drains
from fleetkeeper.services.drains.watchdog import MAX_RESTARTS

__all__ = [
    "MAX_RESTARTS",
    "SWEEP_COUNTS",
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
    "force_worker_drain",
    "launch_pool_drain",
    "launch_worker_drain",
    "move_worker_drain_deadline",
    "open_drain",
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
