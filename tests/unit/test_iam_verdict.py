"""The IAM verdict of a run: who a request belongs to, and what fails the run besides a denial."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.iam.attribution import PACKAGE, own_code, owners
from fleetkeeper_local.iam.evaluator import Decision
from fleetkeeper_local.iam.record import DENIED, ERROR, MISSING, Outcome, Summary
from fleetkeeper_local.iam.requests import Authorization
from tests import iam_plugin


def test_given_handler_imports_then_each_function_owns_the_widest_package_nothing_outside_imports() -> None:
    owned = own_code(
        handlers={
            "reconcile": {"fleetkeeper.services.reconcile.schedule", "fleetkeeper.services.context"},
            "discover": {"fleetkeeper.services.discovery", "fleetkeeper.services.context"},
            "drain-tasks": {"fleetkeeper.services.drains.steps"},
        },
        layer={
            "fleetkeeper.services.reconcile.schedule": {"fleetkeeper.services.reconcile.cycle"},
            "fleetkeeper.services.reconcile.cycle": {"fleetkeeper.services.drains"},
            "fleetkeeper.services.drains": {"fleetkeeper.services.drains.steps"},
            "fleetkeeper.services.discovery": {"fleetkeeper.store.workers"},
        },
    )

    # The drains package is the reconciler's too (its cycle imports it): only the module the drain
    # tasks' handler names is theirs. The context, which two handlers import, is no one's.
    assert owned == {
        "fleetkeeper.services.reconcile": "reconcile",
        "fleetkeeper.services.discovery": "discover",
        "fleetkeeper.services.drains.steps": "drain-tasks",
    }


def test_given_the_functions_handlers_then_their_own_code_is_derived_and_shared_code_is_nobodys() -> None:
    found = owners()

    assert found.of(str(PACKAGE / "services" / "reconcile" / "cycle.py")) == "reconcile"
    assert found.of(str(PACKAGE / "services" / "discovery.py")) == "discover"
    assert found.of(str(PACKAGE / "services" / "drains" / "steps.py")) == "drain-tasks"
    assert found.of(str(PACKAGE / "services" / "ec2_events.py")) == "ec2-events"
    assert found.of(str(PACKAGE / "api" / "routes" / "workers.py")) == "api"
    # What several functions run: the rest of the drains package (the reconciler sweeps drains, the api
    # starts them), the context every handler imports, the other services, the adapters.
    assert found.of(str(PACKAGE / "services" / "drains" / "sweep.py")) is None
    assert found.of(str(PACKAGE / "services" / "context.py")) is None
    assert found.of(str(PACKAGE / "services" / "workers.py")) is None
    assert found.of(str(PACKAGE / "store" / "workers.py")) is None


STOP = Authorization("ec2:StopInstances", "arn:aws:ec2:us-east-1:123456789012:instance/i-1")


def test_given_an_evaluator_error_then_the_summary_fails_naming_the_request() -> None:
    summary = Summary(recorders=1)
    summary.record(
        "drain-tasks",
        "ec2:StopInstances",
        Outcome(ERROR, error="EvaluatorError: the evaluator process exited with code 1"),
        path="services/drains/steps.py:finish -> cloud/ec2.py:Ec2Gateway.stop",
        during="tests/integration/test_x.py::test_y (call)",
    )

    assert summary.failed
    assert (
        "  EVALUATOR ERROR drain-tasks: ec2:StopInstances (from services/drains/steps.py:finish -> "
        "cloud/ec2.py:Ec2Gateway.stop, 1x): EvaluatorError: the evaluator process exited with code 1; "
        "first during tests/integration/test_x.py::test_y (call)"
    ) in summary.report()


def test_given_records_of_several_processes_then_the_merge_keeps_every_undecided_request() -> None:
    first, second = Summary(recorders=1), Summary(recorders=1)
    for summary in (first, second):
        summary.record(
            "reconcile", "ec2:TerminateInstances", Outcome(MISSING, error="x"), path="p", during=""
        )
    second.record("reconcile", "ec2:DescribeInstances", Outcome("set-up"), path="", during="")

    merged = Summary.from_json(first.to_json())
    merged.merge(Summary.from_json(second.to_json()))

    assert [entry["count"] for entry in merged.undecided.values()] == [2]
    assert (merged.recorders, merged.setup, merged.requests) == (2, 1, 0)


def finish(summary: Summary, monkeypatch: pytest.MonkeyPatch) -> tuple[int, list[str]]:
    """The plugin's end of a (non-xdist) session whose recorder kept `summary`: exit status, lines."""
    monkeypatch.setattr(iam_session, "RUN", summary)
    session = SimpleNamespace(config=SimpleNamespace(stash=pytest.Stash()), exitstatus=pytest.ExitCode.OK)
    iam_plugin.pytest_sessionfinish(cast(pytest.Session, session), 0)
    written: list[str] = []
    reporter = SimpleNamespace(section=lambda title: written.append(f"== {title}"), write_line=written.append)
    iam_plugin.pytest_terminal_summary(reporter, cast(pytest.Config, session.config))
    return int(cast(Any, session).exitstatus), written


def test_given_a_recorder_that_evaluated_nothing_then_the_run_fails_saying_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    status, written = finish(Summary(recorders=1, setup=40), monkeypatch)

    assert status == pytest.ExitCode.TESTS_FAILED
    assert written[1] == "IAM: 0 recorded requests evaluated for 0 functions, 0 denied"
    assert any(line.startswith("  NOTHING EVALUATED: 1 recorder(s) were on") for line in written)


def test_given_an_evaluator_error_then_the_run_fails_with_a_line_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    summary = Summary(recorders=1)
    allowed = Decision("Allowed", grants=("policy#statement",))
    summary.record("api", "dynamodb:GetItem", Outcome("allowed", ((STOP, allowed),)), path="p", during="")
    summary.record("drain-tasks", "ec2:StopInstances", Outcome(ERROR, error="boom"), path="p", during="")

    status, written = finish(summary, monkeypatch)

    assert status == pytest.ExitCode.TESTS_FAILED
    assert "  EVALUATOR ERROR drain-tasks: ec2:StopInstances (from p, 1x): boom" in written


def test_given_only_allowed_requests_then_the_run_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    summary = Summary(recorders=1)
    allowed = Decision("Allowed", grants=("policy#statement",))
    summary.record("api", "dynamodb:GetItem", Outcome("allowed", ((STOP, allowed),)), path="p", during="")

    status, written = finish(summary, monkeypatch)

    assert status == pytest.ExitCode.OK
    assert written[1] == "IAM: 1 recorded requests evaluated for 1 functions, 0 denied"


def test_given_a_denied_request_then_it_is_counted_once_with_its_denial() -> None:
    summary = Summary(recorders=1)
    denied = Decision("ImplicitlyDenied", denials=("no identity-based policy allows it",))

    summary.record("api", "ec2:StopInstances", Outcome(DENIED, ((STOP, denied),)), path="p", during="t")

    assert (summary.requests, summary.denied_requests, summary.failed) == (1, 1, True)
    (denial,) = summary.denials.values()
    assert (denial["function"], denial["action"], denial["during"]) == ("api", "ec2:StopInstances", "t")
