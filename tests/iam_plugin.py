"""The IAM verdict of a test run: every recorded request allowed, every function covered.

The local stack fixture turns the recorder on (fleetkeeper_local.iam); each test process keeps its
record, xdist workers hand theirs to the controller, and the session ends with

    IAM: N recorded requests evaluated for M functions, D denied

failing the run on any denied request, on any request no decision was reached for (unattributed,
unmodelled, on a missing resource, an evaluator error), and when the recorder was on but evaluated
nothing. A run of the whole integration and e2e suites must also cover all five functions and find
docs/security.md current (`make security-doc` rewrites it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import pytest

from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.iam.policies import load_model, template_path
from fleetkeeper_local.iam.record import Summary
from fleetkeeper_local.iam.security_doc import comparable, render

ROOT: Final = Path(__file__).resolve().parents[1]
SUITES: Final = ("integration", "e2e")
SECURITY_DOC: Final = ROOT / "docs" / "security.md"
_OUTPUT: Final = "fleetkeeper_iam"
_COMPLETE = pytest.StashKey[bool]()
_VERDICT = pytest.StashKey[list[str]]()
# What the xdist workers handed over as they finished (the controller's own list).
_received: list[dict[str, Any]] = []


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--iam-write-doc",
        action="store_true",
        help="rewrite docs/security.md from the request record (of a run of the integration and e2e suites)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Synthesize the policies' template before any test runs (the controller does it before the
    workers start): the processes the tests start (`make run`, API instances) then find it cached
    instead of spending their start-up deadline on it."""
    config = session.config
    if _is_worker(config) or iam_session.mode() == "off":
        return
    paths = [Path(arg.split("::", 1)[0]).resolve() for arg in config.args] or [ROOT / "tests"]
    if all(path.is_relative_to(ROOT / "tests" / "unit") for path in paths):
        return
    template_path()


def _suite_files() -> set[Path]:
    return {path for suite in SUITES for path in (ROOT / "tests" / suite).rglob("test_*.py")}


def pytest_collection_finish(session: pytest.Session) -> None:
    """Whether this run holds every integration and e2e test module (only then is coverage required)."""
    selected = {Path(str(item.path)) for item in session.items}
    session.config.stash[_COMPLETE] = _suite_files() <= selected


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    output = getattr(node, "workeroutput", {}).get(_OUTPUT)
    if output is not None:
        _received.append(output)


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    complete = config.stash.get(_COMPLETE, False)
    if _is_worker(config):
        config.workeroutput[_OUTPUT] = {"summary": iam_session.RUN.to_json(), "complete": complete}  # type: ignore[attr-defined]
        return
    summary = Summary()
    summary.merge(iam_session.RUN)
    for output in _received:
        summary.merge(Summary.from_json(output["summary"]))
        complete = complete or bool(output["complete"])
    if not summary.recorders and not complete:
        return  # no test of this run used the local stack
    lines, failed = summary.report(), summary.failed
    if complete:
        # The whole record, for reading the denials and the grants' callers after the run.
        summary.write(ROOT / "build" / "iam" / "record.json")
        if summary.uncovered:
            lines.append(f"  NOT COVERED: no recorded request of {', '.join(summary.uncovered)}")
            failed = True
        doc_lines = _check_doc(summary, write=bool(config.getoption("--iam-write-doc")))
        lines += doc_lines
        failed = failed or any(line.lstrip().startswith("STALE") for line in doc_lines)
    config.stash[_VERDICT] = lines
    if failed and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _check_doc(summary: Summary, *, write: bool) -> list[str]:
    text = render(load_model(), summary)
    if write:
        SECURITY_DOC.write_text(text, encoding="utf-8")
        return [f"  wrote {SECURITY_DOC.relative_to(ROOT)}"]
    current = SECURITY_DOC.read_text(encoding="utf-8") if SECURITY_DOC.exists() else ""
    if comparable(current) != comparable(text):
        return ["  STALE docs/security.md does not match this run's request record: run `make security-doc`"]
    return []


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash.get(_VERDICT, [])
    if lines:
        terminalreporter.section("IAM evaluation")
        for line in lines:
            terminalreporter.write_line(line)
