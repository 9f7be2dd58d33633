"""What every command shares: the global settings, the two consoles, the common options, and the way a
command calls the API and prints its answer as a table or as JSON."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from fleetkeeper_cli.client import ApiClient, CliError, ExitCode, resolve_api_target
from fleetkeeper_cli.durations import parse_duration


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"


console = Console()
error_console = Console(stderr=True)


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
            target = resolve_api_target(self.api, self.stack, region=self.region, profile=self.profile)
            if target.source is not None:
                # An API chosen by the environment or a stack is easy to forget: name it, on stderr so a
                # pipe of the JSON output still parses.
                error_console.print(
                    f"API {target.url} (from {target.source})", markup=False, highlight=False, style="dim"
                )
            self._client = ApiClient(target.url, region=self.region, profile=self.profile)
        return self._client


OutputOption = Annotated[
    Output | None,
    typer.Option("--output", "-o", help="table (default) or json; also accepted before the command"),
]
IntervalOption = Annotated[float, typer.Option("--interval", min=0.1, help="seconds between two polls")]
TIMEOUT_FORMS = "90s, 15m, 2h, 1h30m"


def settings(ctx: typer.Context) -> Settings:
    found = ctx.find_object(Settings)
    return found if found is not None else Settings()


def json_mode(ctx: typer.Context, output: Output | None) -> bool:
    current = settings(ctx)
    if output is not None:
        current.output = output
    return current.output == Output.JSON


def print_json(value: Any) -> None:
    # Plain print: rich would wrap long lines and break the JSON for a pipe.
    print(json.dumps(value, indent=2, default=str))


def print_error(message: str) -> None:
    error_console.print(f"error: {message}", markup=False, highlight=False, soft_wrap=True)


def fail(error: CliError) -> NoReturn:
    print_error(error.message)
    raise typer.Exit(int(error.exit_code))


@contextmanager
def detachable(hint: str) -> Iterator[None]:
    """Follow something that goes on without us: an API error ends the command as every error does,
    Ctrl-C detaches with `hint` (how to follow it again, on one line to copy) and exit 0."""
    try:
        yield
    except CliError as error:
        fail(error)
    except KeyboardInterrupt:
        error_console.print(hint, markup=False, soft_wrap=True)
        raise typer.Exit(int(ExitCode.OK)) from None


def seconds(timeout: str | None, option: str = "--timeout") -> int | None:
    if timeout is None:
        return None
    try:
        return parse_duration(timeout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


def table(
    title: str | None, columns: list[str], rows: list[list[Any]], *, keep: Collection[str] = ()
) -> Table:
    """A table whose `keep` columns (ids an operator copies) never wrap nor truncate: the others give way."""
    result = Table(title=title, title_justify="left", header_style="bold")
    cells = [["-" if cell is None or cell == "" else str(cell) for cell in row] for row in rows]
    for index, column in enumerate(columns):
        if column in keep:
            widest = max((len(row[index]) for row in cells), default=0)
            result.add_column(column, no_wrap=True, min_width=max(widest, len(column)))
        else:
            result.add_column(column, overflow="fold")
    for row in cells:
        result.add_row(*row)
    return result


def print_budget_exceeded(exceeded: dict[str, Any] | None) -> None:
    """An operator's drain is never refused for a budget; its answer says which one it goes beyond."""
    if exceeded:
        console.print(
            f"goes beyond budget {exceeded['budget']} of pool {exceeded['pool']} "
            f"(max {exceeded['max']}: {exceeded['in_use']} in use, {exceeded['allowed']} allowed); "
            "voluntary disruptions of the pool wait until it is within its budgets again",
            markup=False,
        )


def when(moment: str) -> str:
    return datetime.fromisoformat(moment).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def run(
    ctx: typer.Context,
    output: Output | None,
    action: Callable[[ApiClient], Any],
    render: Callable[[Any], None],
) -> None:
    """Call `action(client)`; print its result as JSON or through `render`; map errors to exit codes."""
    as_json = json_mode(ctx, output)
    try:
        result = action(settings(ctx).client())
    except CliError as error:
        fail(error)
    if as_json:
        print_json(result)
    else:
        render(result)
