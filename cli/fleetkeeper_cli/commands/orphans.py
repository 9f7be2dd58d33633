"""`fleetkeeper orphans show`, `orphans held-back` and `orphans confirm`: orphan GC's circuit breaker."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetkeeper_cli.client import ApiClient
from fleetkeeper_cli.output import OutputOption, console, run, table

BREAKER_COLUMNS = ["region", "breaker", "held back", "share", "confirmed by", "confirmed until"]


def _held_count(breaker: dict[str, Any]) -> int:
    return int(breaker.get("held_back_count", len(breaker.get("held_back", []))))


def _breaker_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            b["region"],
            "holding" if b["holding"] else "closed",
            _held_count(b),
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
    for b in items:
        if b["holding"] and _held_count(b) > len(b.get("held_back", [])):
            console.print(
                f"{b['region']}: {_held_count(b)} held back (set {b.get('held_back_set')}); "
                f"list them with `fleetkeeper orphans held-back {b['region']}`"
            )


def show(ctx: typer.Context, output: OutputOption = None) -> None:
    """Each region's breaker: how many workers it holds back from orphan GC, and any confirmation."""
    run(ctx, output, lambda c: c.get("/api/v1/reconcile/orphans")["items"], _print_breakers)


def held_back(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="the region whose held-back workers are listed")],
    limit: Annotated[int, typer.Option(min=1, help="list at most this many (in order)")] = 1000,
    output: OutputOption = None,
) -> None:
    """The workers the breaker holds back in a region, page by page, and the set they form."""
    path = f"/api/v1/reconcile/orphans/{region}/held-back"

    def fetch(client: ApiClient) -> dict[str, Any]:
        first = client.get(path)
        ids: list[str] = list(first["items"])
        token = first.get("next_token")
        while token and len(ids) < limit:
            # The set named by the first page, or 409: pages of two different sets never mix.
            page = client.get(path, next_token=token, held_back_set=first["held_back_set"])
            ids.extend(page["items"])
            token = page.get("next_token")
        return {**first, "items": ids[:limit], "next_token": None}

    def render(found: dict[str, Any]) -> None:
        if not found["count"]:
            console.print(f"orphan GC holds nothing back in {region}")
            return
        for worker_id in found["items"]:
            console.print(worker_id, soft_wrap=True)
        shown = len(found["items"])
        console.print(
            f"{shown} of {found['count']} held back in {region}; set {found['held_back_set']} "
            f"(confirm it with `fleetkeeper orphans confirm {region} --set {found['held_back_set']}`)"
        )

    run(ctx, output, fetch, render)


def confirm(
    ctx: typer.Context,
    region: Annotated[str, typer.Argument(help="the region whose held-back workers are confirmed")],
    worker: Annotated[
        list[str] | None,
        typer.Option(
            "--worker", help="the held-back worker ids you checked (repeat); refused if they changed"
        ),
    ] = None,
    held_back_set: Annotated[
        str | None,
        typer.Option("--set", help="the held-back set you checked (`orphans show`); refused if it changed"),
    ] = None,
    output: OutputOption = None,
) -> None:
    """Confirm the workers the breaker holds back: the next discovery passes retire them."""
    body: dict[str, Any] = {"region": region}
    if worker:
        body["worker_ids"] = worker
    if held_back_set:
        body["held_back_set"] = held_back_set

    def render(breaker: dict[str, Any]) -> None:
        count = breaker.get("confirmed_count", len(breaker["confirmed_ids"]))
        console.print(
            f"{count} held-back workers in {breaker['region']} confirmed "
            f"until {breaker['confirmed_until']}; the next discovery passes retire them"
        )

    run(ctx, output, lambda c: c.post("/api/v1/reconcile/orphans/confirm", body), render)
