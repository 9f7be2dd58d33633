"""`fleetkeeper drain`, `drain-status` and `cancel-drain`: one worker's drain, and following it live."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer

from fleetkeeper_cli.client import CliError, ExitCode
from fleetkeeper_cli.output import (
    TIMEOUT_FORMS,
    IntervalOption,
    Output,
    OutputOption,
    console,
    detachable,
    fail,
    json_mode,
    print_budget_exceeded,
    print_json,
    run,
    seconds,
    settings,
    table,
)
from fleetkeeper_cli.watch import DrainWatch, follow

FAILED_DRAIN_STATES = frozenset({"ERROR", "TIMED_OUT"})


class Then(StrEnum):
    STOP = "stop"
    TERMINATE = "terminate"


WorkerTimeoutOption = Annotated[
    str | None,
    typer.Option(
        "--timeout",
        help=f"drain deadline from now: {TIMEOUT_FORMS}; default: the template's drain_timeout_hours",
    ),
]


def print_drain_status(status: dict[str, Any]) -> None:
    rows = [[k, v] for k, v in status.items() if v is not None and k not in ("worker_id", "budget_exceeded")]
    fields = table(f"drain of {status['worker_id']}", ["field", "value"], rows)
    fields.show_header = False
    console.print(fields)
    print_budget_exceeded(status.get("budget_exceeded"))


def _drain_exit(status: dict[str, Any]) -> ExitCode:
    return ExitCode.FAILED if status.get("status") in FAILED_DRAIN_STATES else ExitCode.OK


def _watch(ctx: typer.Context, worker_id: str, interval: float) -> None:
    """Follow a drain to its end; exit 1 when it failed or timed out. Ctrl-C detaches."""
    as_json = settings(ctx).output == Output.JSON
    watch = DrainWatch(settings(ctx).client(), worker_id, interval=interval)
    hint = (
        f"detached: the drain of {worker_id} goes on. "
        f"Re-attach with: fleetkeeper drain-status {worker_id} --watch"
    )
    with detachable(hint):
        outcome = follow(watch, console, live=not as_json)
    if as_json:
        print_json(outcome)
    else:
        console.print(
            f"drain of {worker_id}: {outcome['status']} - {outcome['graceful_instances']} instance(s) ended "
            f"gracefully, {outcome['forced_instances']} forced, {outcome.get('moved_instances') or 0} moved "
            f"to other workers; worker {outcome['worker_status']}"
        )
    raise typer.Exit(int(_drain_exit(outcome)))


def drain(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="worker id")],
    timeout: WorkerTimeoutOption = None,
    reason: Annotated[str | None, typer.Option(help="why; kept in the audit trail")] = None,
    then: Annotated[Then, typer.Option("--then", help="what happens to the worker once empty")] = Then.STOP,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="show what the drain would do; change nothing")
    ] = False,
    reschedule: Annotated[
        bool,
        typer.Option(
            "--reschedule/--no-reschedule",
            help="move instances not started yet (SCHEDULED) to other workers of the pool and template "
            "with room; --no-reschedule waits for them",
        ),
    ] = True,
    extend: Annotated[
        str | None,
        typer.Option(
            "--extend",
            help=f"move the running drain's deadline later by this much ({TIMEOUT_FORMS}); starts nothing",
        ),
    ] = None,
    force_now: Annotated[
        bool,
        typer.Option(
            "--force-now",
            help="force the running drain now: what still runs ends (reason forced), then the worker stops",
        ),
    ] = False,
    wait: Annotated[bool, typer.Option("--wait", help="follow the drain live until it ends")] = False,
    interval: IntervalOption = 2.0,
    output: OutputOption = None,
) -> None:
    """Drain a worker: no new work lands on it, its work finishes, then it stops (forced at the deadline).

    On a worker already draining, --extend moves the deadline later and --force-now forces it now."""
    if extend is not None or force_now:
        starting = {
            "--timeout": timeout is not None,
            "--then": then != Then.STOP,
            "--dry-run": dry_run,
            "--no-reschedule": not reschedule,
        }
        _control(
            ctx,
            worker_id,
            extend=extend,
            force_now=force_now,
            reason=reason,
            output=output,
            starting=starting,
        )
        if wait:
            _watch(ctx, worker_id, interval)
        return
    body: dict[str, Any] = {"then": then.value, "dry_run": dry_run, "reschedule": reschedule}
    timeout_seconds = seconds(timeout)
    if timeout_seconds is not None:
        body["timeout_seconds"] = timeout_seconds
    if reason:
        body["reason"] = reason
    as_json = json_mode(ctx, output)
    try:
        status = settings(ctx).client().post(f"/api/v1/workers/{worker_id}/drain", body)
    except CliError as error:
        fail(error)
    if not (wait and not dry_run):
        print_json(status) if as_json else print_drain_status(status)
        return
    if not as_json:
        console.print(f"drain of {worker_id} started (deadline {status.get('deadline')})")
        print_budget_exceeded(status.get("budget_exceeded"))
    _watch(ctx, worker_id, interval)


def _control(
    ctx: typer.Context,
    worker_id: str,
    *,
    extend: str | None,
    force_now: bool,
    reason: str | None,
    output: Output | None,
    starting: dict[str, bool],
) -> None:
    """--extend or --force-now on the running drain; `starting` says which options that only start a
    drain were given (a usage error here)."""
    if extend is not None and force_now:
        raise typer.BadParameter("use --extend or --force-now, not both", param_hint="--extend")
    for option, given in starting.items():
        if given:
            raise typer.BadParameter(
                f"{option} starts a drain; --extend and --force-now act on the running one", param_hint=option
            )
    as_json = json_mode(ctx, output)
    client = settings(ctx).client()
    path = f"/api/v1/workers/{worker_id}/drain"
    try:
        if force_now:
            status = client.post(f"{path}/force", {"reason": reason} if reason else None)
        else:
            by = seconds(extend, "--extend")
            if not by:
                raise typer.BadParameter("extend by more than nothing, e.g. 30m", param_hint="--extend")
            current = client.get(path)
            if current.get("status") != "RUNNING" or current.get("timeout_seconds") is None:
                raise CliError(
                    f"worker {worker_id} has no running drain to extend (its drain: {current.get('status')})",
                    ExitCode.NOT_FOUND_OR_CONFLICT,
                )
            # The new timeout counts from the drain's start; naming the generation read makes the move
            # a 409 rather than a change to a drain started since.
            body: dict[str, Any] = {
                "timeout_seconds": current["timeout_seconds"] + by,
                "generation": current["generation"],
            }
            if reason:
                body["reason"] = reason
            status = client.patch(path, body)
    except CliError as error:
        fail(error)
    if as_json:
        print_json(status)
        return
    if force_now:
        console.print(f"drain of {worker_id} forced: what still runs ends now, then the worker stops")
    else:
        console.print(f"drain of {worker_id} extended by {extend}: deadline {status.get('deadline')}")
    print_drain_status(status)


def drain_status(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="worker id")],
    watch: Annotated[bool, typer.Option("--watch", help="follow the drain live until it ends")] = False,
    interval: IntervalOption = 2.0,
    output: OutputOption = None,
) -> None:
    """A worker's latest drain: status, deadline, estimate, active and forced instances."""
    as_json = json_mode(ctx, output)
    if watch:
        _watch(ctx, worker_id, interval)
    try:
        status = settings(ctx).client().get(f"/api/v1/workers/{worker_id}/drain")
    except CliError as error:
        fail(error)
    print_json(status) if as_json else print_drain_status(status)
    raise typer.Exit(int(_drain_exit(status)))


def cancel_drain(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="worker id")],
    reason: Annotated[str | None, typer.Option(help="why the drain is cancelled")] = None,
    output: OutputOption = None,
) -> None:
    """Cancel a worker's drain: it goes back to RUNNING and takes work again."""
    body = {"reason": reason} if reason else None

    def render(worker: dict[str, Any]) -> None:
        console.print(f"drain of {worker['id']} cancelled; worker {worker['status']}")

    run(ctx, output, lambda c: c.post(f"/api/v1/workers/{worker_id}/cancel-drain", body), render)
