"""`fleetkeeper apply` and `templates`: the declared fleet (templates and pools) and its templates."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from fleetkeeper_cli import fleetfile
from fleetkeeper_cli.client import CliError
from fleetkeeper_cli.output import OutputOption, console, fail, json_mode, print_json, run, settings, table

TEMPLATE_COLUMNS = [
    "name",
    "instance type",
    "AMI filter",
    "capacity",
    "drain timeout (h)",
    "max lifetime (h)",
    "auto rollout",
    "version",
]


def _print_plan(changes: list[fleetfile.Change]) -> None:
    symbols = {"create": "[green]+[/green]", "update": "[yellow]~[/yellow]", "unchanged": "[dim]=[/dim]"}
    for change in changes:
        console.print(f"{symbols[change.action]} {change.kind} {change.name}: {change.action}")
        for name, (old, new) in change.fields.items():
            before = "" if change.action == "create" else f"{old!r} -> "
            console.print(f"    {name}: {before}{new!r}", markup=False, highlight=False, soft_wrap=True)


def apply(
    ctx: typer.Context,
    file: Annotated[Path, typer.Option("--file", "-f", help="fleet file (YAML): templates and pools")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the diff only")] = False,
    output: OutputOption = None,
) -> None:
    """Declare templates and pools from a YAML file: show the diff, then apply it (idempotent)."""
    as_json = json_mode(ctx, output)
    try:
        fleet = fleetfile.load(file)
        client = settings(ctx).client()
        changes = fleetfile.plan(client, fleet)
        pending = [c for c in changes if c.action != "unchanged"]
        if pending and not dry_run:
            fleetfile.apply(client, pending)
    except CliError as error:
        fail(error)
    if as_json:
        print_json({"applied": bool(pending) and not dry_run, "changes": [c.as_dict() for c in changes]})
        return
    _print_plan(changes)
    if not pending:
        console.print("nothing to change")
    elif dry_run:
        console.print(f"{len(pending)} change(s) not applied (--dry-run)")
    else:
        console.print(f"applied {len(pending)} change(s)")


def templates(ctx: typer.Context, output: OutputOption = None) -> None:
    """List worker templates."""

    def render(items: list[dict[str, Any]]) -> None:
        rows = [
            [
                t["name"],
                t["instance_type"],
                t["ami_name_filter"],
                t["capacity"],
                t["drain_timeout_hours"],
                t.get("max_lifetime_hours") or "-",
                "yes" if t.get("auto_rollout") else "no",
                t["version"],
            ]
            for t in items
        ]
        console.print(table(None, TEMPLATE_COLUMNS, rows, keep={"name"}))

    run(ctx, output, lambda c: c.get("/api/v1/templates")["items"], render)
