"""The one place AWS errors are classified, and the one jittered retry for what is worth retrying.

Two kinds of failure are retried, each a bounded number of times with full-jitter exponential backoff
(a random sleep between 0 and min(cap, base * 2**attempt), which spreads colliding writers apart):

- `with_backoff`: an AWS call that failed for a transient reason (throttling, a 5xx, a transaction
  cancelled by a concurrent one, a dropped connection). The same call is sent again; when the attempts
  or the sleep budget run out it raises `Unavailable`, a typed retryable error carrying the cause.
- `retry_conflicts`: an operation that reads what it writes and lost an optimistic race (`StaleWrite`).
  It is run again from its read; when the attempts run out the last `StaleWrite` propagates.

Everything else is final and propagates at once. The budgets keep a Lambda from being held: the sleeps of
one `with_backoff` call never add up to more than `DEFAULT_BUDGET_SECONDS`.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from fleetkeeper.domain.errors import StaleWrite, Unavailable
from fleetkeeper.observability import metrics

T = TypeVar("T")

# Error codes AWS services use when they throttle a caller.
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "RequestLimitExceeded",
        "EC2ThrottledException",
        "BandwidthLimitExceeded",
        "SlowDown",
        "PriorRequestNotComplete",
        "TransactionInProgressException",
    }
)
# Error codes of a transient fault on the service side or of a concurrent transaction.
TRANSIENT_CODES = frozenset(
    {
        "InternalServerError",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "Unavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "TransactionConflictException",
    }
)
# EC2 has no capacity for the instance type, or the account no quota, for a launch or a start. Sending
# the same request again soon meets the same answer, though EC2 answers InsufficientInstanceCapacity with
# a 500: final for the attempt, never retried here nor by the SDK (cloud/clients.py).
CAPACITY_CODES = frozenset(
    {"InsufficientInstanceCapacity", "InstanceLimitExceeded", "VcpuLimitExceeded", "Unsupported"}
)
# The per-item reasons of a cancelled DynamoDB transaction that a second attempt can clear. Any other
# reason (a failed condition, a validation error, an item collection too large) is final.
RETRYABLE_CANCELLATION_REASONS = frozenset(
    {"TransactionConflict", "ThrottlingError", "ProvisionedThroughputExceeded", "RequestLimitExceeded"}
)
TRANSACTION_CANCELLED = "TransactionCanceledException"
NO_REASON = "None"

DEFAULT_ATTEMPTS = 5
DEFAULT_BASE_SECONDS = 0.05
DEFAULT_CAP_SECONDS = 1.0
DEFAULT_BUDGET_SECONDS = 2.0

# A lost race means somebody else just wrote; a few fresh attempts settle it. More than this means a hot
# item under sustained contention, which the caller should hear about.
CONFLICT_ATTEMPTS = 8
CONFLICT_BASE_SECONDS = 0.005
CONFLICT_CAP_SECONDS = 0.1

METRIC_AWS_RETRIES = "AwsRetries"
METRIC_AWS_RETRIES_EXHAUSTED = "AwsRetriesExhausted"
METRIC_CONFLICT_RETRIES = "ConflictRetries"

_counts: Counter[str] = Counter()
_counts_lock = threading.Lock()
# Drawn from the OS on each call rather than from a generator seeded at import: with Lambda SnapStart
# every environment restored from one snapshot would share that seed, and retry in lockstep.
_random = random.SystemRandom()


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a ClientError, None for anything else."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code") or "") or None
    return None


def cancellation_reasons(exc: BaseException) -> list[dict[str, Any]]:
    """The per-item reasons of a cancelled DynamoDB transaction, in the order the items were sent."""
    if error_code(exc) != TRANSACTION_CANCELLED:
        return []
    response: Mapping[str, Any] = exc.response  # type: ignore[attr-defined]
    return [dict(r) for r in response.get("CancellationReasons") or []]


def is_retryable(exc: BaseException) -> bool:
    """True when sending the same request again may succeed: throttling, 5xx, conflicts, lost connections."""
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return True
    if not isinstance(exc, ClientError):
        return False
    code = error_code(exc)
    if code == TRANSACTION_CANCELLED:
        reasons = [
            str(r.get("Code")) for r in cancellation_reasons(exc) if r.get("Code") not in (None, NO_REASON)
        ]
        return bool(reasons) and all(r in RETRYABLE_CANCELLATION_REASONS for r in reasons)
    if code in CAPACITY_CODES:
        return False
    if code in THROTTLING_CODES or code in TRANSIENT_CODES:
        return True
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return isinstance(status, int) and status >= 500


def _why(exc: BaseException) -> str:
    if error_code(exc) == TRANSACTION_CANCELLED:
        codes = sorted({str(r.get("Code")) for r in cancellation_reasons(exc)} - {NO_REASON})
        return f"{TRANSACTION_CANCELLED}[{','.join(codes)}]"
    return error_code(exc) or type(exc).__name__


def full_jitter(attempt: int, base: float, cap: float) -> float:
    """A random delay in [0, min(cap, base * 2**attempt)]."""
    return _random.uniform(0, min(cap, base * 2**attempt))


def _count(key: str, metric: str) -> None:
    with _counts_lock:
        _counts[key] += 1
    metrics.add_metric(name=metric, unit="Count", value=1)


def retry_counts() -> dict[str, int]:
    """Retries and exhausted retries so far in this process, by kind and error code."""
    with _counts_lock:
        return dict(_counts)


def with_backoff(
    operation: Callable[[], T],
    *,
    name: str = "aws",
    attempts: int = DEFAULT_ATTEMPTS,
    base: float = DEFAULT_BASE_SECONDS,
    cap: float = DEFAULT_CAP_SECONDS,
    budget: float = DEFAULT_BUDGET_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run an AWS call, retrying retryable errors; raise `Unavailable` from the last one when they persist.

    A final error propagates unchanged at once, so callers still see a failed condition as it is.
    """
    slept = 0.0
    attempt = 0
    while True:
        try:
            return operation()
        except Exception as exc:
            if not is_retryable(exc):
                raise
            why = _why(exc)
            delay = full_jitter(attempt, base, cap)
            attempt += 1
            if attempt >= attempts or slept + delay > budget:
                _count(f"exhausted:{name}:{why}", METRIC_AWS_RETRIES_EXHAUSTED)
                raise Unavailable(name, f"{why} after {attempt} attempts") from exc
            _count(f"retry:{name}:{why}", METRIC_AWS_RETRIES)
            sleep(delay)
            slept += delay


def retry_conflicts(
    operation: Callable[[], T],
    attempts: int = CONFLICT_ATTEMPTS,
    *,
    base: float = CONFLICT_BASE_SECONDS,
    cap: float = CONFLICT_CAP_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run `operation` (which must read what it writes) until it stops losing races.

    After `attempts` lost races the last `StaleWrite` propagates: a conflict is never swallowed.
    """
    for attempt in range(attempts - 1):
        try:
            return operation()
        except StaleWrite as lost:
            pause_after_conflict(lost, attempt, base=base, cap=cap, sleep=sleep)
    return operation()


def pause_after_conflict(
    lost: StaleWrite,
    attempt: int,
    *,
    base: float = CONFLICT_BASE_SECONDS,
    cap: float = CONFLICT_CAP_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Count a lost race and wait a jittered pause before the next attempt (the `attempt`-th retry),
    for loops that decide between attempts what to read again (retry_conflicts is the simple case)."""
    _count(f"conflict:{lost.entity}", METRIC_CONFLICT_RETRIES)
    sleep(full_jitter(attempt, base, cap))
