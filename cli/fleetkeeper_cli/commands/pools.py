"""`fleetkeeper pools`, `pool drain` and `pool cancel-drain`: pools and their drains."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from fleetkeeper_cli.output import TIMEOUT_FORMS, OutputOption, console, run, seconds, table

# The API's deadline for a pool drain sent without timeout_seconds (docs/drains.md).
POOL_DRAIN_DEFAULT_SECONDS = 300


class PoolThen(StrEnum):
    NONE = "none"
    STOP = "stop"
    TERMINATE = "terminate"


PoolTimeoutOption = Annotated[
    str | None,
    typer.Option(
        "--timeout",
        help=f"drain deadline from now: {TIMEOUT_FORMS}; default: {POOL_DRAIN_DEFAULT_SECONDS} s",
    ),
]
POOL_COLUMNS = ["name", "status", "description", "drain", "drain started"]


def _pool_rows(pools: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [p["name"], p["status"], p.get("description"), p.get("drain_outcome"), p.get("drain_started_at")]
        for p in pools
    ]


def _print_pool(pool: dict[str, Any]) -> None:
    console.print(f"pool {pool['name']} {pool['status']}: drain {pool.get('drain_outcome')}")


def list_pools(ctx: typer.Context, output: OutputOption = None) -> None:
    """List pools and their drains."""
    run(
        ctx,
        output,
        lambda c: c.get("/api/v1/pools")["items"],
        lambda items: console.print(table(None, POOL_COLUMNS, _pool_rows(items), keep={"name"})),
    )


def drain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="pool name")],
    timeout: PoolTimeoutOption = None,
    then: Annotated[
        PoolThen, typer.Option("--then", help="what happens to the pool's workers once empty")
    ] = PoolThen.NONE,
    output: OutputOption = None,
) -> None:
    """Drain every worker of a pool."""
    body: dict[str, Any] = {"then": then.value}
    timeout_seconds = seconds(timeout)
    if timeout_seconds is not None:
        body["timeout_seconds"] = timeout_seconds
    run(ctx, output, lambda c: c.post(f"/api/v1/pools/{name}/drain", body), _print_pool)


def cancel_drain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="pool name")],
    reason: Annotated[str | None, typer.Option(help="why the drain is cancelled")] = None,
    output: OutputOption = None,
) -> None:
    """Cancel a pool's drain."""
    body = {"reason": reason} if reason else None
    run(ctx, output, lambda c: c.post(f"/api/v1/pools/{name}/cancel-drain", body), _print_pool)
