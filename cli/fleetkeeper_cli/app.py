"""The `fleetkeeper` commands. Each command makes its API calls, then prints a table or JSON.

Exit codes: 0 ok, 1 the drain failed or timed out (or the API failed), 2 usage, 3 not found or
conflict, 4 authentication or authorization.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from fleetkeeper_cli import fleetfile
from fleetkeeper_cli.client import API_ENV, ApiClient, CliError, ExitCode, resolve_api_url
from fleetkeeper_cli.durations import parse_duration
from fleetkeeper_cli.watch import DrainWatch, follow

FAILED_DRAIN_STATES = frozenset({"ERROR", "TIMED_OUT"})


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"


class Then(StrEnum):
    STOP = "stop"
    TERMINATE = "terminate"


class PoolThen(StrEnum):
    NONE = "none"
    STOP = "stop"
    TERMINATE = "terminate"


class Strategy(StrEnum):
    PACK = "pack"
    SPREAD = "spread"


@dataclass
class Settings:
    api: str | None = None
    stack: str | None = None
    region: str | None = None
    profile: str | None = None
    output: Output = Output.TABLE
    _client: ApiClient | None = None

    def client(self) -> ApiClient:
        if self._client is None:
            url = resolve_api_url(self.api, self.stack, region=self.region, profile=self.profile)
            self._client = ApiClient(url, region=self.region, profile=self.profile)
        return self._client


app = typer.Typer(
    name="fleetkeeper",
    help="Operate a fleetkeeper fleet: workers, drains, pools, instances, templates and the audit trail.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
pool_app = typer.Typer(help="Pools: list, drain, cancel a drain.", no_args_is_help=True)
app.add_typer(pool_app, name="pool")
worker_app = typer.Typer(help="One worker.", no_args_is_help=True)
app.add_typer(worker_app, name="worker")
orphans_app = typer.Typer(
    help="Orphan GC's circuit breaker: what it holds back, and confirming it.", no_args_is_help=True
)
app.add_typer(orphans_app, name="orphans")
operation_app = typer.Typer(
    help="Worker operations run on the machine through SSM (the stage's catalogue).", no_args_is_help=True
)
app.add_typer(operation_app, name="operation")

console = Console()
error_console = Console(stderr=True)

OutputOption = Annotated[
    Output | None,
    typer.Option("--output", "-o", help="table (default) or json; also accepted before the command"),
]
TimeoutOption = Annotated[
    str | None,
    typer.Option("--timeout", help="drain deadline from now: 90s, 15m, 2h, 1h30m; default: the template's"),
]
IntervalOption = Annotated[float, typer.Option("--interval", min=0.1, help="seconds between two polls")]


def _settings(ctx: typer.Context) -> Settings:
    settings = ctx.find_object(Settings)
    return settings if settings is not None else Settings()


def _json_mode(ctx: typer.Context, output: Output | None) -> bool:
    settings = _settings(ctx)
    if output is not None:
        settings.output = output
    return settings.output == Output.JSON


def _print_json(value: Any) -> None:
    # Plain print: rich would wrap long lines and break the JSON for a pipe.
    print(json.dumps(value, indent=2, default=str))


def _fail(error: CliError) -> NoReturn:
    error_console.print(f"error: {error.message}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(int(error.exit_code))


def _seconds(timeout: str | None, option: str = "--timeout") -> int | None:
    if timeout is None:
        return None
    try:
        return parse_duration(timeout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def _table(title: str | None, columns: list[str], rows: list[list[Any]]) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("-" if cell is None or cell == "" else str(cell) for cell in row))
    return table


def _drain_cell(worker: dict[str, Any]) -> str:
    drain = worker.get("drain")
    if not drain:
        return "-"
    return f"{drain['outcome']} (gen {drain['generation']})"


def _run(ctx: typer.Context, output: Output | None, action: Any, render: Any) -> None:
    """Call `action(client)`; print its result as JSON or through `render`; map errors to exit codes."""
    as_json = _json_mode(ctx, output)
    try:
        result = action(_settings(ctx).client())
    except CliError as error:
        _fail(error)
    if as_json:
        _print_json(result)
    else:
        render(result)


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
    """Targets the local control plane (http://127.0.0.1:8080) unless --api, --stack or $FLEETKEEPER_API
    says otherwise. Calls to a deployed stage are SigV4-signed with your AWS credentials."""
    ctx.obj = Settings(api=api, stack=stack, region=region, profile=profile, output=output)


# ---- workers -------------------------------------------------------------------------------------------


@app.command()
def workers(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="only workers in this status, e.g. RUNNING")] = None,
    pool: Annotated[str | None, typer.Option(help="only workers of this pool")] = None,
    template: Annotated[str | None, typer.Option(help="only workers of this template")] = None,
    output: OutputOption = None,
) -> None:
    """List workers: id, status, pool, template, active/capacity, drain."""

    def render(items: list[dict[str, Any]]) -> None:
        rows = [
            [
                w["id"],
                w["status"],
                w["pool"],
                w["template"],
                f"{w['active_instances']}/{w['capacity']}",
                _drain_cell(w),
            ]
            for w in sorted(items, key=lambda w: (w.get("pool") or "", w["template"], w["id"]))
        ]
        console.print(_table(None, ["id", "status", "pool", "template", "active/capacity", "drain"], rows))

    _run(
        ctx,
        output,
        lambda c: c.pages("/api/v1/workers", status=status, pool=pool, template=template, limit=1000),
        render,
    )


@worker_app.command("show")
def worker_show(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="worker id")],
    output: OutputOption = None,
) -> None:
    """Show one worker and its drain."""

    def render(worker: dict[str, Any]) -> None:
        drain = worker.get("drain") or {}
        rows = [
            [k, worker.get(k)]
            for k in (
                "id",
                "status",
                "desired_status",
                "template",
                "pool",
                "region",
                "ec2_instance_id",
                "private_ip",
                "status_reason",
                "version",
                "created_at",
                "updated_at",
            )
        ]
        rows.insert(6, ["instances", f"{worker['active_instances']}/{worker['capacity']}"])
        rows += [[f"drain.{k}", v] for k, v in drain.items() if v is not None]
        table = _table(None, ["field", "value"], rows)
        table.show_header = False
        console.print(table)

    _run(ctx, output, lambda c: c.get(f"/api/v1/workers/{worker_id}"), render)


# ---- drains --------------------------------------------------------------------------------------------


def _print_drain_status(status: dict[str, Any]) -> None:
    rows = [[k, v] for k, v in status.items() if v is not None and k != "worker_id"]
    table = _table(f"drain of {status['worker_id']}", ["field", "value"], rows)
    table.show_header = False
    console.print(table)


def _drain_exit(status: dict[str, Any]) -> ExitCode:
    return ExitCode.FAILED if status.get("status") in FAILED_DRAIN_STATES else ExitCode.OK


def _watch(ctx: typer.Context, worker_id: str, interval: float) -> None:
    """Follow a drain to its end; exit 1 when it failed or timed out. Ctrl-C detaches."""
    as_json = _settings(ctx).output == Output.JSON
    watch = DrainWatch(_settings(ctx).client(), worker_id, interval=interval)
    try:
        outcome = follow(watch, console, live=not as_json)
    except CliError as error:
        _fail(error)
    except KeyboardInterrupt:
        error_console.print(
            f"detached: the drain of {worker_id} goes on. "
            f"Re-attach with: fleetkeeper drain-status {worker_id} --watch"
        )
        raise typer.Exit(int(ExitCode.OK)) from None
    if as_json:
        _print_json(outcome)
    else:
        console.print(
            f"drain of {worker_id}: {outcome['status']} - {outcome['graceful_instances']} instance(s) ended "
            f"gracefully, {outcome['forced_instances']} forced, {outcome.get('moved_instances') or 0} moved "
            f"to other workers; worker {outcome['worker_status']}"
        )
    raise typer.Exit(int(_drain_exit(outcome)))


@app.command()
def drain(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="worker id")],
    timeout: TimeoutOption = None,
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
    wait: Annotated[bool, typer.Option("--wait", help="follow the drain live until it ends")] = False,
    interval: IntervalOption = 2.0,
    output: OutputOption = None,
) -> None:
    """Drain a worker: no new work lands on it, its work finishes, then it stops (forced at the deadline)."""
    body: dict[str, Any] = {"then": then.value, "dry_run": dry_run, "reschedule": reschedule}
    seconds = _seconds(timeout)
    if seconds is not None:
        body["timeout_seconds"] = seconds
    if reason:
        body["reason"] = reason
    as_json = _json_mode(ctx, output)
    try:
        status = _settings(ctx).client().post(f"/api/v1/workers/{worker_id}/drain", body)
    except CliError as error:
        _fail(error)
    if not (wait and not dry_run):
        _print_json(status) if as_json else _print_drain_status(status)
        return
    if not as_json:
        console.print(f"drain of {worker_id} started (deadline {status.get('deadline')})")
    _watch(ctx, worker_id, interval)


@app.command("drain-status")
def drain_status(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="worker id")],
    watch: Annotated[bool, typer.Option("--watch", help="follow the drain live until it ends")] = False,
    interval: IntervalOption = 2.0,
    output: OutputOption = None,
) -> None:
    """A worker's latest drain: status, deadline, estimate, active and forced instances."""
    as_json = _json_mode(ctx, output)
    if watch:
        _watch(ctx, worker_id, interval)
    try:
        status = _settings(ctx).client().get(f"/api/v1/workers/{worker_id}/drain")
    except CliError as error:
        _fail(error)
    _print_json(status) if as_json else _print_drain_status(status)
    raise typer.Exit(int(_drain_exit(status)))


@app.command("cancel-drain")
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

    _run(ctx, output, lambda c: c.post(f"/api/v1/workers/{worker_id}/cancel-drain", body), render)


# ---- pools ---------------------------------------------------------------------------------------------


def _pool_rows(pools: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [p["name"], p["status"], p.get("description"), p.get("drain_outcome"), p.get("drain_started_at")]
        for p in pools
    ]


@app.command()
def pools(ctx: typer.Context, output: OutputOption = None) -> None:
    """List pools and their drains."""
    _run(
        ctx,
        output,
        lambda c: c.get("/api/v1/pools")["items"],
        lambda items: console.print(
            _table(None, ["name", "status", "description", "drain", "drain started"], _pool_rows(items))
        ),
    )


@pool_app.command("drain")
def pool_drain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="pool name")],
    timeout: TimeoutOption = None,
    then: Annotated[
        PoolThen, typer.Option("--then", help="what happens to the pool's workers once empty")
    ] = PoolThen.NONE,
    output: OutputOption = None,
) -> None:
    """Drain every worker of a pool."""
    body: dict[str, Any] = {"then": then.value}
    seconds = _seconds(timeout)
    if seconds is not None:
        body["timeout_seconds"] = seconds
    _run(
        ctx,
        output,
        lambda c: c.post(f"/api/v1/pools/{name}/drain", body),
        lambda pool: console.print(
            f"pool {pool['name']} {pool['status']}: drain {pool.get('drain_outcome')}"
        ),
    )


@pool_app.command("cancel-drain")
def pool_cancel_drain(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="pool name")],
    reason: Annotated[str | None, typer.Option(help="why the drain is cancelled")] = None,
    output: OutputOption = None,
) -> None:
    """Cancel a pool's drain."""
    body = {"reason": reason} if reason else None
    _run(
        ctx,
        output,
        lambda c: c.post(f"/api/v1/pools/{name}/cancel-drain", body),
        lambda pool: console.print(
            f"pool {pool['name']} {pool['status']}: drain {pool.get('drain_outcome')}"
        ),
    )


# ---- orphan GC's circuit breaker -----------------------------------------------------------------------


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


_BREAKER_COLUMNS = ["region", "breaker", "held back", "share", "confirmed by", "confirmed until"]


@orphans_app.command("show")
def orphans_show(ctx: typer.Context, output: OutputOption = None) -> None:
    """Each region's breaker: the workers it holds back from orphan GC, and any confirmation."""
    _run(
        ctx,
        output,
        lambda c: c.get("/api/v1/reconcile/orphans")["items"],
        lambda items: console.print(_table(None, _BREAKER_COLUMNS, _breaker_rows(items))),
    )


@orphans_app.command("confirm")
def orphans_confirm(
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

    _run(ctx, output, lambda c: c.post("/api/v1/reconcile/orphans/confirm", body), render)


# ---- instances, templates, stats -----------------------------------------------------------------------


def _instance_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [i["id"], i["state"], i["worker_id"], i.get("template"), i.get("pool"), i.get("reason")]
        for i in items
    ]


INSTANCE_COLUMNS = ["id", "state", "worker", "template", "pool", "reason"]


@app.command()
def instances(
    ctx: typer.Context,
    worker: Annotated[str | None, typer.Option("--worker", help="only this worker's instances")] = None,
    state: Annotated[str | None, typer.Option(help="only instances in this state, e.g. RUNNING")] = None,
    output: OutputOption = None,
) -> None:
    """List workload instances."""
    _run(
        ctx,
        output,
        lambda c: c.pages("/api/v1/instances", worker_id=worker, state=state, limit=1000),
        lambda items: console.print(_table(None, INSTANCE_COLUMNS, _instance_rows(items))),
    )


@app.command()
def place(
    ctx: typer.Context,
    template: Annotated[str | None, typer.Option(help="template the instance needs")] = None,
    pool: Annotated[str | None, typer.Option(help="pool to place it in")] = None,
    worker: Annotated[str | None, typer.Option("--worker", help="this worker and no other")] = None,
    strategy: Annotated[
        Strategy, typer.Option(help="pack fills busy workers first; spread the emptiest")
    ] = Strategy.PACK,
    output: OutputOption = None,
) -> None:
    """Place a workload instance on a RUNNING worker with room."""
    body = {"template": template, "pool": pool, "worker_id": worker, "strategy": strategy.value}
    _run(
        ctx,
        output,
        lambda c: c.post("/api/v1/instances", {k: v for k, v in body.items() if v is not None}),
        lambda i: console.print(f"instance {i['id']} {i['state']} on worker {i['worker_id']}"),
    )


@app.command()
def complete(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(help="instance id")],
    reason: Annotated[str | None, typer.Option(help="why it ended")] = None,
    output: OutputOption = None,
) -> None:
    """Mark a workload instance COMPLETED, freeing its slot."""
    body = {"state": "COMPLETED", **({"reason": reason} if reason else {})}
    _run(
        ctx,
        output,
        lambda c: c.post(f"/api/v1/instances/{instance_id}/state", body),
        lambda i: console.print(f"instance {i['id']} {i['state']}"),
    )


@app.command()
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
                t["version"],
            ]
            for t in items
        ]
        console.print(
            _table(
                None,
                ["name", "instance type", "AMI filter", "capacity", "drain timeout (h)", "version"],
                rows,
            )
        )

    _run(ctx, output, lambda c: c.get("/api/v1/templates")["items"], render)


@app.command()
def stats(ctx: typer.Context, output: OutputOption = None) -> None:
    """Workers by status, pools by status, active instances, reconcile and discovery counters."""

    def render(body: dict[str, Any]) -> None:
        rows = [[f"workers {k}", v] for k, v in sorted(body.get("workers_by_status", {}).items())]
        rows += [[f"pools {k}", v] for k, v in sorted(body.get("pools_by_status", {}).items())]
        rows.append(["active instances", body.get("active_instances")])
        for group, counters in sorted(body.get("counters", {}).items()):
            rows += [[f"{group}.{k}", v] for k, v in sorted(counters.items())]
        console.print(_table(None, ["", "value"], rows))

    _run(ctx, output, lambda c: c.get("/api/v1/stats"), render)


def _when(moment: str) -> str:
    return datetime.fromisoformat(moment).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


# ---- worker operations ---------------------------------------------------------------------------------

OPERATION_COLUMNS = ["id", "name", "status", "attempts", "requested by", "created (UTC)", "error / output"]


def _operation_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [
            o["id"],
            o["name"],
            o["status"],
            f"{o['attempts']}/{o['max_attempts']}",
            o["requested_by"],
            _when(o["created_at"]),
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


@app.command()
def operations(
    ctx: typer.Context,
    worker_id: Annotated[str, typer.Argument(help="the worker")],
    output: OutputOption = None,
) -> None:
    """A worker's operations, newest first: status, attempts, and the end of their output."""
    _run(
        ctx,
        output,
        lambda c: c.pages(f"/api/v1/workers/{worker_id}/operations", limit=100),
        lambda items: console.print(
            _table(f"operations of {worker_id}", OPERATION_COLUMNS, _operation_rows(items))
        ),
    )


@operation_app.command("run")
def operation_run(
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
    _run(
        ctx,
        output,
        lambda c: c.post(f"/api/v1/workers/{worker_id}/operations", body),
        lambda o: console.print(f"operation {o['id']} ({o['name']}) {o['status']} on worker {worker_id}"),
    )


# ---- audit ---------------------------------------------------------------------------------------------


@app.command()
def audit(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(help="worker id (or pool name with --pool)")],
    pool: Annotated[bool, typer.Option("--pool", help="TARGET is a pool")] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="newest events to show")] = 50,
    output: OutputOption = None,
) -> None:
    """Who did what to a worker or pool, from which status to which, why and when (newest first)."""
    path = f"/api/v1/pools/{target}/events" if pool else f"/api/v1/workers/{target}/events"

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
                _when(e["at"]),
                e["actor"],
                e["action"],
                e.get("from_status"),
                e.get("to_status"),
                e.get("reason"),
            ]
            for e in events
        ]
        table = _table(f"audit trail of {target}", ["when (UTC)", "who", "what", "from", "to", "why"], rows)
        when, who, what = table.columns[:3]
        when.no_wrap = what.no_wrap = True
        who.overflow = "fold"  # an IAM ARN has no spaces to wrap at
        console.print(table)

    _run(ctx, output, fetch, render)


# ---- apply ---------------------------------------------------------------------------------------------


def _print_plan(changes: list[fleetfile.Change]) -> None:
    symbols = {"create": "[green]+[/green]", "update": "[yellow]~[/yellow]", "unchanged": "[dim]=[/dim]"}
    for change in changes:
        console.print(f"{symbols[change.action]} {change.kind} {change.name}: {change.action}")
        for name, (old, new) in change.fields.items():
            before = "" if change.action == "create" else f"{old!r} -> "
            console.print(f"    {name}: {before}{new!r}", markup=False, highlight=False, soft_wrap=True)


@app.command()
def apply(
    ctx: typer.Context,
    file: Annotated[Path, typer.Option("--file", "-f", help="fleet file (YAML): templates and pools")],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="show the diff only")] = False,
    output: OutputOption = None,
) -> None:
    """Declare templates and pools from a YAML file: show the diff, then apply it (idempotent)."""
    as_json = _json_mode(ctx, output)
    try:
        fleet = fleetfile.load(file)
        client = _settings(ctx).client()
        changes = fleetfile.plan(client, fleet)
        pending = [c for c in changes if c.action != "unchanged"]
        if pending and not dry_run:
            fleetfile.apply(client, pending)
    except CliError as error:
        _fail(error)
    if as_json:
        _print_json({"applied": bool(pending) and not dry_run, "changes": [c.as_dict() for c in changes]})
        return
    _print_plan(changes)
    if not pending:
        console.print("nothing to change")
    elif dry_run:
        console.print(f"{len(pending)} change(s) not applied (--dry-run)")
    else:
        console.print(f"applied {len(pending)} change(s)")


# ---- entry point ---------------------------------------------------------------------------------------


def main() -> None:
    """The console script. Errors that escape a command still end with one line and an exit code."""
    try:
        app()
    except CliError as error:
        error_console.print(f"error: {error.message}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(int(error.exit_code))
