"""The `fleetkeeper` command: its global options, and every command, registered here under its name
from the module of its group (fleetkeeper_cli/commands/<group>.py).

Exit codes: 0 ok, 1 the drain failed or timed out, or the rollout followed with --wait failed or was
cancelled (or the API failed), 2 usage, 3 not found or conflict, 4 authentication or authorization.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from fleetkeeper_cli.client import API_ENV, LOCAL_API, LOCAL_PORT_ENV, CliError
from fleetkeeper_cli.commands import (
    apply,
    audit,
    drains,
    instances,
    operations,
    orphans,
    pools,
    rollouts,
    workers,
)
from fleetkeeper_cli.output import Output, Settings, print_error

app = typer.Typer(
    name="fleetkeeper",
    help=(
        "Operate a fleetkeeper fleet: workers, drains, pools, instances, templates, rollouts and the audit "
        "trail. "
        f"It talks to the local control plane ({LOCAL_API}, or the port in ${LOCAL_PORT_ENV} as `make run` "
        f"does) unless --api, --stack or ${API_ENV} says otherwise; calls to a deployed stage are "
        "SigV4-signed with your AWS credentials."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # Plain help: typer's rich help imports markdown and traceback renderers, most of a `--help`.
    rich_markup_mode=None,
)


def _group(name: str, help_text: str) -> typer.Typer:
    group = typer.Typer(help=help_text, no_args_is_help=True, rich_markup_mode=None)
    app.add_typer(group, name=name)
    return group


# workers.py
app.command("workers")(workers.list_workers)
worker_app = _group("worker", "One worker: `show`. List them with `fleetkeeper workers`.")
worker_app.command("show")(workers.show)
app.command("stats")(workers.stats)
# drains.py
app.command("drain")(drains.drain)
app.command("drain-status")(drains.drain_status)
app.command("cancel-drain")(drains.cancel_drain)
# pools.py
app.command("pools")(pools.list_pools)
pool_app = _group(
    "pool", "One pool: `drain`, `cancel-drain`, `disruption`, `capacity`. List them with `fleetkeeper pools`."
)
pool_app.command("drain")(pools.drain)
pool_app.command("cancel-drain")(pools.cancel_drain)
pool_app.command("disruption")(pools.disruption)
pool_app.command("capacity")(pools.capacity)
# instances.py
app.command("instances")(instances.list_instances)
app.command("place")(instances.place)
app.command("complete")(instances.complete)
instance_app = _group("instance", "One workload instance: `state`. List them with `fleetkeeper instances`.")
instance_app.command("state")(instances.report_state)
# operations.py
app.command("operations")(operations.list_operations)
operation_app = _group(
    "operation", "Worker operations run on the machine through SSM (the stage's catalogue): `run`."
)
operation_app.command("run")(operations.run_operation)
# orphans.py
orphans_app = _group(
    "orphans", "Orphan GC's circuit breaker: `show` it, list the `held-back` workers, `confirm` them."
)
orphans_app.command("show")(orphans.show)
orphans_app.command("held-back")(orphans.held_back)
orphans_app.command("confirm")(orphans.confirm)
# rollouts.py
app.command("rollouts")(rollouts.list_rollouts)
rollout_app = _group(
    "rollout",
    "Replace a template's workers wave by wave: `start`, `status`, `pause`, `resume`, `cancel`, `rollback`. "
    "List them with `fleetkeeper rollouts`.",
)
rollout_app.command("start")(rollouts.start)
rollout_app.command("status")(rollouts.status)
rollout_app.command("pause")(rollouts.pause)
rollout_app.command("resume")(rollouts.resume)
rollout_app.command("cancel")(rollouts.cancel)
rollout_app.command("rollback")(rollouts.rollback)
# audit.py
app.command("audit")(audit.audit)
# apply.py
app.command("apply")(apply.apply)
app.command("templates")(apply.templates)


@app.callback()
def main_options(
    ctx: typer.Context,
    api: Annotated[str | None, typer.Option("--api", help=f"admin API base URL (or ${API_ENV})")] = None,
    stack: Annotated[
        str | None,
        typer.Option("--stack", help="read the API URL from this CloudFormation stack's ApiUrl output"),
    ] = None,
    region: Annotated[
        str | None, typer.Option("--region", help="AWS region of --stack and of the signature")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", help="AWS profile for --stack and signing")
    ] = None,
    output: Annotated[Output, typer.Option("--output", "-o", help="table or json")] = Output.TABLE,
) -> None:
    """The target API and the output format, for every command."""
    ctx.obj = Settings(api=api, stack=stack, region=region, profile=profile, output=output)


def main() -> None:
    """The console script. Errors that escape a command still end with one line and an exit code."""
    try:
        app()
    except CliError as error:
        print_error(error.message)
        sys.exit(int(error.exit_code))
