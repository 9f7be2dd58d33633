"""`fleetkeeper audit`: who did what to a worker, a pool or a rollout."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetkeeper_cli.client import ApiClient
from fleetkeeper_cli.output import OutputOption, console, run, table, when

AUDIT_COLUMNS = ["when (UTC)", "who", "what", "from", "to", "why"]


def audit(
    ctx: typer.Context,
    target: Annotated[
        str, typer.Argument(help="worker id (or pool name with --pool, rollout id with --rollout)")
    ],
    pool: Annotated[bool, typer.Option("--pool", help="TARGET is a pool")] = False,
    rollout: Annotated[bool, typer.Option("--rollout", help="TARGET is a rollout")] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="newest events to show")] = 50,
    output: OutputOption = None,
) -> None:
    """Who did what to a worker, pool or rollout, from which status to which, why and when (newest first)."""
    if pool and rollout:
        raise typer.BadParameter("give --pool or --rollout, not both", param_hint="--pool/--rollout")
    kind = "pools" if pool else "rollouts" if rollout else "workers"
    path = f"/api/v1/{kind}/{target}/events"

    def fetch(client: ApiClient) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        token: str | None = None
        while len(events) < limit:
            page = client.get(path, limit=min(100, limit - len(events)), next_token=token)
            events.extend(page["items"])
            token = page.get("next_token")
            if not token:
                break
        return events

    def render(events: list[dict[str, Any]]) -> None:
        rows = [
            [
                when(e["at"]),
                e["actor"],
                e["action"],
                e.get("from_status"),
                e.get("to_status"),
                e.get("reason"),
            ]
            for e in events
        ]
        trail = table(f"audit trail of {target}", AUDIT_COLUMNS, rows, keep={"when (UTC)", "what"})
        console.print(trail)

    run(ctx, output, fetch, render)
