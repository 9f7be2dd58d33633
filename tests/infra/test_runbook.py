"""Every alarm the stack creates has a runbook entry: what it means, how to confirm it and resolve it."""

from __future__ import annotations

import re
from pathlib import Path

from aws_cdk.assertions import Template

from fleetkeeper.domain.errors import FleetkeeperError

RUNBOOK = Path(__file__).resolve().parents[2] / "docs" / "runbook.md"
HEADING = re.compile(r"^### `([a-z0-9-]+)`\s*$", re.MULTILINE)


def runbook_entries() -> dict[str, str]:
    """Each `### \\`name\\`` section of the runbook, by name."""
    text = RUNBOOK.read_text(encoding="utf-8")
    matches = list(HEADING.finditer(text))
    entries: dict[str, str] = {}
    for match, following in zip(matches, [*matches[1:], None], strict=True):
        end = following.start() if following else len(text)
        entries[match.group(1)] = text[match.end() : end]
    return entries


def alarm_slugs(template: Template, stage: str) -> set[str]:
    prefix = f"fleetkeeper-{stage}-"
    names = [
        str(a["Properties"]["AlarmName"]) for a in template.find_resources("AWS::CloudWatch::Alarm").values()
    ]
    assert all(name.startswith(prefix) for name in names)
    return {name.removeprefix(prefix) for name in names}


def test_given_the_synthesized_stacks_then_every_alarm_has_a_runbook_entry(dev, prod):
    entries = runbook_entries()
    for stage, template in (("dev", dev), ("prod", prod)):
        alarms = alarm_slugs(template, stage)
        assert alarms, "the stack creates alarms"
        assert sorted(alarms - set(entries)) == [], f"alarms of {stage} without a runbook entry"


def test_given_a_runbook_entry_of_an_alarm_then_it_says_what_it_means_and_how_to_confirm_and_resolve(dev):
    entries = runbook_entries()
    for slug in alarm_slugs(dev, "dev"):
        entry = entries[slug]
        assert "**Means.**" in entry, slug
        steps = "**Confirm / resolve.**" in entry or ("**Confirm.**" in entry and "**Resolve.**" in entry)
        assert steps, f"{slug}: no confirm and resolve steps"


# ---- the runbook's names, codes and statuses are the code's --------------------------------------------

README = RUNBOOK.parents[1] / "README.md"
LAYER = RUNBOOK.parents[1] / "layers" / "fleetkeeper" / "python" / "fleetkeeper"
# Where the runbook names a function: the logs helper, --function-name, the Errors metric's dimension.
FUNCTION_MENTIONS = (
    re.compile(r"\$\(logs ([a-z][a-z0-9_-]*)\)"),
    re.compile(r"--function-name \"?fleetkeeper-\$STAGE-([a-z][a-z0-9_-]*)"),
    re.compile(r"FunctionName,Value=fleetkeeper-\$STAGE-([a-z][a-z0-9_-]*)"),
)
# The functions a runbook variable or helper stands for, listed in the comment beside it.
FUNCTION_LISTS = (
    re.compile(r"^logs\(\) \{ .*# the log group of one function: (.+)$", re.MULTILINE),
    re.compile(r"^FN=([a-z0-9_-]+) +# or (.+)$", re.MULTILINE),
)
# An error code beside its HTTP status: "503 `WORKFLOW_UNAVAILABLE`", "`NO_CAPACITY` (409)", "`X` 503s".
STATUS_THEN_CODE = re.compile(r"\b([1-5]\d\d) `([A-Z][A-Z_]+)`")
CODE_THEN_STATUS = re.compile(r"`([A-Z][A-Z_]+)` \(?([1-5]\d\d)s?\b")
# A row of an error table: "| 409 | `ILLEGAL_TRANSITION`, `CONFLICT` | when |".
TABLE_ROW = re.compile(r"^\| ([1-5]\d\d) \| ([^|]+) \|", re.MULTILINE)
# The body of an exception no handler expects (api/errors.py); every other code is an error class's.
UNHANDLED = {"INTERNAL": 500}


def function_slugs(template: Template, stage: str) -> set[str]:
    prefix = f"fleetkeeper-{stage}-"
    names = [
        f["Properties"].get("FunctionName") for f in template.find_resources("AWS::Lambda::Function").values()
    ]
    return {n.removeprefix(prefix) for n in names if isinstance(n, str) and n.startswith(prefix)}


def runbook_functions(text: str) -> tuple[set[str], set[str]]:
    """(every function the runbook names, the functions the `logs` helper's comment lists)."""
    named = {m.group(1) for pattern in FUNCTION_MENTIONS for m in pattern.finditer(text)}
    listed: set[str] = set()
    for index, pattern in enumerate(FUNCTION_LISTS):
        for match in pattern.finditer(text):
            names = {n.strip() for group in match.groups() for n in group.split(",")}
            named |= names
            if index == 0:
                listed |= names
    return named, listed


def _subclasses(kind: type[FleetkeeperError]) -> list[type[FleetkeeperError]]:
    return [sub for child in kind.__subclasses__() for sub in (child, *_subclasses(child))]


def error_statuses() -> dict[str, int]:
    """Every error code the API answers with, and its HTTP status, from the error classes."""
    from fleetkeeper.api import app  # noqa: F401 - loads every module that defines an error class
    from fleetkeeper.api.errors import status_of

    statuses = dict(UNHANDLED)
    for kind in _subclasses(FleetkeeperError):
        status = int(status_of(kind.__new__(kind)))
        assert statuses.setdefault(kind.code, status) == status, f"{kind.code} has two statuses"
    return statuses


def code_mentions(text: str) -> list[tuple[str, int]]:
    pairs = [(m.group(2), int(m.group(1))) for m in STATUS_THEN_CODE.finditer(text)]
    pairs += [(m.group(1), int(m.group(2))) for m in CODE_THEN_STATUS.finditer(text)]
    for row in TABLE_ROW.finditer(text):
        pairs += [(code, int(row.group(1))) for code in re.findall(r"`([A-Z][A-Z_]+)`", row.group(2))]
    return pairs


def test_given_the_runbook_then_every_function_it_names_is_a_function_of_the_stack(dev):
    text = RUNBOOK.read_text(encoding="utf-8")
    functions = function_slugs(dev, "dev")
    named, listed = runbook_functions(text)

    assert sorted(named - functions) == [], f"the stack's functions are {sorted(functions)}"
    assert listed == functions, "the logs helper's comment lists every function"
    # The helper and the metric's dimension take the names as they are, with nothing rewritten.
    assert '--function-name "fleetkeeper-$STAGE-$1"' in text
    assert "Value=fleetkeeper-$STAGE-$FN " in text


def test_given_the_runbook_and_the_readme_then_each_error_code_has_the_status_the_api_answers():
    statuses = error_statuses()
    for document in (RUNBOOK, README):
        mentions = code_mentions(document.read_text(encoding="utf-8"))
        assert mentions, document.name
        wrong = [(code, status) for code, status in mentions if statuses.get(code) != status]
        assert wrong == [], f"{document.name}: the API answers {[(c, statuses.get(c)) for c, _ in wrong]}"


def test_given_the_api_5xx_alarm_then_its_entry_describes_every_5xx_the_api_answers():
    from fleetkeeper.api.errors import STATUS_FOR_ERROR

    server_side = {kind.code: int(status) for kind, status in STATUS_FOR_ERROR.items() if status >= 500}
    entry = runbook_entries()["api-5xx-rate"]

    assert set(code_mentions(entry)) >= {*server_side.items(), *UNHANDLED.items()}


def test_given_the_runbook_then_its_statuses_outcomes_and_actions_exist():
    from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
    from fleetkeeper.domain.models import DrainOutcome

    text = RUNBOOK.read_text(encoding="utf-8")
    outcomes = set(re.findall(r'\.drain\.outcome == "([A-Z_]+)"', text))
    worker_statuses = set(re.findall(r"fk workers[^\n]*--status ([A-Z_]+)", text))
    instance_states = set(re.findall(r"fk instances[^\n]*--state ([A-Z_]+)", text))
    actions = set(re.findall(r'\.action == "([A-Za-z]+)"', text))
    source = "\n".join(path.read_text(encoding="utf-8") for path in LAYER.rglob("*.py"))

    assert outcomes
    assert outcomes <= {o.value for o in DrainOutcome}
    assert worker_statuses
    assert worker_statuses <= {s.value for s in WorkerStatus}
    assert instance_states
    assert instance_states <= {s.value for s in InstanceState}
    assert actions
    assert all(f'"{action}"' in source for action in actions), actions
