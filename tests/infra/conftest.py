"""One synthesis per test process: the dev and prod stages of cdk.json, plus a pinned variant.

Synthesis takes seconds, so every infra test reads the same cloud assembly. The "pinned" stage is dev
with an account, two worker regions, pinned network settings, a slower reconcile schedule, an alarm
e-mail, an instance profile of its own and tooling principals: the branches cdk.json's own stages leave
unexercised.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App
from aws_cdk.assertions import Template

from infra.app import add_stage
from infra.config import STAGE_KEY, STAGES_KEY, load_stage_config
from infra.stack import FleetkeeperStack

ROOT = Path(__file__).resolve().parents[2]
CDK_JSON = ROOT / "cdk.json"
STAGES = ("dev", "prod", "pinned")

PINNED_ACCOUNT = "123456789012"
PINNED_REGIONS = {
    "eu-west-1": {
        "subnet_id": "subnet-0a1b2c3d",
        "security_group_ids": ["sg-0a1b2c3d", "sg-4e5f6a7b"],
        "key_name": "fleet-key",
        "default_tags": {"team": "labs"},
    },
    "us-east-1": {"subnet_id": "subnet-9f8e7d6c", "security_group_ids": ["sg-9f8e7d6c"]},
}
# The principals GC and admin tooling sign with: a role under a path, and a user.
PINNED_TOOLING = [
    f"arn:aws:iam::{PINNED_ACCOUNT}:role/platform/fleetkeeper-gc",
    f"arn:aws:iam::{PINNED_ACCOUNT}:user/fleet-admin-tool",
]
PINNED_AGENT = f"arn:aws:iam::{PINNED_ACCOUNT}:role/labs-worker-agent"
# A profile the deployer manages, whose role sits under an IAM path.
PINNED_PROFILE = {"name": "labs-worker", "role": "platform/labs-worker-role"}


# prod requires pinned launch networking and cdk.json ships without it: the deployer names their own.
PROD_NETWORK = {"subnet_id": "subnet-0feedbeef", "security_group_ids": ["sg-0feedbeef"]}


def shipped_cdk_json_context() -> dict[str, Any]:
    """cdk.json's context exactly as checked in."""
    context: dict[str, Any] = json.loads(CDK_JSON.read_text(encoding="utf-8"))["context"]
    return context


def cdk_json_context() -> dict[str, Any]:
    """cdk.json's context as a deployer completes it: prod's worker regions with a subnet and groups."""
    context = shipped_cdk_json_context()
    for region in context[STAGES_KEY]["prod"]["regions"].values():
        region.update(PROD_NETWORK)
    return context


def context_with_pinned_stage() -> dict[str, Any]:
    """cdk.json's context with the pinned stage added."""
    context = cdk_json_context()
    pinned = copy.deepcopy(context[STAGES_KEY]["dev"])
    pinned.update(
        account=PINNED_ACCOUNT,
        regions=PINNED_REGIONS,
        alarm_email="fleet-ops@example.com",
        schedules={"reconcile_rate_minutes": 2, "discovery_rate_minutes": 10, "reconcile_shards": 3},
        rebalance={"enabled": True, "drain_timeout_seconds": 900},
        worker_instance_profile=PINNED_PROFILE,
    )
    pinned["api"] = {
        **pinned["api"],
        "manage_account_logging_role": False,
        "tooling_principals": PINNED_TOOLING,
        "worker_agent_principals": [PINNED_AGENT],
    }
    context[STAGES_KEY] = {**context[STAGES_KEY], "pinned": pinned}
    return context


@dataclass
class Synthesized:
    stacks: dict[str, FleetkeeperStack]
    outdir: Path
    validation_error: str | None
    _templates: dict[str, Template] = field(default_factory=dict)

    def template(self, stage: str) -> Template:
        if stage not in self._templates:
            self._templates[stage] = Template.from_stack(self.stacks[stage])
        return self._templates[stage]

    def template_file(self, stage: str) -> Path:
        return self.outdir / f"{self.stacks[stage].artifact_id}.template.json"

    def validation_report(self) -> dict[str, Any]:
        path = self.outdir / "validation-report.json"
        report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
        return report


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> Synthesized:
    outdir = tmp_path_factory.mktemp("cdk.out")
    context = context_with_pinned_stage()
    app = App(context=context, outdir=str(outdir))
    stacks = {stage: add_stage(app, load_stage_config({**context, STAGE_KEY: stage}.get)) for stage in STAGES}
    try:
        app.synth()
        error = None
    except RuntimeError as exc:  # cdk-nag findings fail the synthesis; test_nag reports them
        error = str(exc)
    return Synthesized(stacks=stacks, outdir=outdir, validation_error=error)


@pytest.fixture(scope="session")
def dev(synthesized: Synthesized) -> Template:
    return synthesized.template("dev")


@pytest.fixture(scope="session")
def prod(synthesized: Synthesized) -> Template:
    return synthesized.template("prod")


@pytest.fixture(scope="session")
def pinned(synthesized: Synthesized) -> Template:
    return synthesized.template("pinned")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Keep the infra tests on one xdist worker (with --dist loadgroup), so only one process synthesizes."""
    for item in items:
        if item.path.is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.xdist_group("cdk-synth"))
