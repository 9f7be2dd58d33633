"""`fleetkeeper rollouts` and `rollout start|status|pause|resume|cancel|rollback`: replacing a template's
workers wave by wave (docs/rollouts.md), and following one live."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any

import typer

from fleetkeeper_cli.client import ApiClient, CliError, ExitCode
from fleetkeeper_cli.output import (
    TIMEOUT_FORMS,
    IntervalOption,
    Output,
    OutputOption,
    console,
    detachable,
    fail,
    json_mode,
    print_json,
    run,
    seconds,
    settings,
    table,
    when,
)
from fleetkeeper_cli.watch import (
    RolloutWatch,
    blocked_line,
    checkpoints_cell,
    ended_as_asked,
    follow_rollout,
    progress_line,
    wave_of,
)

ROLLOUT_COLUMNS = ["id", "status", "template", "pool", "replaced", "wave", "blocked", "created (UTC)"]
# The API's own bounds (docs/rollouts.md): a count of 1-500 or a percentage of 1-100.
_MAX_UNAVAILABLE = re.compile(r"^(\d+)(%?)$")


class Strategy(StrEnum):
    SURGE = "surge"
    DRAIN_FIRST = "drain_first"


RolloutIdArgument = Annotated[str, typer.Argument(help="rollout id, e.g. ro-0123456789abcdef")]
ReasonOption = Annotated[str | None, typer.Option("--reason", help="why; kept in the audit trail")]
WaitOption = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="follow the rollout live until it ends: exit 0 when SUCCEEDED or ROLLED_BACK, 1 when FAILED "
        "or CANCELLED; Ctrl-C detaches",
    ),
]


def _max_unavailable(text: str | None) -> int | str | None:
    """`3` is a count, `25%` a share of the scope, as the API takes them."""
    if text is None:
        return None
    match = _MAX_UNAVAILABLE.match(text.strip())
    if not match:
        raise typer.BadParameter(
            f"'{text}' is neither a count (e.g. 2) nor a percentage (e.g. 25%)",
            param_hint="--max-unavailable",
        )
    number, percent = match.groups()
    return f"{int(number)}%" if percent else int(number)


def print_rollout(view: dict[str, Any]) -> None:
    """A rollout: one progress line, what blocks it, then its settings."""
    console.print(progress_line(view), markup=False, highlight=False)
    blocked = blocked_line(view, datetime.now(UTC))
    if blocked:
        console.print(blocked, markup=False, highlight=False)
    rows: list[list[Any]] = [
        ["template", view.get("template")],
        ["pool", view.get("pool")],
        ["strategy", view.get("strategy")],
        ["max_unavailable", view.get("max_unavailable")],
        ["checkpoints", checkpoints_cell(view)],
        ["replace", view.get("replace")],
        ["rollback_on_alarms", ", ".join(view.get("rollback_on_alarms") or []) or None],
        ["started_by", view.get("started_by")],
        ["reason", view.get("reason")],
        ["created_at", view.get("created_at")],
        ["updated_at", view.get("updated_at")],
        ["finished_at", view.get("finished_at")],
    ]
    fields = table(None, ["field", "value"], rows)
    fields.show_header = False
    console.print(fields)
    _print_hint(view)


def _print_hint(view: dict[str, Any]) -> None:
    if view.get("status") == "PAUSED":
        console.print(
            f"paused: `fleetkeeper rollout resume {view['id']}` goes on, `cancel` stops it", markup=False
        )


def _wave_row(wave: dict[str, Any]) -> list[Any]:
    # A large plan lists the ids of its first waves only (null after): the count says how many.
    ids = wave.get("worker_ids")
    count = wave.get("count", len(ids or []))
    return [wave["index"] + 1, count, " ".join(ids) if ids is not None else "(not listed)"]


def print_plan(plan: dict[str, Any]) -> None:
    """dry_run: the waves the rollout would run, and their workers."""
    scope = f"template {plan.get('template')}" if plan.get("template") else "the workers named"
    if plan.get("pool"):
        scope += f" in pool {plan['pool']}"
    checkpoints = ", ".join(f"{c}%" for c in plan.get("checkpoints") or []) or "none"
    console.print(
        f"plan ({plan['strategy']}): {plan['total']} worker(s) of {scope}, "
        f"{len(plan['waves'])} wave(s) of at most {plan['max_unavailable']}; checkpoints {checkpoints}. "
        "Nothing was started.",
        markup=False,
    )
    rows = [_wave_row(wave) for wave in plan["waves"]]
    console.print(table("waves", ["wave", "workers", "worker ids"], rows, keep={"wave"}))


def _follow(ctx: typer.Context, rollout_id: str, interval: float) -> None:
    """Follow a rollout to its final status; exit 0 when it succeeded or an operator rolled it back, 1 when
    it failed, was cancelled or its alarms rolled it back."""
    as_json = settings(ctx).output == Output.JSON
    watch = RolloutWatch(settings(ctx).client(), rollout_id, interval=interval)
    hint = (
        f"detached: rollout {rollout_id} goes on. "
        f"Follow it with: fleetkeeper rollout status {rollout_id} --wait"
    )
    with detachable(hint):
        view = follow_rollout(watch, console, live=not as_json)
    if as_json:
        print_json(view)
    else:
        console.print(progress_line(view), markup=False, highlight=False)
        blocked = blocked_line(view, datetime.now(UTC))
        if blocked:
            console.print(blocked, markup=False, highlight=False)
    raise typer.Exit(int(ExitCode.OK if ended_as_asked(view) else ExitCode.FAILED))


def start(
    ctx: typer.Context,
    template: Annotated[
        str | None,
        typer.Argument(
            metavar="TEMPLATE", help="the template whose RUNNING workers are replaced (or give --worker)"
        ),
    ] = None,
    pool: Annotated[
        str | None, typer.Option("--pool", help="only the template's workers in this pool")
    ] = None,
    worker: Annotated[
        list[str] | None,
        typer.Option("--worker", help="replace this worker instead of a template's (repeatable)"),
    ] = None,
    max_unavailable: Annotated[
        str | None,
        typer.Option(
            "--max-unavailable",
            help="a wave's size: a count (e.g. 1) or a share of the scope (e.g. 25%); default 10%",
        ),
    ] = None,
    strategy: Annotated[
        Strategy,
        typer.Option(
            "--strategy",
            help="surge: the replacement first, then drain the old worker; drain_first: the other way round",
        ),
    ] = Strategy.SURGE,
    checkpoint: Annotated[
        list[int] | None,
        typer.Option("--checkpoint", min=1, max=99, help="pause once this % is replaced (repeatable)"),
    ] = None,
    checkpoint_delay: Annotated[
        str | None,
        typer.Option(
            "--checkpoint-delay",
            help=f"a checkpoint goes on by itself after this long ({TIMEOUT_FORMS}); "
            "default: it waits for a resume",
        ),
    ] = None,
    bake: Annotated[
        str | None,
        typer.Option("--bake", help=f"a finished wave settles this long before the next ({TIMEOUT_FORMS})"),
    ] = None,
    drain_timeout: Annotated[
        str | None,
        typer.Option(
            "--drain-timeout", help=f"each drain's deadline ({TIMEOUT_FORMS}); default: the template's"
        ),
    ] = None,
    no_replace: Annotated[
        bool, typer.Option("--no-replace", help="drain (then terminate) the workers without replacements")
    ] = False,
    rollback_on_alarm: Annotated[
        list[str] | None,
        typer.Option(
            "--rollback-on-alarm",
            metavar="NAME",
            help="roll the rollout back when this CloudWatch alarm is in ALARM (repeatable, up to 10)",
        ),
    ] = None,
    reason: ReasonOption = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="show the plan's waves and their workers; start nothing")
    ] = False,
    wait: WaitOption = False,
    interval: IntervalOption = 2.0,
    output: OutputOption = None,
) -> None:
    """Start a rollout: replace a template's RUNNING workers (or those named) wave by wave."""
    if template is not None and worker:
        raise typer.BadParameter("give TEMPLATE or --worker, not both", param_hint="--worker")
    if template is None and not worker:
        raise typer.BadParameter("give TEMPLATE, or the workers with --worker", param_hint="TEMPLATE")
    body: dict[str, Any] = {"strategy": strategy.value}
    if template is not None:
        body["template"] = template
    if pool is not None:
        body["pool"] = pool
    if worker:
        body["worker_ids"] = list(worker)
    count = _max_unavailable(max_unavailable)
    if count is not None:
        body["max_unavailable"] = count
    if checkpoint:
        body["checkpoints"] = list(checkpoint)
    for key, value, option in (
        ("checkpoint_delay_seconds", checkpoint_delay, "--checkpoint-delay"),
        ("bake_seconds", bake, "--bake"),
        ("drain_timeout_seconds", drain_timeout, "--drain-timeout"),
    ):
        parsed = seconds(value, option)
        if parsed is not None:
            body[key] = parsed
    if no_replace:
        body["replace"] = False
    if rollback_on_alarm:
        body["rollback_on_alarms"] = list(rollback_on_alarm)
    if reason:
        body["reason"] = reason
    if dry_run:
        body["dry_run"] = True
        run(ctx, output, lambda c: c.post("/api/v1/rollouts", body), print_plan)
        return
    as_json = json_mode(ctx, output)
    try:
        started = settings(ctx).client().post("/api/v1/rollouts", body)
    except CliError as error:
        fail(error)
    if not wait:
        print_json(started) if as_json else print_rollout(started)
        return
    if not as_json:
        console.print(
            f"rollout {started['id']} started: {started['total']} worker(s) in {started['waves']} wave(s)",
            markup=False,
        )
    _follow(ctx, started["id"], interval)


def status(
    ctx: typer.Context,
    rollout_id: RolloutIdArgument,
    wait: WaitOption = False,
    interval: IntervalOption = 2.0,
    output: OutputOption = None,
) -> None:
    """A rollout: its wave, what is replaced, in progress and remaining, and what blocks it."""
    json_mode(ctx, output)
    if wait:
        _follow(ctx, rollout_id, interval)
    run(ctx, output, lambda c: c.get(f"/api/v1/rollouts/{rollout_id}"), print_rollout)


def _control(
    ctx: typer.Context, rollout_id: str, move: str, reason: str | None, output: Output | None
) -> None:
    body = {"reason": reason} if reason else None
    run(ctx, output, lambda c: c.post(f"/api/v1/rollouts/{rollout_id}/{move}", body), print_rollout)


def pause(
    ctx: typer.Context,
    rollout_id: RolloutIdArgument,
    reason: ReasonOption = None,
    output: OutputOption = None,
) -> None:
    """Pause a RUNNING rollout: no new step until it is resumed (what already started goes on)."""
    _control(ctx, rollout_id, "pause", reason, output)


def resume(
    ctx: typer.Context,
    rollout_id: RolloutIdArgument,
    reason: ReasonOption = None,
    output: OutputOption = None,
) -> None:
    """Resume a PAUSED rollout; at a checkpoint, pass it."""
    _control(ctx, rollout_id, "resume", reason, output)


def cancel(
    ctx: typer.Context,
    rollout_id: RolloutIdArgument,
    reason: ReasonOption = None,
    output: OutputOption = None,
) -> None:
    """Cancel a RUNNING or PAUSED rollout: no new wave or drain starts; those started go on."""
    _control(ctx, rollout_id, "cancel", reason, output)


def rollback(
    ctx: typer.Context,
    rollout_id: RolloutIdArgument,
    reason: ReasonOption = None,
    output: OutputOption = None,
) -> None:
    """Roll a rollout back (ROLLING_BACK): follow it with `rollout status ID --wait`."""
    _control(ctx, rollout_id, "rollback", reason, output)


def list_rollouts(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="newest rollouts to show")] = 50,
    output: OutputOption = None,
) -> None:
    """List rollouts, newest first: status, scope, progress, wave and what blocks them."""

    def fetch(client: ApiClient) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        token: str | None = None
        while len(found) < limit:
            page = client.get("/api/v1/rollouts", limit=min(100, limit - len(found)), next_token=token)
            found.extend(page["items"])
            token = page.get("next_token")
            if not token:
                break
        return found

    def render(items: list[dict[str, Any]]) -> None:
        rows = [
            [
                r["id"],
                r["status"],
                r.get("template"),
                r.get("pool"),
                f"{r['replaced']}/{r['total']} ({r['percent']}%)",
                wave_of(r),
                (r.get("blocked") or {}).get("reason"),
                when(r["created_at"]),
            ]
            for r in items
        ]
        console.print(table(None, ROLLOUT_COLUMNS, rows, keep={"id", "created (UTC)"}))

    run(ctx, output, fetch, render)
