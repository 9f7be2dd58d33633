"""`fleetkeeper instances`, `place`, `instance state` and `complete`: workload instances."""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

import typer

from fleetkeeper_cli.client import ApiClient
from fleetkeeper_cli.output import OutputOption, console, run, table

INSTANCE_COLUMNS = ["id", "state", "worker", "template", "pool", "reason"]
# What a workload reports about its own instance; the API refuses any other move (409 naming it).
REPORTED_STATES = "INSTANTIATING, RUNNING, COMPLETED, FAILED or TERMINATED"


class Strategy(StrEnum):
    PACK = "pack"
    SPREAD = "spread"


def _instance_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
        [i["id"], i["state"], i["worker_id"], i.get("template"), i.get("pool"), i.get("reason")]
        for i in items
    ]


def _print_instance(instance: dict[str, Any]) -> None:
    console.print(f"instance {instance['id']} {instance['state']}")


def list_instances(
    ctx: typer.Context,
    worker: Annotated[str | None, typer.Option("--worker", help="only this worker's instances")] = None,
    state: Annotated[str | None, typer.Option(help="only instances in this state, e.g. RUNNING")] = None,
    output: OutputOption = None,
) -> None:
    """List workload instances."""
    run(
        ctx,
        output,
        lambda c: c.pages("/api/v1/instances", worker_id=worker, state=state, limit=1000),
        lambda items: console.print(
            table(None, INSTANCE_COLUMNS, _instance_rows(items), keep={"id", "worker"})
        ),
    )


def place(
    ctx: typer.Context,
    template: Annotated[str | None, typer.Option(help="template the instance needs")] = None,
    pool: Annotated[str | None, typer.Option(help="pool to place it in")] = None,
    worker: Annotated[str | None, typer.Option("--worker", help="this worker and no other")] = None,
    strategy: Annotated[
        Strategy, typer.Option(help="pack fills busy workers first; spread the emptiest")
    ] = Strategy.PACK,
    timeslot_start: Annotated[
        str | None,
        typer.Option(
            help="when its session starts (ISO 8601); in a pool that books, no room waits for capacity"
        ),
    ] = None,
    output: OutputOption = None,
) -> None:
    """Place a workload instance on a RUNNING worker with room (it starts SCHEDULED), or book it."""
    body = {
        "template": template,
        "pool": pool,
        "worker_id": worker,
        "strategy": strategy.value,
        "timeslot_start": timeslot_start,
    }
    run(
        ctx,
        output,
        lambda c: c.post("/api/v1/instances", {k: v for k, v in body.items() if v is not None}),
        _print_placed,
    )


def _print_placed(instance: dict[str, Any]) -> None:
    if instance.get("worker_id") is None:
        console.print(
            f"instance {instance['id']} {instance['state']}: expected on a RUNNING worker by "
            f"{instance.get('expected_ready_by')}",
            markup=False,
        )
        return
    console.print(f"instance {instance['id']} {instance['state']} on worker {instance['worker_id']}")


def _report(instance_id: str, state: str, reason: str | None) -> Callable[[ApiClient], Any]:
    body = {"state": state, **({"reason": reason} if reason else {})}
    return lambda c: c.post(f"/api/v1/instances/{instance_id}/state", body)


def report_state(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(help="instance id")],
    state: Annotated[str, typer.Argument(help=f"the state it reached: {REPORTED_STATES}")],
    reason: Annotated[str | None, typer.Option(help="why; kept on the instance")] = None,
    output: OutputOption = None,
) -> None:
    """Report the state a workload instance reached, as the workload does (e.g. RUNNING once it started)."""
    run(ctx, output, _report(instance_id, state.upper(), reason), _print_instance)


def complete(
    ctx: typer.Context,
    instance_id: Annotated[str, typer.Argument(help="instance id")],
    reason: Annotated[str | None, typer.Option(help="why it ended")] = None,
    output: OutputOption = None,
) -> None:
    """Mark a workload instance COMPLETED, freeing its slot (`instance state ID COMPLETED`)."""
    run(ctx, output, _report(instance_id, "COMPLETED", reason), _print_instance)
