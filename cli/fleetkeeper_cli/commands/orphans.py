"""`fleetkeeper orphans show` and `orphans confirm`: orphan GC's circuit breaker."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetkeeper_cli.output import OutputOption, console, run, table

BREAKER_COLUMNS = ["region", "breaker", "held back", "share", "confirmed by", "confirmed until"]


def _breaker_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            b["region"],
            "holding" if b["holding"] else "closed",
            len(b["held_back"]),
            f"{b['share_percent']}%",
            b.get("confirmed_by"),
            b.get("confirmed_until"),
        ]
        for b in items
    ]


def _print_breakers(items: list[dict[str, Any]]) -> None:
    if not items:
        # Discovery records a region's breaker the first time it trips.
        console.print("no region's breaker ever tripped: orphan GC holds nothing back")
        return
    console.print(table(None, BREAKER_COLUMNS, _breaker_rows(items), keep={"region"}))
    if not any(b["holding"] for b in items):
        console.print("orphan GC holds nothing back in any region")


def show(ctx: typer.Context, output: OutputOption = None) -> None:
    """Each region's breaker: the workers it holds back from orphan GC, and any confirmation."""
    run(ctx, output, lambda c: c.get("/api/v1/reconcile/orphans")["items"], _print_breakers)


def confirm(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="the region whose held-back workers are confirmed")],
    worker: Annotated[
        list[str] | None,
        typer.Option(
            "--worker", help="the held-back worker ids you checked (repeat); refused if they changed"
        ),
    ] = None,
    output: OutputOption = None,
) -> None:
    """Confirm the workers the breaker holds back: the next discovery pass retires them."""
    body: dict[str, Any] = {"region": region}
    if worker:
        body["worker_ids"] = worker

    def render(breaker: dict[str, Any]) -> None:
        console.print(
            f"{len(breaker['confirmed_ids'])} held-back workers in {breaker['region']} confirmed "
            f"until {breaker['confirmed_until']}; the next discovery pass retires them"
        )

    run(ctx, output, lambda c: c.post("/api/v1/reconcile/orphans/confirm", body), render)
