"""`python -m fleetkeeper_local.iam.synth --out FILE`: the dev stage's template, homed on the local stack.

The dev stage of cdk.json, synthesized by the real CDK app with two settings moved to where the local
stack runs: its home region is the local region, and its worker regions are the regions the local stack
and the tests use, each with dev's own region settings (subnet, security groups, key, default tags).
Everything else (the grants, their conditions, the catalogue) is dev's. It runs in its own process, so
the test processes never host the CDK's node runtime; policies.py caches its output.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import tempfile
from pathlib import Path
from typing import Any
from unittest import mock

from aws_cdk import App
from aws_cdk.assertions import Template

import infra.functions
from fleetkeeper_local.iam.stage import LOCAL_HOME_REGION, LOCAL_WORKER_REGIONS, STAGE
from infra.app import add_stage
from infra.config import STAGE_KEY, STAGES_KEY, load_stage_config


def local_stage_context(context: dict[str, Any]) -> dict[str, Any]:
    """cdk.json's context with the dev stage homed on the local region and serving the local regions."""
    context = copy.deepcopy(context)
    stage = context[STAGES_KEY][STAGE]
    regions = stage["regions"]
    settings: dict[str, Any] = regions.get(stage["region"]) or next(iter(regions.values()), {})
    stage["region"] = LOCAL_HOME_REGION
    stage["regions"] = {region: copy.deepcopy(settings) for region in LOCAL_WORKER_REGIONS}
    return context


def synthesize(root: Path, out: Path) -> None:
    """Synthesize the local dev stage and write its main template to `out`."""
    context = local_stage_context(json.loads((root / "cdk.json").read_text(encoding="utf-8"))["context"])
    with (
        tempfile.TemporaryDirectory(prefix="fleetkeeper-iam-synth-") as outdir,
        tempfile.TemporaryDirectory(prefix="fleetkeeper-iam-layer-") as layer,
        # The layers' contents change only their assets' hashes, which no policy names: an empty folder
        # stands in for each rather than a build of them (most of a synthesis on a fresh clone).
        mock.patch.multiple(
            infra.functions, layer_dir=lambda: Path(layer), shared_layer_dir=lambda: Path(layer)
        ),
    ):
        app = App(context=context, outdir=outdir)
        stack = add_stage(app, load_stage_config({**context, STAGE_KEY: STAGE}.get))
        # cdk-nag findings fail the synthesis; tests/infra/test_nag.py reports them, the policies are written.
        with contextlib.suppress(RuntimeError):
            app.synth()
        written = Path(outdir) / f"{stack.artifact_id}.template.json"
        template = (
            json.loads(written.read_text(encoding="utf-8"))
            if written.exists()
            else Template.from_stack(stack).to_json()
        )
    out.write_text(json.dumps(template, indent=1, sort_keys=True), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    synthesize(Path.cwd(), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
