"""cfn-lint finds no errors in the synthesized templates."""

from __future__ import annotations

import pytest
from cfnlint.api import ManualArgs, lint_file

# CDK declares DependsOn on a function's role although the GetAtt already orders them: redundant, harmless.
IGNORED_CHECKS = ["W3005"]


@pytest.mark.parametrize("stage", ["dev", "prod", "pinned"])
def test_given_a_synthesized_template_then_cfn_lint_reports_nothing(synthesized, stage):
    region = synthesized.stacks[stage].region
    matches = lint_file(
        synthesized.template_file(stage), config=ManualArgs(regions=[region], ignore_checks=IGNORED_CHECKS)
    )
    errors = [f"{m.rule.id} {m.message} ({m.path})" for m in matches if m.rule.severity == "error"]
    assert errors == []
    assert [f"{m.rule.id} {m.message}" for m in matches] == []
