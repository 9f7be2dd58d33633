"""Typed domain errors. The API maps each class to one HTTP status, in one place."""

from __future__ import annotations

from collections.abc import Sequence


def listed(items: Sequence[str], limit: int, total: int | None = None) -> str:
    """Names as an error lists them: the first `limit`, then how many more there were, so an answer
    stays small and still says how many ("w-1, w-2 and 9,998 more"). `total` counts them when only the
    first of them are at hand."""
    shown = list(items[:limit])
    more = max(total or 0, len(items)) - len(shown)
    return ", ".join(shown) + (f" and {more:,} more" if more > 0 else "")


class FleetkeeperError(Exception):
    """Base of every error fleetkeeper raises on purpose."""

    code = "FLEETKEEPER_ERROR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def details(self) -> dict[str, str | int | None]:
        """Machine-readable fields that go into an error body next to the message."""
        return {}


class NotFound(FleetkeeperError):
    code = "NOT_FOUND"

    def __init__(self, kind: str, key: str) -> None:
        super().__init__(f"{kind} '{key}' was not found")
        self.kind = kind
        self.key = key

    def details(self) -> dict[str, str | int | None]:
        return {"kind": self.kind, "id": self.key}


class InvalidInput(FleetkeeperError):
    """Input that parsed but breaks a rule; names the field and the reason."""

    code = "INVALID_INPUT"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason

    def details(self) -> dict[str, str | int | None]:
        return {"field": self.field, "reason": self.reason}


class IllegalTransition(FleetkeeperError):
    code = "ILLEGAL_TRANSITION"

    def __init__(self, entity: str, current: str, target: str, cause: str | None = None) -> None:
        suffix = f" (cause {cause})" if cause else ""
        super().__init__(f"{entity} cannot move from {current} to {target}{suffix}")
        self.entity = entity
        self.current = current
        self.target = target
        self.cause = cause

    def details(self) -> dict[str, str | int | None]:
        return {"entity": self.entity, "current_status": self.current, "target_status": self.target}


class Conflict(FleetkeeperError):
    """The entity is not in the state the write expected: a lost race or a wrong precondition."""

    code = "CONFLICT"

    def __init__(self, entity: str, key: str, current_status: str | None, message: str | None = None) -> None:
        state = current_status if current_status is not None else "absent"
        super().__init__(message or f"{entity} '{key}' changed concurrently; it is now {state}")
        self.entity = entity
        self.key = key
        self.current_status = current_status

    def details(self) -> dict[str, str | int | None]:
        return {"entity": self.entity, "id": self.key, "current_status": self.current_status}


class StaleWrite(Conflict):
    """A conditional write lost a race: the item changed since it was read. Re-read and try again."""

    code = "CONFLICT"


class DrainInProgress(Conflict):
    code = "DRAIN_IN_PROGRESS"

    def __init__(self, entity: str, key: str) -> None:
        super().__init__(entity, key, "DRAINING", "Drain already in progress")


class DisruptionHeld(Conflict):
    """The door for disruption held a voluntary disruption back (domain/admission.WaitReason)."""

    code = "DISRUPTION_HELD"

    def __init__(self, worker_id: str, why: str, detail: str) -> None:
        super().__init__("worker", worker_id, None, f"worker {worker_id} waits ({why}): {detail}")
        self.why = why

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "why": self.why}


class NoLongerDue(Conflict):
    """The worker read afresh is no longer what the disruption was decided on (a repair's worker healthy
    again): the admitting write is not made."""

    def __init__(self, worker_id: str, current_status: str | None, why: str) -> None:
        super().__init__("worker", worker_id, current_status, f"worker {worker_id}: {why}")


class PoolNotActive(Conflict):
    """A new worker (or a voluntary disruption) asked of a pool that is draining or inactive."""

    code = "POOL_NOT_ACTIVE"

    def __init__(self, pool: str, status: str) -> None:
        super().__init__(
            "pool", pool, status, f"pool {pool} is {status}: it takes no new worker until it is active again"
        )


class PoolFull(Conflict):
    """A new worker asked of a pool that has `max_workers` members already (domain/capacity.py)."""

    code = "POOL_FULL"

    def __init__(self, pool: str, max_workers: int) -> None:
        super().__init__(
            "pool", pool, None, f"pool {pool} has max_workers ({max_workers}) workers: it takes no new one"
        )
        self.max_workers = max_workers


class BookingsWaiting(Conflict):
    """A pool write that would turn bookings off while some still wait for capacity: nothing would
    place or fail them then."""

    def __init__(self, pool: str) -> None:
        super().__init__(
            "pool",
            pool,
            None,
            f"capacity.bookings: bookings of pool {pool} wait for capacity; end them (or let them be placed) "
            "before turning bookings off",
        )

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "field": "capacity.bookings"}


class DrainFinishing(Conflict):
    """A cancel, a deadline move or a force that came after Finish began: the worker is empty, its
    before-stop operations (e.g. releasing the license) and its stop have started, and none of these
    can take them back or change them."""

    code = "DRAIN_FINISHING"

    def __init__(
        self, worker_id: str, generation: int, current_status: str | None, refused: str = "a cancel"
    ) -> None:
        super().__init__(
            "worker",
            worker_id,
            current_status,
            f"drain {generation} of worker {worker_id} is finishing: its before-stop operations and its "
            f"stop have started and {refused} cannot undo them; wait for the worker to stop, then "
            "start it",
        )
        self.generation = generation

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "generation": self.generation}


class DeadlinePassed(Conflict):
    """A deadline move for a drain whose deadline has passed (or was forced): its force may have begun,
    and instances it ended cannot be given back."""

    code = "DEADLINE_PASSED"

    def __init__(self, worker_id: str, generation: int, current_status: str | None, deadline: str) -> None:
        super().__init__(
            "worker",
            worker_id,
            current_status,
            f"the deadline of drain {generation} of worker {worker_id} passed at {deadline}: the drain "
            "is being forced and its deadline can no longer move",
        )
        self.generation = generation
        self.deadline = deadline

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "generation": self.generation, "deadline": self.deadline}


class TooManyDeadlineMoves(Conflict):
    """A drain's deadline moved as often as one execution's history allows (docs/drains.md)."""

    code = "TOO_MANY_DEADLINE_MOVES"

    def __init__(self, worker_id: str, generation: int, current_status: str | None, limit: int) -> None:
        super().__init__(
            "worker",
            worker_id,
            current_status,
            f"the deadline of drain {generation} of worker {worker_id} already moved {limit} times, the "
            "most a drain allows; force it, or cancel it and start a new drain",
        )
        self.generation = generation
        self.limit = limit

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "generation": self.generation, "max_moves": self.limit}


class WorkflowUnavailable(FleetkeeperError):
    """The drain workflow could not be started; nothing was left half-done."""

    code = "WORKFLOW_UNAVAILABLE"


class CapacityUnavailable(FleetkeeperError):
    """No worker can take the instance right now; the message says why."""

    code = "NO_CAPACITY"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DrainCancelled(FleetkeeperError):
    """Raised inside a drain workflow when the drain it serves was cancelled or superseded.

    The class name is the Step Functions error name the state machine catches.
    """

    code = "DRAIN_CANCELLED"


class DrainNotEmpty(FleetkeeperError):
    """Raised by the finish step when work still runs before the deadline: the workflow waits again.

    The class name is the Step Functions error name the state machine routes back to its re-check.
    """

    code = "DRAIN_NOT_EMPTY"


class DrainDeadlineMoved(FleetkeeperError):
    """Raised by the force step when the drain's deadline has not passed (it moved later meanwhile).

    The class name is the Step Functions error name the state machine routes back to its re-check, which
    arms the next wait with the time left to the new deadline, or forces once it has passed.
    """

    code = "DRAIN_DEADLINE_MOVED"


class DrainNotStartable(FleetkeeperError):
    """A drain workflow found its worker or pool in a state it cannot drain from."""

    code = "DRAIN_NOT_STARTABLE"


class Unavailable(FleetkeeperError):
    """A dependency stayed throttled, conflicted or down after bounded retries; try again later.

    Nothing was written (or the write is safe to repeat): the caller may retry the same request.
    """

    code = "SERVICE_UNAVAILABLE"
    retryable = True

    def __init__(self, operation: str, reason: str) -> None:
        super().__init__(f"{operation} did not go through: {reason}; retry shortly")
        self.operation = operation
        self.reason = reason

    def details(self) -> dict[str, str | int | None]:
        return {"operation": self.operation, "reason": self.reason, "retryable": "true"}


class DrainNoLongerActive(Conflict):
    """A write made on behalf of a drain found that drain cancelled, finished or superseded.

    Raised instead of ending a session for a drain that is over, so a cancel that committed first wins.
    """

    code = "DRAIN_NO_LONGER_ACTIVE"

    def __init__(self, worker_id: str, generation: int, current_status: str | None, why: str) -> None:
        super().__init__(
            "worker", worker_id, current_status, f"drain {generation} of worker {worker_id} is over: {why}"
        )
        self.generation = generation

    def details(self) -> dict[str, str | int | None]:
        return {**super().details(), "generation": self.generation}
