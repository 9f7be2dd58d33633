"""The one AWS error classifier and its bounded, jittered retries."""

from __future__ import annotations

from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from fleetkeeper.cloud import retry
from fleetkeeper.domain.errors import NotFound, StaleWrite, Unavailable


def client_error(code: str, status: int = 400, reasons: list[str] | None = None) -> ClientError:
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": "test"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    if reasons is not None:
        response["CancellationReasons"] = [{"Code": r} for r in reasons]
    return ClientError(response, "TransactWriteItems")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "error",
    [
        client_error("ThrottlingException"),
        client_error("ProvisionedThroughputExceededException"),
        client_error("RequestLimitExceeded", 503),
        client_error("TooManyRequestsException", 429),
        client_error("RequestThrottled"),
        client_error("InternalServerError", 500),
        client_error("ServiceUnavailable", 503),
        client_error("SomethingNew", 502),
        client_error("TransactionCanceledException", reasons=["None", "TransactionConflict"]),
        client_error("TransactionCanceledException", reasons=["ThrottlingError", "None"]),
        client_error("TransactionCanceledException", reasons=["ProvisionedThroughputExceeded"]),
        EndpointConnectionError(endpoint_url="http://dynamodb"),
        ReadTimeoutError(endpoint_url="http://dynamodb"),
    ],
    ids=lambda e: type(e).__name__ + ":" + (retry.error_code(e) or ""),
)
def test_given_a_transient_aws_error_then_it_is_retryable(error: Exception) -> None:
    assert retry.is_retryable(error)


@pytest.mark.parametrize(
    "error",
    [
        client_error("ConditionalCheckFailedException"),
        client_error("ValidationException"),
        client_error("AccessDeniedException", 403),
        client_error("ResourceNotFoundException"),
        client_error("InsufficientInstanceCapacity"),
        # EC2 answers no capacity with a 500; it is final all the same, as is running out of quota.
        client_error("InsufficientInstanceCapacity", 500),
        client_error("InstanceLimitExceeded"),
        client_error("VcpuLimitExceeded"),
        client_error("Unsupported"),
        client_error("TransactionCanceledException", reasons=["ConditionalCheckFailed", "None"]),
        # A failed condition decides the outcome even when another item also met a conflict.
        client_error(
            "TransactionCanceledException", reasons=["ConditionalCheckFailed", "TransactionConflict"]
        ),
        client_error("TransactionCanceledException", reasons=["ValidationError"]),
        client_error("TransactionCanceledException", reasons=[]),
        ValueError("not AWS"),
        NotFound("worker", "w-1"),
    ],
    ids=lambda e: type(e).__name__ + ":" + (retry.error_code(e) or ""),
)
def test_given_a_final_error_then_it_is_not_retryable(error: Exception) -> None:
    assert not retry.is_retryable(error)


def test_given_throttling_that_clears_when_retried_then_the_call_succeeds_after_jittered_sleeps() -> None:
    failures = [client_error("ThrottlingException"), client_error("InternalServerError", 500)]
    slept: list[float] = []

    def call() -> str:
        if failures:
            raise failures.pop(0)
        return "done"

    before = retry.retry_counts()
    assert retry.with_backoff(call, name="Test", base=0.1, cap=1.0, sleep=slept.append) == "done"
    assert len(slept) == 2
    assert 0 <= slept[0] <= 0.1
    assert 0 <= slept[1] <= 0.2
    after = retry.retry_counts()
    assert (
        after.get("retry:Test:ThrottlingException", 0) == before.get("retry:Test:ThrottlingException", 0) + 1
    )


def test_given_throttling_that_persists_when_retried_then_a_typed_retryable_error_carries_the_cause() -> None:
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise client_error("ProvisionedThroughputExceededException")

    slept: list[float] = []
    with pytest.raises(Unavailable) as raised:
        retry.with_backoff(call, name="PutItem", attempts=4, sleep=slept.append)
    assert calls == 4
    assert len(slept) == 3
    assert raised.value.code == "SERVICE_UNAVAILABLE"
    assert raised.value.retryable
    assert isinstance(raised.value.__cause__, ClientError)
    assert "ProvisionedThroughputExceededException" in raised.value.message


def test_given_a_sleep_budget_when_delays_would_exceed_it_then_retrying_stops_early() -> None:
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise client_error("ThrottlingException")

    slept: list[float] = []
    with pytest.raises(Unavailable):
        retry.with_backoff(call, attempts=100, base=1.0, cap=1.0, budget=2.0, sleep=slept.append)
    assert sum(slept) <= 2.0
    assert calls < 100


def test_given_a_final_error_when_called_with_backoff_then_it_propagates_unchanged_at_once() -> None:
    calls = 0

    def call() -> None:
        nonlocal calls
        calls += 1
        raise client_error("ConditionalCheckFailedException")

    with pytest.raises(ClientError):
        retry.with_backoff(call, sleep=lambda _: None)
    assert calls == 1


def test_given_a_lost_race_that_persists_when_retrying_conflicts_then_the_conflict_propagates() -> None:
    calls = 0

    def write() -> None:
        nonlocal calls
        calls += 1
        raise StaleWrite("worker", "w-1", "RUNNING")

    slept: list[float] = []
    with pytest.raises(StaleWrite):
        retry.retry_conflicts(write, attempts=3, sleep=slept.append)
    assert calls == 3
    assert len(slept) == 2
    assert all(0 <= s <= retry.CONFLICT_CAP_SECONDS for s in slept)


def test_given_a_lost_race_once_when_retrying_conflicts_then_the_second_attempt_wins() -> None:
    outcomes: list[Exception | str] = [StaleWrite("pool", "p", "active"), "won"]

    def write() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert retry.retry_conflicts(write, sleep=lambda _: None) == "won"
