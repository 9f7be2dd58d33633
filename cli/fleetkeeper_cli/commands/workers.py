"""`fleetkeeper workers`, `worker show` and `stats`: the workers and the fleet's counters."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from fleetkeeper_cli.output import OutputOption, console, run, table

WORKER_COLUMNS = ["id", "status", "pool", "template", "active/capacity", "drain"]


def _drain_cell(worker: dict[str, Any]) -> str:
    drain = worker.get("drain")
    if not drain:
        return "-"
    return f"{drain['outcome']} (gen {drain['generation']})"


def _drift_cell(worker: dict[str, Any]) -> str:
    drift = worker.get("drift")
    return ",".join(drift["reasons"]) if drift else "-"


def _drift_rows(worker: dict[str, Any]) -> list[list[Any]]:
    drift = worker.get("drift")
    if not drift:
        return [["drift", "-"]]
    desired = drift.get("desired") or {}
    return [
        ["drift", _drift_cell(worker)],
        ["drift.since", drift.get("since")],
        ["desired.image_id", desired.get("image_id")],
        ["desired.instance_type", desired.get("instance_type")],
    ]


def worker_rows(items: list[dict[str, Any]]) -> list[list[Any]]:
    return [
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


def list_workers(
    ctx: typer.Context,
    status: Annotated[str | None, typer.Option(help="only workers in this status, e.g. RUNNING")] = None,
    pool: Annotated[str | None, typer.Option(help="only workers of this pool")] = None,
    template: Annotated[str | None, typer.Option(help="only workers of this template")] = None,
    drifted: Annotated[
        bool,
        typer.Option(
            "--drifted",
            help="only workers whose machine differs from their template (image, instance type, "
            "lifetime), with why",
        ),
    ] = False,
    output: OutputOption = None,
) -> None:
    """List workers: id, status, pool, template, active/capacity, drain (and drift with --drifted)."""
    columns = [*WORKER_COLUMNS, "drift"] if drifted else WORKER_COLUMNS

    def rows(items: list[dict[str, Any]]) -> list[list[Any]]:
        if not drifted:
            return worker_rows(items)
        by_id = {w["id"]: w for w in items}
        return [[*row, _drift_cell(by_id[row[0]])] for row in worker_rows(items)]

    run(
        ctx,
        output,
        lambda c: c.pages(
            "/api/v1/workers",
            status=status,
            pool=pool,
            template=template,
            # Only a filter when asked: without --drifted every worker is listed, drifted or not.
            drifted="true" if drifted else None,
            limit=1000,
        ),
        lambda items: console.print(table(None, columns, rows(items), keep={"id"})),
    )


def show(
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
                "image_id",
                "instance_type",
                "launched_at",
                "version",
                "created_at",
                "updated_at",
            )
        ]
        rows.insert(6, ["instances", f"{worker['active_instances']}/{worker['capacity']}"])
        rows += [[f"drain.{k}", v] for k, v in drain.items() if v is not None]
        rows += _drift_rows(worker)
        fields = table(None, ["field", "value"], rows)
        fields.show_header = False
        console.print(fields)

    run(ctx, output, lambda c: c.get(f"/api/v1/workers/{worker_id}"), render)


def stats(ctx: typer.Context, output: OutputOption = None) -> None:
    """Workers by status, pools by status, active instances, reconcile and discovery counters."""

    def render(body: dict[str, Any]) -> None:
        rows = [[f"workers {k}", v] for k, v in sorted(body.get("workers_by_status", {}).items())]
        rows += [[f"pools {k}", v] for k, v in sorted(body.get("pools_by_status", {}).items())]
        rows.append(["active instances", body.get("active_instances")])
        for group, counters in sorted(body.get("counters", {}).items()):
            rows += [[f"{group}.{k}", v] for k, v in sorted(counters.items())]
        console.print(table(None, ["", "value"], rows))

    run(ctx, output, lambda c: c.get("/api/v1/stats"), render)
