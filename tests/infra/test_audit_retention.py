"""Every function writes audit items and finished operations with the stage's retentions (the table's TTL)."""

from __future__ import annotations

import pytest
from aws_cdk.assertions import Template

from tests.infra.helpers import function_properties
from tests.infra.test_functions import FUNCTIONS, name


@pytest.mark.parametrize(("stage", "days"), [("dev", "30"), ("prod", "400")])
def test_given_a_stage_then_every_function_keeps_audit_items_for_its_retention(synthesized, stage, days):
    template: Template = synthesized.template(stage)
    for function in FUNCTIONS:
        env = function_properties(template, name(stage, function))["Environment"]["Variables"]
        assert env["AUDIT_RETENTION_DAYS"] == days


@pytest.mark.parametrize(("stage", "days"), [("dev", "14"), ("prod", "90")])
def test_given_a_stage_then_every_function_keeps_finished_operations_for_their_retention(
    synthesized, stage, days
):
    template: Template = synthesized.template(stage)
    for function in FUNCTIONS:
        env = function_properties(template, name(stage, function))["Environment"]["Variables"]
        assert env["OPERATION_RETENTION_DAYS"] == days
