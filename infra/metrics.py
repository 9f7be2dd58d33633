"""The custom metrics the dashboard and alarms read: the one list to align with the handlers.

The functions emit them as CloudWatch EMF through Powertools Metrics, in namespace `fleetkeeper` with
the Powertools default dimension `service=fleetkeeper`. docs/operations.md documents the same list.
"""

from __future__ import annotations

from typing import Final

from fleetkeeper.domain.lifecycle import WorkerStatus

NAMESPACE: Final = "fleetkeeper"
SERVICE: Final = "fleetkeeper"
DIMENSIONS: Final = {"service": SERVICE}

DRAIN_STARTED: Final = "DrainStarted"
DRAIN_COMPLETED: Final = "DrainCompleted"
DRAIN_TIMED_OUT: Final = "DrainTimedOut"
DRAIN_CANCELLED: Final = "DrainCancelled"
DRAIN_FAILED: Final = "DrainFailed"
DRAIN_DURATION_SECONDS: Final = "DrainDurationSeconds"
INSTANCE_FORCE_TERMINATED: Final = "InstanceForceTerminated"
# 1 per open drain whose execution the watchdog found missing, failed, timed out or aborted.
DRAIN_EXECUTION_LOST: Final = "DrainExecutionLost"
ORPHANS_TERMINATED: Final = "OrphansTerminated"
# Per discovery run: how many orphans the GC circuit breaker held back (0 when it did not trip).
ORPHAN_GC_HELD_BACK: Final = "OrphanGcHeldBack"
# Per reconcile cycle: the pools whose repair brake held a repair (docs/repair.md).
REPAIR_BLOCKED: Final = "RepairBlocked"
# 1 per launch EC2 refused for capacity, quota or rate, which blocks its pool's scale-out (docs/capacity.md).
CAPACITY_BLOCKED: Final = "CapacityBlocked"
# Per reconcile cycle and pool (with a `pool` dimension): the target, free slots and warm workers. Not
# fleet metrics: the dashboard's fleet graphs (ALL_METRICS) leave them out; read them per pool.
CAPACITY_TARGET: Final = "CapacityTarget"
CAPACITY_FREE_SLOTS: Final = "CapacityFreeSlots"
CAPACITY_WARM: Final = "CapacityWarm"
CAPACITY_GAUGES: Final = (CAPACITY_TARGET, CAPACITY_FREE_SLOTS, CAPACITY_WARM)
# Per reconcile cycle and pool (`pool` dimension): bookings waiting for capacity, and those at risk
# (due, unplaced, less than the lead time left); 1 per booking failed for want of capacity.
BOOKINGS_WAITING: Final = "BookingsWaiting"
BOOKINGS_AT_RISK: Final = "BookingsAtRisk"
BOOKINGS_FAILED: Final = "BookingsFailed"
BOOKING_GAUGES: Final = (BOOKINGS_WAITING, BOOKINGS_AT_RISK)
# The cycle's count of bookings at risk over every pool it owns: the fleet metric the alarm watches.
BOOKINGS_AT_RISK_COUNTER: Final = "Reconcile.bookings_at_risk"
RECONCILE_DURATION_MS: Final = "ReconcileDurationMs"
RECONCILE_ERRORS: Final = "ReconcileErrors"
# 1 per successful reconcile run: its absence is what the "reconcile not running" alarm watches.
RECONCILE_HEARTBEAT: Final = "ReconcileHeartbeat"

# Worker operations: per operation (with an `operation` dimension too), and before-stop failures.
OPERATION_SUCCEEDED: Final = "OperationSucceeded"
OPERATION_FAILED: Final = "OperationFailed"
OPERATION_RETRIED: Final = "OperationRetried"
BEFORE_STOP_OPERATION_FAILED: Final = "BeforeStopOperationFailed"

# Rollouts: 1 per rollout started, per checkpoint reached, and per rollout ended (docs/rollouts.md).
ROLLOUT_STARTED: Final = "RolloutStarted"
ROLLOUT_CHECKPOINT_REACHED: Final = "RolloutCheckpointReached"
ROLLOUT_SUCCEEDED: Final = "RolloutSucceeded"
ROLLOUT_FAILED: Final = "RolloutFailed"
ROLLOUT_CANCELLED: Final = "RolloutCancelled"
ROLLOUT_WAVE_STARTED: Final = "RolloutWaveStarted"
ROLLOUT_ROLLBACK_STARTED: Final = "RolloutRollbackStarted"
ROLLOUT_ROLLED_BACK: Final = "RolloutRolledBack"
ROLLOUT_EVENTS: Final = (
    ROLLOUT_STARTED,
    ROLLOUT_WAVE_STARTED,
    ROLLOUT_CHECKPOINT_REACHED,
    ROLLOUT_SUCCEEDED,
    ROLLOUT_FAILED,
    ROLLOUT_CANCELLED,
    ROLLOUT_ROLLBACK_STARTED,
    ROLLOUT_ROLLED_BACK,
)
# The rollout engine's counters, published by the reconciler as Reconcile.<counter>.
ROLLOUT_STEPS: Final = "Reconcile.rollout_steps"
ROLLOUT_STEP_CONFLICTS: Final = "Reconcile.rollout_step_conflicts"
ROLLOUT_ERRORS: Final = "Reconcile.rollout_errors"
ROLLOUT_ENGINE_COUNTERS: Final = (ROLLOUT_STEPS, ROLLOUT_STEP_CONFLICTS, ROLLOUT_ERRORS)

DRAIN_OUTCOMES: Final = (DRAIN_STARTED, DRAIN_COMPLETED, DRAIN_TIMED_OUT, DRAIN_CANCELLED, DRAIN_FAILED)

# TERMINATED is history that only grows; the reconciler never counts it.
REPORTED_STATUSES: Final = tuple(status for status in WorkerStatus if status is not WorkerStatus.TERMINATED)


def workers_metric(status: WorkerStatus) -> str:
    """The gauge of workers in one status, e.g. WorkersRunning for RUNNING."""
    return "Workers" + status.value.capitalize()


ALL_METRICS: Final = (
    *(workers_metric(status) for status in REPORTED_STATUSES),
    *DRAIN_OUTCOMES,
    DRAIN_DURATION_SECONDS,
    INSTANCE_FORCE_TERMINATED,
    DRAIN_EXECUTION_LOST,
    ORPHANS_TERMINATED,
    ORPHAN_GC_HELD_BACK,
    REPAIR_BLOCKED,
    CAPACITY_BLOCKED,
    RECONCILE_DURATION_MS,
    RECONCILE_ERRORS,
    RECONCILE_HEARTBEAT,
    OPERATION_SUCCEEDED,
    OPERATION_FAILED,
    OPERATION_RETRIED,
    BEFORE_STOP_OPERATION_FAILED,
    *ROLLOUT_EVENTS,
    *ROLLOUT_ENGINE_COUNTERS,
)
