"""CDK entry point: `cdk synth|deploy -c stage=<dev|prod>` builds that stage's stack.

Everything comes from the CDK context (cdk.json plus `-c`): no AWS call, no git call at synth.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from infra.config import ConfigError, StageConfig, load_stage_config
from infra.forwarding import EventForwardingStack, forwarded_regions
from infra.stack import FleetkeeperStack


def add_stage(app: App, config: StageConfig) -> FleetkeeperStack:
    """The stage's stack and one event forwarder per other worker region, all checked by cdk-nag.

    `cdk deploy --all -c stage=<name>` deploys them together; the forwarders are found on the main
    stack's `forwarders`, by region.
    """
    stack = FleetkeeperStack(app, config=config)
    stack.forwarders = {
        region: EventForwardingStack(app, config=config, region=region)
        for region in forwarded_regions(config)
    }
    for checked in (stack, *stack.forwarders.values()):
        Validations.of(checked).add_plugins(AwsSolutionsChecks())
    return stack


def build_app(context: Mapping[str, Any] | None = None, outdir: str | None = None) -> App:
    """The app holding the stack of the stage selected with `-c stage=...`."""
    app = App(context=dict(context) if context is not None else None, outdir=outdir)
    add_stage(app, load_stage_config(app.node.try_get_context))
    return app


def main() -> int:
    app = App()
    try:
        config = load_stage_config(app.node.try_get_context)
    except ConfigError as exc:
        print(f"fleetkeeper: {exc}", file=sys.stderr)
        return 2
    # Not a cdk-nag finding or a construct warning: a choice of the stage that whoever synthesizes or
    # deploys it should read every time.
    for note in config.unpinned_network_notes():
        print(f"fleetkeeper: NOTE {note}", file=sys.stderr)
    add_stage(app, config)
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
