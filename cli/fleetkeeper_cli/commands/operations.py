"""`fleetkeeper operations` and `operation run`: operations run on a worker's machine through SSM."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetkeeper_cli.output import OutputOption, console, run, table, when

OPERATION_COLUMNS = ["id", "name", "status", "attempts", "requested by", "created (UTC)", "error / output"]


def _operation_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            o["id"],
            o["name"],
            o["status"],
            f"{o['attempts']}/{o['max_attempts']}",
            o["requested_by"],
            when(o["created_at"]),
            (o.get("error") or o.get("output") or "")[-120:],
        ]
        for o in items
    ]


def _parameters(pairs: list[str]) -> dict[str, str]:
    parameters: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"'{pair}' is not KEY=VALUE", param_hint="--param")
        parameters[key] = value
    return parameters


def list_operations(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="the worker")],
    output: OutputOption = None,
) -> None:
    """A worker's operations, newest first: status, attempts, and the end of their output."""
    run(
        ctx,
        output,
        lambda c: c.pages(f"/api/v1/workers/{worker_id}/operations", limit=100),
        lambda items: console.print(
            table(f"operations of {worker_id}", OPERATION_COLUMNS, _operation_rows(items), keep={"id"})
        ),
    )


def run_operation(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="the worker (RUNNING; DRAINING for cleanup operations)")],
    name: Annotated[str, typer.Argument(help="an operation of the stage's catalogue, e.g. register-license")],
    param: Annotated[
        list[str] | None,
        typer.Option("--param", "-p", help="KEY=VALUE, repeatable; never a secret (name its parameter)"),
    ] = None,
    output: OutputOption = None,
) -> None:
    """Ask for an operation on the worker's machine; the reconciler runs it (see `fleetkeeper operations`)."""
    body = {"name": name, "parameters": _parameters(param or [])}
    run(
        ctx,
        output,
        lambda c: c.post(f"/api/v1/workers/{worker_id}/operations", body),
        lambda o: console.print(f"operation {o['id']} ({o['name']}) {o['status']} on worker {worker_id}"),
    )
