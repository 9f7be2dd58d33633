"""`fleetkeeper pools`, `pool drain`, `pool cancel-drain`, `pool disruption` and `pool capacity`: pools,
their drains, their disruption budgets and their capacity."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from fleetkeeper_cli.output import (
    TIMEOUT_FORMS,
    OutputOption,
    console,
    print_budget_exceeded,
    run,
    seconds,
    table,
    when,
)

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
    print_budget_exceeded(pool.get("budget_exceeded"))


def _at(moment: str | None) -> str | None:
    return when(moment) if moment else None


def _window(budget: dict[str, Any]) -> str:
    if not budget.get("schedule"):
        return "always"
    return f"{budget['schedule']} for {budget['duration']} ({budget.get('timezone') or 'UTC'})"


def _applies(budget: dict[str, Any]) -> str:
    if not budget["active"]:
        start = _at(budget.get("next_start"))
        return f"no, from {start}" if start else "no"
    until = _at(budget.get("until"))
    return f"until {until}" if until else "yes"


def _print_disruption(view: dict[str, Any]) -> None:
    console.print(
        f"pool {view['pool']} at {when(view['at'])} UTC: {view['in_use']} of {view['members']} "
        f"members being disrupted; next change {_at(view.get('next_change')) or 'none'}",
        markup=False,
    )
    budgets = view["budgets"]
    if budgets:
        rows = [
            [b["index"], b["max"], ", ".join(b["reasons"]), _window(b), _applies(b), b["allowed"]]
            for b in budgets
        ]
        columns = ["#", "max", "reasons", "window", "applies", "allowed"]
        console.print(table("budgets", columns, rows))
    else:
        console.print("no budgets: the stage default applies", markup=False)
    default = view["stage_default"]
    rows = []
    for r in view["reasons"]:
        if r["governed_by"] == "pool":
            allowed, limit = r["allowed"], f"budget {r['limiting']}"
        else:
            allowed, limit = default["allowed"], f"stage default {default['max']} (drains, fleet-wide)"
        state = "blocked" if r["available"] == 0 else "open"
        blocked = None
        if state == "blocked":
            blocked = _at(r.get("blocked_until")) or "disruptions in progress end"
        rows.append([r["reason"], limit, allowed, r["in_use"], state, blocked])
    console.print(
        table("reasons", ["reason", "limited by", "allowed", "in use", "now", "blocked until"], rows)
    )
    if view["waiting"]:
        rows = [
            [
                w["worker_id"],
                w["reason"],
                w["action"],
                "stage default" if w["budget"] is None else w["budget"],
                f"{w['in_use']}/{w['allowed']}",
                when(w["refused_at"]),
                _at(w.get("until")),
            ]
            for w in view["waiting"]
        ]
        columns = ["worker", "reason", "action", "budget", "in use/allowed", "refused at", "until"]
        console.print(table("waiting", columns, rows, keep={"worker"}))


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


def disruption(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="pool name")],
    output: OutputOption = None,
) -> None:
    """Show a pool's disruption budgets: which apply now and until when, what is in use, what waits."""
    run(ctx, output, lambda c: c.get(f"/api/v1/pools/{name}/disruption"), _print_disruption)


def _print_capacity(view: dict[str, Any]) -> None:
    policy = view["policy"]
    console.print(
        f"pool {view['pool']} at {when(view['at'])} UTC: {view['running']} running, {view['launching']} "
        f"launching, {view['warm']} warm, {view['free_slots']} free slots; {view['members']} of "
        f"{policy.get('max_workers') if policy.get('max_workers') is not None else 'no cap'} members",
        markup=False,
    )
    target = view.get("target")
    if target is None:
        console.print("no capacity policy with a template: scale-out does nothing", markup=False)
    else:
        rule = target["rule"] if target.get("schedule") is None else f"schedule {target['schedule']}"
        if target["rule"] == "bookings":
            rule = f"bookings ({target.get('bookings_due', 0)} due)"
        capped = f" (capped from {target['wanted']} by max_workers)" if target["capped"] else ""
        console.print(
            f"target: {target['workers']} running{capped}, {target['warm']} warm, set by {rule}", markup=False
        )
    if view.get("bookings_waiting"):
        lead = view["lead_time_seconds"] // 60
        console.print(
            f"bookings: {view['bookings_waiting']} waiting for capacity, {view.get('bookings_due', 0)} due, "
            f"{view.get('bookings_at_risk', 0)} at risk (lead time {lead} min)",
            markup=False,
        )
    last = view.get("last_cycle")
    if last:
        did = f"started {last['started']}, created {last['created']}, refused at cap {last['refused_at_cap']}"
        note = f" ({last['note']})" if last.get("note") else ""
        console.print(f"last cycle {when(last['at'])}: {did}{note}", markup=False)
    blocked = view.get("blocked")
    if blocked:
        console.print(
            f"BLOCKED: {blocked['reason']} ({blocked['aws_error']}) since {when(blocked['since'])}, "
            f"retry at {when(blocked['retry_at'])}, {blocked['refusals']} refusals in a row",
            markup=False,
        )


def capacity(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="pool name")],
    output: OutputOption = None,
) -> None:
    """Show a pool's capacity: its workers and free slots, the target and its rule, the bookings waiting
    and due, what scale-out did."""
    run(ctx, output, lambda c: c.get(f"/api/v1/pools/{name}/capacity"), _print_capacity)
