"""Reconciler rules (seed 003): what to do with one worker, given what EC2 says about its machine.

Pure functions over the worker record and an observation of its EC2 instance. The service layer reads
EC2, asks `decide` for a step, stores the transition and makes the EC2 call the step names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from fleetkeeper.domain.lead_time import LeadKind, coming_up
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus, can_transition, worker_status_for_ec2_state
from fleetkeeper.domain.models import DrainOutcome, DrainThen, Worker

_S = WorkerStatus

BACKOFF_BASE_SECONDS = 1
BACKOFF_MAX_SECONDS = 60
CAPACITY_BACKOFF_BASE_SECONDS = 60
CAPACITY_BACKOFF_MAX_SECONDS = 15 * 60
# A launch claim older than this is from a reconciler that died mid-launch.
LAUNCH_CLAIM_TTL = timedelta(minutes=5)
# A drain record without an execution and without a deadline of its own gets this long to empty.
ORPHAN_DRAIN_GRACE = timedelta(hours=4)


class Outcome(StrEnum):
    """Seed 003's result of reconciling one worker."""

    SUCCESS = "SUCCESS"  # converged: forget any retry state
    REQUEUE = "REQUEUE"  # not converged yet: look again next cycle
    RETRY = "RETRY"  # transient error: look again after an exponential backoff
    SKIP = "SKIP"  # nothing to do here (or someone else owns the worker right now)


class Ec2Call(StrEnum):
    LAUNCH = "launch"
    # Look for the machine a claimed launch may have started (by its worker-id tag) and terminate it.
    RETIRE_LAUNCHED = "retire_launched"
    START = "start"
    STOP = "stop"
    TERMINATE = "terminate"


def newest_per_worker(rows: Iterable[Worker]) -> list[Worker]:
    """One row per worker, its highest version, in first-seen order.

    The status index is read one status at a time, so a worker that changed status during the read
    can come back twice (RUNNING from an early page, STOPPING from a later one). Counting both would
    count it twice; the newer row is the truth.
    """
    newest: dict[str, Worker] = {}
    for row in rows:
        seen = newest.get(row.id)
        if seen is None or row.version > seen.version:
            newest[row.id] = row
    return list(newest.values())


def backoff_seconds(attempts: int) -> int:
    """1 s x 2^n, capped at 60 s; `attempts` is how many tries already failed before this one."""
    if attempts >= 6:  # 2^6 > 60: avoid computing huge powers for long-failing workers
        return BACKOFF_MAX_SECONDS
    return int(min(BACKOFF_BASE_SECONDS * 2 ** max(attempts, 0), BACKOFF_MAX_SECONDS))


def capacity_backoff_seconds(attempts: int) -> int:
    """After EC2 had no capacity (or the account no quota): 1 min x 2^n, capped at 15 min. Capacity
    comes back in minutes or hours, not seconds; asking sooner only spends the RunInstances budget."""
    if attempts >= 4:  # 60 x 2^4 > 900
        return CAPACITY_BACKOFF_MAX_SECONDS
    return int(min(CAPACITY_BACKOFF_BASE_SECONDS * 2 ** max(attempts, 0), CAPACITY_BACKOFF_MAX_SECONDS))


def next_attempt_at(now: datetime, attempts: int) -> datetime:
    return now + timedelta(seconds=backoff_seconds(attempts))


def is_due(worker: Worker, now: datetime) -> bool:
    """False while the worker waits out a RETRY backoff."""
    return worker.next_reconcile_at is None or worker.next_reconcile_at <= now


@dataclass(frozen=True)
class Observation:
    """What one DescribeInstances said about a worker's machine; state None means EC2 does not know it."""

    state: str | None
    private_ip: str | None = None
    public_ip: str | None = None
    launch_time: datetime | None = None
    observed_at: datetime | None = None

    @property
    def has_ip(self) -> bool:
        return bool(self.private_ip or self.public_ip)


@dataclass(frozen=True)
class Step:
    """One reconcile step: an optional transition, then an optional EC2 call, and the outcome."""

    outcome: Outcome
    reason: str = ""
    target: WorkerStatus | None = None
    cause: Cause = Cause.CONTROL
    call: Ec2Call | None = None
    changes: Mapping[str, Any] = field(default_factory=dict)
    # Seed 003 counter to bump once the step has landed, e.g. "started_count".
    counter: str | None = None
    drift: bool = False
    # Set when the step is to start a drain (then stop or terminate) rather than act on EC2 at once.
    drain_then: DrainThen | None = None


def _ips(obs: Observation) -> dict[str, Any]:
    return {"private_ip": obs.private_ip, "public_ip": obs.public_ip}


def _evidence(obs: Observation) -> dict[str, Any]:
    return {"ec2_state": obs.state, "ec2_observed_at": obs.observed_at}


# EC2 states that agree with a worker status although they do not map onto it one to one.
CONSISTENT_STATUSES: Mapping[str, frozenset[WorkerStatus]] = {
    "pending": frozenset({_S.PROVISIONING, _S.STARTING}),
    "running": frozenset({_S.RUNNING, _S.DRAINING}),
    "stopping": frozenset({_S.STOPPING}),
    "stopped": frozenset({_S.STOPPED}),
    "shutting-down": frozenset({_S.TERMINATING}),
    "terminated": frozenset({_S.TERMINATED}),
}


# Orphan GC's actor: the only retirement that a machine turning up again can undo.
GC_ACTOR = "discovery-gc"


def may_resurrect(worker: Worker) -> bool:
    """Whether a TERMINATED worker comes back with its machine: only if orphan GC retired it (GC could
    not see the machine and was wrong). A worker retired on purpose stays retired; its machine is leaked
    and discovery terminates it."""
    return worker.status == _S.TERMINATED and worker.terminated_by == GC_ACTOR


def follow_ec2(worker: Worker, obs: Observation) -> Step | None:
    """The drift correction EC2's state forces on the worker (seed 003 mapping), or None if it agrees."""
    if obs.state is None:
        return None
    if worker.status == _S.TERMINATED and not may_resurrect(worker):
        return None
    if worker.status in CONSISTENT_STATUSES.get(obs.state, frozenset()):
        return None
    target = worker_status_for_ec2_state(obs.state)
    if target == worker.status or not can_transition(worker.status, target, Cause.EC2):
        return None
    changes = _evidence(obs)
    if target == _S.RUNNING:
        changes.update(_ips(obs))
    counter = {_S.STOPPED: "stopped_count", _S.TERMINATED: "terminated_count"}.get(target)
    return Step(
        Outcome.SUCCESS,
        f"EC2 reports {obs.state}",
        target=target,
        cause=Cause.EC2,
        changes=changes,
        counter=counter,
        drift=True,
    )


def decide(
    worker: Worker, obs: Observation | None, now: datetime, *, provisioning_timeout: timedelta
) -> Step:
    """The next step for this worker. `obs` is None when the worker has no EC2 instance id yet."""
    handler = _HANDLERS.get(worker.status)
    if handler is None:
        return Step(Outcome.SKIP, f"nothing to reconcile in {worker.status}")
    return handler(worker, obs, now, provisioning_timeout)


def launch_may_have_run(worker: Worker) -> bool:
    """Whether RunInstances may already have started a machine for this PENDING worker."""
    return worker.launch_claimed_at is not None or worker.reconcile_attempts > 0


def _pending(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if worker.desired_status == _S.TERMINATED:
        if worker.launch_claimed_at is not None and now - worker.launch_claimed_at < LAUNCH_CLAIM_TTL:
            # Another reconciler is launching it right now: let it finish, then retire what it started.
            return Step(Outcome.SKIP, "a launch is in flight")
        if launch_may_have_run(worker):
            # A machine may exist even though the worker never heard of it: find it and end it first,
            # or it runs forever with nobody to stop it.
            return Step(
                Outcome.SUCCESS,
                "abandoned after a launch was claimed",
                target=_S.TERMINATED,
                call=Ec2Call.RETIRE_LAUNCHED,
            )
        return Step(Outcome.SUCCESS, "abandoned before launch", target=_S.TERMINATED)
    return Step(Outcome.SUCCESS, "launch", call=Ec2Call.LAUNCH, counter="provisioned_count")


def _timed_out(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> bool:
    since = obs.launch_time if obs is not None and obs.launch_time is not None else worker.updated_at
    return now - since > timeout


def _provisioning(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if worker.ec2_instance_id is None or obs is None:
        return Step(Outcome.REQUEUE, "no EC2 instance id", target=_S.FAILED)
    if worker.desired_status == _S.TERMINATED:
        return Step(Outcome.REQUEUE, "desired TERMINATED", target=_S.TERMINATING, call=Ec2Call.TERMINATE)
    if obs.state == "running":
        if obs.has_ip:
            changes = {**_ips(obs), **_evidence(obs)}
            return Step(
                Outcome.SUCCESS, "EC2 runs", target=_S.RUNNING, changes=changes, counter="started_count"
            )
        if worker.status == _S.PROVISIONING:
            return Step(Outcome.REQUEUE, "EC2 runs, waiting for an IP", target=_S.STARTING)
    elif obs.state not in (None, "pending"):
        drift = follow_ec2(worker, obs)
        if drift is not None:
            return drift
        return Step(Outcome.RETRY, f"unexpected EC2 state {obs.state}")
    if _timed_out(worker, obs, now, timeout):
        return Step(
            Outcome.REQUEUE,
            f"EC2 timeout: not ready within {int(timeout.total_seconds())}s",
            target=_S.FAILED,
        )
    return Step(Outcome.REQUEUE, f"EC2 is {obs.state or 'not visible yet'}")


def _running(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if worker.desired_status in (_S.STOPPED, _S.TERMINATED) and worker.active_instances > 0:
        # Work is still running on it: drain first, so a desired status never cuts a session short.
        then = DrainThen.STOP if worker.desired_status == _S.STOPPED else DrainThen.TERMINATE
        return Step(Outcome.REQUEUE, f"desired {worker.desired_status}: draining first", drain_then=then)
    if worker.desired_status == _S.STOPPED:
        return Step(Outcome.REQUEUE, "desired STOPPED", target=_S.STOPPING, call=Ec2Call.STOP)
    if worker.desired_status == _S.TERMINATED:
        return Step(Outcome.REQUEUE, "desired TERMINATED", target=_S.TERMINATING, call=Ec2Call.TERMINATE)
    if obs is None:
        return Step(Outcome.SKIP, "no EC2 instance id")
    if obs.state is None:
        # Gone without a trace: keep placement away from it at once; discovery's GC confirms and ends it.
        return Step(
            Outcome.SUCCESS,
            "EC2 does not know the instance",
            target=_S.UNKNOWN,
            cause=Cause.EC2,
            changes=_evidence(obs),
            drift=True,
        )
    drift = follow_ec2(worker, obs)
    if drift is not None:
        return drift
    return Step(Outcome.SUCCESS, "steady")


def drain_is_finished(worker: Worker, now: datetime) -> bool:
    """Whether a DRAINING worker's drain no longer owns it, so the reconciler must move it on.

    A drain whose workflow runs owns the worker until it finishes. A finished drain (any outcome but
    RUNNING) left the worker behind. A drain without an execution has nobody to finish it: it is over
    once the worker is empty or its deadline has passed.
    """
    drain = worker.drain
    if drain is None:
        return worker.active_instances == 0 or now - worker.updated_at > ORPHAN_DRAIN_GRACE
    if drain.outcome != DrainOutcome.RUNNING:
        return True
    if drain.execution_arn is None:
        return worker.active_instances == 0 or now >= drain.deadline
    return False


def _draining(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if obs is not None and obs.state is not None:
        drift = follow_ec2(worker, obs)
        if drift is not None:
            return drift
    if not drain_is_finished(worker, now):
        return Step(Outcome.SKIP, "the drain workflow owns this worker")
    if worker.active_instances > 0:
        # The drain ended in ERROR with work still running (and DrainFailed raised the alarm): stopping
        # now would cut sessions short. It stays out of placement until an operator cancels or re-drains.
        return Step(Outcome.SKIP, "drain failed with instances still running; waiting for an operator")
    then = worker.drain.then if worker.drain is not None else DrainThen.STOP
    if then == DrainThen.TERMINATE:
        return Step(Outcome.REQUEUE, "drain finished", target=_S.TERMINATING, call=Ec2Call.TERMINATE)
    return Step(Outcome.REQUEUE, "drain finished", target=_S.STOPPING, call=Ec2Call.STOP)


def _stopping(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if obs is None or obs.state is None:
        return Step(Outcome.SUCCESS, "no EC2 instance to stop", target=_S.STOPPED, counter="stopped_count")
    if obs.state == "stopped":
        return Step(
            Outcome.SUCCESS, "EC2 stopped", target=_S.STOPPED, changes=_evidence(obs), counter="stopped_count"
        )
    if obs.state == "running":
        return Step(Outcome.REQUEUE, "stop issued", call=Ec2Call.STOP)
    if obs.state in ("stopping", "pending"):
        return Step(Outcome.REQUEUE, f"EC2 is {obs.state}")
    drift = follow_ec2(worker, obs)
    if drift is not None:
        return drift
    return Step(Outcome.RETRY, f"unexpected EC2 state {obs.state}")


def _terminating(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if obs is None or obs.state is None:
        return Step(Outcome.SUCCESS, "no EC2 instance left", target=_S.TERMINATED, counter="terminated_count")
    if obs.state == "terminated":
        return Step(
            Outcome.SUCCESS,
            "EC2 terminated",
            target=_S.TERMINATED,
            changes=_evidence(obs),
            counter="terminated_count",
        )
    if obs.state == "shutting-down":
        return Step(Outcome.REQUEUE, "EC2 is shutting down")
    return Step(Outcome.REQUEUE, "terminate issued", call=Ec2Call.TERMINATE)


def _stopped(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if worker.desired_status == _S.TERMINATED:
        return Step(Outcome.REQUEUE, "desired TERMINATED", target=_S.TERMINATING, call=Ec2Call.TERMINATE)
    if obs is not None and obs.state not in (None, "stopped"):
        drift = follow_ec2(worker, obs)
        if drift is not None:
            return drift
    if worker.desired_status == _S.RUNNING and obs is not None and obs.state == "stopped":
        return Step(
            Outcome.REQUEUE,
            "desired RUNNING",
            target=_S.STARTING,
            call=Ec2Call.START,
            changes=coming_up(LeadKind.START, now),
        )
    return Step(Outcome.SKIP, "stays stopped")


def _failed(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if obs is not None and obs.state not in (None, "terminated", "shutting-down"):
        return Step(Outcome.REQUEUE, "cleanup", target=_S.TERMINATING, call=Ec2Call.TERMINATE)
    return Step(Outcome.SUCCESS, "cleanup: no EC2 instance left", target=_S.TERMINATED)


def _unknown(worker: Worker, obs: Observation | None, now: datetime, timeout: timedelta) -> Step:
    if obs is not None:
        drift = follow_ec2(worker, obs)
        if drift is not None:
            return drift
    # EC2 does not know the machine: discovery's GC verifies and terminates it.
    return Step(Outcome.SKIP, "waiting for discovery to confirm")


_HANDLERS = {
    _S.PENDING: _pending,
    _S.PROVISIONING: _provisioning,
    _S.STARTING: _provisioning,
    _S.RUNNING: _running,
    _S.DRAINING: _draining,
    _S.STOPPING: _stopping,
    _S.STOPPED: _stopped,
    _S.TERMINATING: _terminating,
    _S.FAILED: _failed,
    _S.UNKNOWN: _unknown,
}

# Order of EC2 instance states within one run of a machine; used to order events of the same second.
_EC2_STATE_ORDER: Mapping[str, int] = {
    "pending": 0,
    "running": 1,
    "stopping": 2,
    "stopped": 3,
    "shutting-down": 4,
    "terminated": 5,
}


def is_stale_evidence(worker: Worker, state: str, at: datetime) -> bool:
    """Whether an EC2 report (state at a time) is older than what the worker already reflects.

    EC2 events arrive at least once and out of order; applying an older one would move the worker
    backwards. A terminated instance never comes back, so nothing after `terminated` is believed.
    """
    if worker.ec2_state == "terminated":
        return True
    observed = worker.ec2_observed_at
    if observed is None:
        return False
    # Event times have whole seconds; an observation within the same second is ordered by state.
    observed = observed.replace(microsecond=0)
    at = at.replace(microsecond=0)
    if at < observed:
        return True
    if at == observed:
        return _EC2_STATE_ORDER.get(state, -1) <= _EC2_STATE_ORDER.get(worker.ec2_state or "", -1)
    return False
