"""The pure rules of worker operations: the catalogue's checks, retries and backoff, output, schedule."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from fleetkeeper.domain.errors import InvalidInput
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.operations import (
    MAX_BACKOFF_SECONDS,
    OUTPUT_EXCERPT_CHARS,
    Catalogue,
    Operation,
    OperationStatus,
    after_failed_attempt,
    backoff,
    excerpt,
    parse_system_info,
    system_info_due,
)

CATALOGUE = Catalogue.model_validate(
    {
        "operations": {
            "register-license": {
                "document": "fk-RegisterLicense",
                "parameters": {
                    "licenseParameter": {"pattern": "^/[a-z/-]+$", "default": "/fk/license"},
                    "seats": {"pattern": "^[0-9]{1,3}$", "required": True},
                },
            },
            "deregister-license": {"document": "fk-DeregisterLicense", "cleanup": True},
            "needs-input": {
                "document": "fk-NeedsInput",
                "cleanup": True,
                "parameters": {"target": {"required": True}},
            },
        }
    }
)
NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


def operation(**changes: object) -> Operation:
    fields: dict[str, object] = {
        "id": "op-1",
        "worker_id": "w-1",
        "name": "register-license",
        "document": "fk-RegisterLicense",
        "requested_by": "op",
        "max_attempts": 3,
    }
    return Operation.model_validate({**fields, **changes})


def test_given_good_parameters_then_defaults_are_filled_in() -> None:
    assert CATALOGUE.parameters_for("register-license", {"seats": "4"}) == {
        "licenseParameter": "/fk/license",
        "seats": "4",
    }


@pytest.mark.parametrize(
    ("name", "given", "field"),
    [
        ("reboot", {}, "name"),
        ("register-license", {"seats": "4", "extra": "x"}, "parameters.extra"),
        ("register-license", {}, "parameters.seats"),
        ("register-license", {"seats": "4000"}, "parameters.seats"),
        (
            "register-license",
            {"seats": "4", "licenseParameter": "/fk/$(reboot)"},
            "parameters.licenseParameter",
        ),
    ],
)
def test_given_what_the_catalogue_refuses_then_invalid_input_names_the_field(
    name: str, given: dict[str, str], field: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        CATALOGUE.parameters_for(name, given)
    assert refused.value.field == field


def test_given_before_stop_names_then_only_parameterless_cleanup_operations_pass() -> None:
    CATALOGUE.check_before_stop(["deregister-license"])
    for names, field in (
        (["register-license"], "before_stop.0"),
        (["deregister-license", "needs-input"], "before_stop.1"),
    ):
        with pytest.raises(InvalidInput) as refused:
            CATALOGUE.check_before_stop(names)
        assert refused.value.field == field


def test_given_a_cleanup_operation_then_it_runs_on_running_and_draining_workers_only() -> None:
    cleanup = CATALOGUE.spec("deregister-license")
    other = CATALOGUE.spec("register-license")
    assert [s for s in WorkerStatus if cleanup.runs_on(s)] == [WorkerStatus.RUNNING, WorkerStatus.DRAINING]
    assert [s for s in WorkerStatus if other.runs_on(s)] == [WorkerStatus.RUNNING]


def test_given_failed_attempts_then_the_backoff_doubles_up_to_its_cap_and_the_last_one_fails() -> None:
    assert [backoff(n, 30).total_seconds() for n in (1, 2, 3)] == [30, 60, 120]
    assert backoff(20, 30).total_seconds() == MAX_BACKOFF_SECONDS

    retry = after_failed_attempt(operation(attempts=1), "boom", NOW, 30)
    last = after_failed_attempt(operation(attempts=3), "boom", NOW, 30)

    assert (retry["status"], retry["next_attempt_at"]) == (
        OperationStatus.PENDING,
        NOW + timedelta(seconds=30),
    )
    assert (last["status"], last["finished_at"]) == (OperationStatus.FAILED, NOW)


def test_given_long_output_then_the_excerpt_keeps_its_end_and_stderr() -> None:
    text = excerpt("x" * 5000 + "END", "oops")
    assert text is not None
    assert len(text) == OUTPUT_EXCERPT_CHARS
    assert text.endswith("END\n--- stderr ---\noops")
    assert excerpt("", "  ") is None


@pytest.mark.parametrize("stdout", ["", "not json", "[1, 2]", json.dumps({"blob": "x" * 20_000})])
def test_given_output_that_is_not_a_small_json_object_then_system_info_is_refused(stdout: str) -> None:
    with pytest.raises(ValueError, match=r"output|printed"):
        parse_system_info(stdout)


def test_given_a_fleet_then_system_info_requests_spread_over_the_interval_once_each() -> None:
    workers = [f"w-{n}" for n in range(200)]
    minutes = [NOW + timedelta(minutes=m) for m in range(60)]
    due_counts = [sum(system_info_due(w, None, t, 3600, 60) for w in workers) for t in minutes]
    assert sum(due_counts) == len(workers)  # each worker exactly once per interval
    assert max(due_counts) < 20  # no thundering herd
    assert not system_info_due("w-1", NOW - timedelta(minutes=10), NOW, 3600, 60)
    assert not system_info_due("w-1", None, NOW, 0, 60)
