"""Every alarm the stack creates has a runbook entry: what it means, how to confirm it and resolve it."""

from __future__ import annotations

import re
from pathlib import Path

from aws_cdk.assertions import Template

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
