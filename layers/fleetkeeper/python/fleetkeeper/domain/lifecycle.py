"""Worker, instance and pool lifecycles: the single source of truth for legal moves."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from fleetkeeper.domain.errors import IllegalTransition


class WorkerStatus(StrEnum):
    PENDING = "PENDING"
    PROVISIONING = "PROVISIONING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    DRAINING = "DRAINING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    TERMINATING = "TERMINATING"
    TERMINATED = "TERMINATED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


class Cause(StrEnum):
    """Why a worker moves; some moves are only believable with EC2 as the witness."""

    # fleetkeeper's own decisions: reconciler steps, drains, admin requests.
    CONTROL = "CONTROL"
    # EC2 reported the state: drift correction, state-change events, orphan GC, resurrection.
    EC2 = "EC2"


_C = frozenset({Cause.CONTROL})
_E = frozenset({Cause.EC2})
_CE = frozenset({Cause.CONTROL, Cause.EC2})

_S = WorkerStatus

# The union of the lifecycle of seed 000 (draining, admin cancel) and seed 003 (per-status reconciler),
# plus the moves EC2 itself can force on a worker (drift, console termination, resurrection).
# Each edge names the causes that may take it. TERMINATED can only be left on EC2's evidence that the
# machine is back; FAILED and UNKNOWN always have a way out through TERMINATING.
WORKER_TRANSITIONS: Mapping[WorkerStatus, Mapping[WorkerStatus, frozenset[Cause]]] = {
    _S.PENDING: {
        _S.PROVISIONING: _C,
        _S.RUNNING: _E,  # an imported machine that EC2 already runs
        _S.FAILED: _C,
        _S.TERMINATED: _C,  # abandoned before anything was launched
    },
    _S.PROVISIONING: {
        _S.STARTING: _CE,
        _S.RUNNING: _CE,
        _S.FAILED: _C,
        _S.STOPPING: _E,
        _S.STOPPED: _E,
        _S.TERMINATING: _CE,
        _S.TERMINATED: _E,
        _S.UNKNOWN: _E,
    },
    _S.STARTING: {
        _S.RUNNING: _CE,
        _S.FAILED: _C,
        _S.PROVISIONING: _E,
        _S.STOPPING: _E,
        _S.STOPPED: _E,
        _S.TERMINATING: _CE,
        _S.TERMINATED: _E,
        _S.UNKNOWN: _E,
    },
    _S.RUNNING: {
        _S.DRAINING: _C,
        _S.STOPPING: _CE,
        _S.TERMINATING: _CE,
        _S.PROVISIONING: _E,
        _S.STOPPED: _E,
        _S.TERMINATED: _E,
        _S.UNKNOWN: _E,
    },
    _S.DRAINING: {
        _S.RUNNING: _C,  # admin cancel
        _S.STOPPING: _CE,
        _S.TERMINATING: _CE,
        _S.STOPPED: _E,
        _S.TERMINATED: _E,
        _S.UNKNOWN: _E,
    },
    _S.STOPPING: {
        _S.STOPPED: _CE,
        _S.TERMINATING: _CE,
        _S.TERMINATED: _E,
        _S.UNKNOWN: _E,
    },
    _S.STOPPED: {
        _S.STARTING: _C,
        _S.RUNNING: _E,
        _S.PROVISIONING: _E,
        _S.TERMINATING: _CE,
        _S.TERMINATED: _E,
        _S.UNKNOWN: _E,
    },
    _S.TERMINATING: {
        _S.TERMINATED: _CE,
        _S.UNKNOWN: _E,
    },
    _S.TERMINATED: {
        # resurrection: discovery found the machine alive again
        _S.PROVISIONING: _E,
        _S.RUNNING: _E,
        _S.STOPPING: _E,
        _S.STOPPED: _E,
    },
    _S.FAILED: {
        _S.TERMINATING: _C,
        _S.TERMINATED: _CE,
        _S.RUNNING: _E,
        _S.STOPPED: _E,
        _S.UNKNOWN: _E,
    },
    _S.UNKNOWN: {
        _S.TERMINATING: _C,
        _S.PROVISIONING: _E,
        _S.RUNNING: _E,
        _S.STOPPING: _E,
        _S.STOPPED: _E,
        _S.TERMINATED: _E,
    },
}

# Workers the reconciler never needs to visit: nothing is in flight for them.
SETTLED_WORKER_STATUSES = frozenset({_S.TERMINATED})

# A worker accepts new instances only in this status (seed 000's state table).
ACCEPTS_INSTANCES = _S.RUNNING


def can_transition(current: WorkerStatus, target: WorkerStatus, cause: Cause = Cause.CONTROL) -> bool:
    """Whether the table allows current -> target for this cause."""
    return cause in WORKER_TRANSITIONS.get(current, {}).get(target, frozenset())


def check_transition(current: WorkerStatus, target: WorkerStatus, cause: Cause = Cause.CONTROL) -> None:
    """Raise IllegalTransition naming both statuses unless the move is legal."""
    if not can_transition(current, target, cause):
        raise IllegalTransition("worker", str(current), str(target), cause=str(cause))


# EC2 instance state name -> the worker status it implies (seed 003's mapping table).
_EC2_STATE_TO_STATUS: Mapping[str, WorkerStatus] = {
    "pending": _S.PROVISIONING,
    "running": _S.RUNNING,
    "stopping": _S.STOPPING,
    "stopped": _S.STOPPED,
    "shutting-down": _S.TERMINATING,
    "terminated": _S.TERMINATED,
}


def worker_status_for_ec2_state(ec2_state: str | None) -> WorkerStatus:
    """Map an EC2 instance state name to a worker status; anything unrecognised is UNKNOWN."""
    if ec2_state is None:
        return _S.UNKNOWN
    return _EC2_STATE_TO_STATUS.get(ec2_state, _S.UNKNOWN)


class InstanceState(StrEnum):
    # A booking (a placement with a future timeslot) that found no room and waits for the capacity the
    # reconciler brings up: it has no worker and holds no slot (domain/bookings.py).
    WAITING_FOR_CAPACITY = "WAITING_FOR_CAPACITY"
    SCHEDULED = "SCHEDULED"
    INSTANTIATING = "INSTANTIATING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    TERMINATED = "TERMINATED"


class ForceReason(StrEnum):
    """The reason a drain's force step writes on each instance it ends: the drain's deadline passed, or
    an operator forced the drain now (the API and the CLI read these values)."""

    DEADLINE = "drain_timeout"
    OPERATOR = "forced"


_I = InstanceState

# An instance holds a slot on its worker (counts in active_instances) while in one of these states.
ACTIVE_INSTANCE_STATES = frozenset({_I.SCHEDULED, _I.INSTANTIATING, _I.RUNNING})
ENDED_INSTANCE_STATES = frozenset({_I.COMPLETED, _I.FAILED, _I.TERMINATED})

INSTANCE_TRANSITIONS: Mapping[InstanceState, frozenset[InstanceState]] = {
    # Placed once a worker has room; FAILED when none had by its timeslot; ended by its owner meanwhile.
    _I.WAITING_FOR_CAPACITY: frozenset({_I.SCHEDULED, _I.FAILED, _I.TERMINATED}),
    # INSTANTIATING -> INSTANTIATING is a retry of a failed instance on the same (draining) worker.
    _I.SCHEDULED: frozenset({_I.INSTANTIATING, _I.RUNNING, _I.COMPLETED, _I.FAILED, _I.TERMINATED}),
    _I.INSTANTIATING: frozenset({_I.INSTANTIATING, _I.RUNNING, _I.COMPLETED, _I.FAILED, _I.TERMINATED}),
    _I.RUNNING: frozenset({_I.INSTANTIATING, _I.COMPLETED, _I.FAILED, _I.TERMINATED}),
    _I.COMPLETED: frozenset(),
    _I.FAILED: frozenset(),
    _I.TERMINATED: frozenset(),
}


def check_instance_transition(current: InstanceState, target: InstanceState) -> None:
    """Raise IllegalTransition unless an instance may move current -> target."""
    if target not in INSTANCE_TRANSITIONS[current]:
        raise IllegalTransition("instance", str(current), str(target))


class PoolStatus(StrEnum):
    ACTIVE = "active"
    DRAINING = "draining"
    INACTIVE = "inactive"


_P = PoolStatus

POOL_TRANSITIONS: Mapping[PoolStatus, frozenset[PoolStatus]] = {
    _P.ACTIVE: frozenset({_P.DRAINING, _P.INACTIVE}),
    _P.DRAINING: frozenset({_P.ACTIVE, _P.INACTIVE}),
    _P.INACTIVE: frozenset({_P.ACTIVE}),
}


def check_pool_transition(current: PoolStatus, target: PoolStatus) -> None:
    """Raise IllegalTransition unless a pool may move current -> target."""
    if target not in POOL_TRANSITIONS[current]:
        raise IllegalTransition("pool", str(current), str(target))
