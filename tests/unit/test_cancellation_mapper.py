"""The one mapper from a cancelled DynamoDB transaction to the typed error its caller described."""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from fleetkeeper.domain.errors import Conflict, NotFound
from fleetkeeper.store.table import cancellation_error, refuse_missing


def cancelled(*reasons: dict[str, Any]) -> ClientError:
    response: dict[str, Any] = {
        "Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
        "CancellationReasons": list(reasons),
    }
    return ClientError(response, "TransactWriteItems")  # type: ignore[arg-type]


def test_given_a_failed_condition_on_item_one_then_its_refusal_gets_the_item_as_it_is_now() -> None:
    seen: list[dict[str, Any] | None] = []

    def refuse(current: dict[str, Any] | None) -> Exception:
        seen.append(current)
        return Conflict("worker", "w-1", "DRAINING")

    old = {"status": {"S": "DRAINING"}}
    error = cancellation_error(
        cancelled({"Code": "None"}, {"Code": "ConditionalCheckFailed", "Item": old}, {"Code": "None"}),
        {0: lambda _: AssertionError("item 0 did not fail"), 1: refuse},
    )
    assert isinstance(error, Conflict)
    assert error.current_status == "DRAINING"
    assert seen == [old]


def test_given_a_failed_condition_on_a_missing_item_then_not_found_names_it() -> None:
    error = cancellation_error(
        cancelled({"Code": "ConditionalCheckFailed"}),
        {0: refuse_missing("pool", "labs", lambda current: Conflict("pool", "labs", "active"))},
    )
    assert isinstance(error, NotFound)
    assert error.details() == {"kind": "pool", "id": "labs"}


def test_given_only_conflicts_or_throttling_then_no_refusal_applies() -> None:
    error = cancellation_error(
        cancelled({"Code": "TransactionConflict"}, {"Code": "ThrottlingError"}),
        {0: lambda _: Conflict("x", "y", None), 1: lambda _: Conflict("x", "y", None)},
    )
    assert error is None


def test_given_a_failed_condition_nobody_described_then_no_typed_error_is_invented() -> None:
    failure = cancelled({"Code": "None"}, {"Code": "ConditionalCheckFailed"})
    assert cancellation_error(failure, {0: lambda _: NotFound("worker", "w-1")}) is None
