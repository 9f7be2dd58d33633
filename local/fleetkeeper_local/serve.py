"""The local control plane, once DynamoDB Local is launched (`python -m fleetkeeper_local run`): moto, the
stage's resources, the fleet, the API, the schedules and the console, until Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.domain.errors import Unavailable
from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper.observability import logger
from fleetkeeper.services.context import default_context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import aws_rules
from fleetkeeper_local.console import FleetConsole, hide_metrics_when_disabled
from fleetkeeper_local.controlplane import ApiServer, LocalResources, activate, provision
from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.images import publish_newer_image, register_template_images
from fleetkeeper_local.restart import has_fleet, reconcile_after_restart
from fleetkeeper_local.scheduler import Ec2EventPump, LocalScheduler
from fleetkeeper_local.seed import TEMPLATES, describe_fleet, seed_demo_fleet
from fleetkeeper_local.stack import (
    API_PORT_ENVIRONMENT,
    DATA_DIR_ENV,
    DEFAULT_API_PORT,
    LocalStack,
    LocalStackError,
    project_root,
)
from fleetkeeper_local.workload import WorkloadSettings, WorkloadSimulator

if TYPE_CHECKING:
    from fleetkeeper_local.__main__ import Synthesis

DEFAULT_TABLE = "fleetkeeper-local"
STOP_GRACE_SECONDS = 5.0


def _tour_target(store: FleetStore) -> tuple[str, str]:
    """A RUNNING worker with a started (RUNNING) instance, and that instance: its drain waits for it.
    The busiest such worker, whose drain also moves its scheduled work."""
    candidates: list[tuple[int, str, str]] = []
    for worker in store.list_workers(status=WorkerStatus.RUNNING, limit=1000).items:
        active = store.active_instances_of(worker.id)
        started = [i.id for i in active if i.state == InstanceState.RUNNING]
        if started:
            candidates.append((len(active), worker.id, started[0]))
    if not candidates:
        return "<worker-id>", "<instance-id>"
    _, worker_id, instance_id = max(candidates)
    return worker_id, instance_id


def _commented(lines: list[tuple[str, str]]) -> list[str]:
    width = max(len(command) for command, _ in lines) + 2
    return [f"  {command:<{width}}# {note}" if note else f"  {command}" for command, note in lines]


def cli_command() -> str:
    """How a new shell runs this clone's `fleetkeeper`: its bin/ shim, relative to the caller's folder
    when that is the clone's root (`make run` runs there), else by its whole path."""
    shim = project_root() / "bin" / "fleetkeeper"
    here = Path(os.environ.get("PWD") or Path.cwd())
    with contextlib.suppress(OSError):
        if here.resolve() == project_root():
            return "bin/fleetkeeper"
    return str(shim)


def _examples(api: str, worker_id: str, instance_id: str) -> str:
    fk, w, i = cli_command(), worker_id, instance_id
    post = "curl -s -H 'Content-Type: application/json' -X POST"
    port = api.rsplit(":", 1)[1]
    # The CLI finds the local API on FLEETKEEPER_API_PORT, as this control plane does.
    follow = [] if port == str(DEFAULT_API_PORT) else [f"  export {API_PORT_ENVIRONMENT}={port}"]
    return "\n".join(
        [
            f"Try it, from a new shell ({worker_id} runs the started instance {instance_id}, so its drain "
            "waits for it):",
            *follow,
            *_commented(
                [
                    (f"{fk} workers", ""),
                    (f"{fk} drain {w} --reason maintenance", "DRAINING; its scheduled work moves"),
                    (f"{fk} drain-status {w} --watch", "Ctrl-C detaches; the drain goes on"),
                    (f"{fk} cancel-drain {w}", "back to RUNNING"),
                    (f"{fk} drain {w} --wait", "then, from another shell:"),
                    (f"{fk} instance state {i} COMPLETED", "its last instance ends the drain"),
                    (f"{fk} audit {w}", "who did what, newest first"),
                ]
            ),
            f"  curl -s {api}/api/v1/workers | python3 -m json.tool",
            f'  {post} {api}/api/v1/instances -d \'{{"template": "lab-small"}}\'',
            f"  {post} {api}/api/v1/pools/batch/drain -d '{{\"timeout_seconds\": 60}}'",
            f"  Swagger UI: {api}/docs",
        ]
    )


def _print_banner(
    api: ApiServer,
    stack: LocalStack,
    resources: LocalResources,
    store: FleetStore,
    workload: WorkloadSimulator | None,
    *,
    synthesis: Synthesis | None,
) -> None:
    table_name = resources.table_name
    print(f"admin API       {api.url}  (OpenAPI: {api.url}/openapi.json)")
    print(f"DynamoDB Local  {stack.dynamodb_endpoint}  table {table_name}")
    if stack.data_dir is None:
        print(
            "state           IN MEMORY: stopping this control plane discards the fleet "
            f"(keep it with --data-dir DIR or {DATA_DIR_ENV})"
        )
    else:
        print(f"state           kept in {stack.data_dir} (EC2 and drain workflows are re-created on restart)")
    if workload is not None:
        print(workload.settings.describe())
    print(f"moto server     {stack.moto_endpoint}  (EC2, Step Functions, EventBridge, SNS, CloudWatch)")
    print(f"drain workflow  {resources.state_machine_arn}")
    print(
        "schedules       reconcile every 5 s, discovery every 30 s, EC2 state changes every 1 s "
        "(FLEETKEEPER_LOCAL_*_SECONDS)"
    )
    if synthesis is not None:
        print(f"IAM policies    {synthesis.banner()}")
    print()
    print(describe_fleet(store))
    print()
    print(_examples(api.url, *_tour_target(store)))
    print()


def _prepare_fleet(
    args: argparse.Namespace, stack: LocalStack, store: FleetStore, ec2: Any, permissions: Any
) -> None:
    # The reconciler launches PENDING workers from the newest AMI matching their template.
    register_template_images(ec2, TEMPLATES)
    if has_fleet(store):
        # Never seed into a kept fleet; bring the emulated EC2 and workflows in line with it instead.
        # The drains it resumes run the functions' code: their requests are evaluated from the start.
        permissions()
        print(f"restarting into the fleet kept in {stack.data_dir or 'the table'}", flush=True)
        reconcile_after_restart(default_context(), ec2)
    elif not args.no_seed:
        seed_demo_fleet(default_context(), ec2, stack.environment()["AWS_REGION"])
    permissions()


def _workload(args: argparse.Namespace) -> WorkloadSimulator | None:
    if not args.workload:
        return None
    settings = WorkloadSettings(
        placements_per_minute=args.workload_rate,
        min_seconds=args.workload_min_seconds,
        max_seconds=args.workload_max_seconds,
        seed=args.workload_seed,
    )
    return WorkloadSimulator(default_context, settings)


def _wait_for_stop() -> None:
    """Until Ctrl-C or SIGTERM. Both handlers are set here: a process started in the background by a
    script inherits SIGINT ignored, and would otherwise never see a Ctrl-C."""
    stop = threading.Event()
    for stopping in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stopping, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def _print_farewell(stack: LocalStack, workload: WorkloadSimulator | None) -> None:
    if workload is not None:
        print(workload.summary())
    # The API instance processes wrote their records when they stopped; the run's record holds them all.
    record = iam_session.record_path()
    if record is not None:
        iam_session.merge_records(record, pattern=".instance-*")
    if iam_session.mode() != "off":
        print("\n".join(iam_session.RUN.report()))
    iam_session.write_record()
    if stack.data_dir is None:
        print("stopped; the fleet was in memory and is gone")
    else:
        print(f"stopped; the fleet is kept in {stack.data_dir}")


def serve(args: argparse.Namespace, stack: LocalStack, api_port: int, synthesis: Synthesis | None) -> int:
    """Serve on `stack` (DynamoDB Local launched) until Ctrl-C or SIGTERM; the exit code."""
    warnings.filterwarnings("ignore", message="No application metrics to publish")
    hide_metrics_when_disabled()
    # The shared logger was built at import, before the line above could reach it.
    logger.setLevel(os.environ["POWERTOOLS_LOG_LEVEL"])
    api: ApiServer | None = None
    background: list[LocalScheduler | Ec2EventPump | FleetConsole | WorkloadSimulator] = []
    workload: WorkloadSimulator | None = None
    evaluation = contextlib.ExitStack()

    recording: list[bool] = []

    def permissions() -> None:
        """From here on every function's AWS requests are evaluated against the policies it deploys
        with: a request its role would not allow fails here as it would on AWS."""
        if synthesis is None or recording:
            return
        synthesis.wait()
        recording.append(evaluation.enter_context(iam_session.recording()))
        print("IAM: evaluating every function's requests against the dev stage's policies", flush=True)

    try:
        stack.start_moto()
        os.environ.update(stack.environment())
        table_name = os.environ.get("TABLE_NAME", DEFAULT_TABLE)
        resources = provision(stack, table_name, suffix="local")
        activate(resources, heartbeat_seconds=int(os.environ.get("DRAIN_HEARTBEAT_SECONDS", "300")))
        store = default_context().store
        ec2 = boto3.client("ec2")
        _prepare_fleet(args, stack, store, ec2, permissions)
        # From here on the control plane meets AWS's limits; the seeding above stood in for a fleet
        # that already exists, and the console's reads stay outside them.
        aws_rules.install_from_environ()
        api = ApiServer(port=api_port).start()
        workload = _workload(args)
        _print_banner(api, stack, resources, store, workload, synthesis=synthesis)
        # EventBridge's parts, locally: the reconcile and discovery schedules, and EC2 state changes.
        # They start after the banner, whose reads they would otherwise slow down for seconds.
        console = FleetConsole(store, rollouts=default_context().rollouts)
        background = [LocalScheduler(), Ec2EventPump(), console]
        if workload is not None:
            background.append(workload)
        for runner in background:
            runner.start()
        print("The local control plane is up. Press Ctrl-C to stop it.", flush=True)
        _wait_for_stop()
    except LocalStackError as exc:
        # A port taken after the pre-check, at the bind: the same message, and everything started stops.
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        # A second Ctrl-C while the servers shut down would leave DynamoDB Local running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Each runner may finish the step it is in, for a few seconds; one still at it is cut short, as a
        # crashed Lambda is (every step is safe to repeat), rather than holding the Ctrl-C up.
        stopping = [threading.Thread(target=r.stop, name="stop", daemon=True) for r in background]
        for thread in stopping:
            thread.start()
        deadline = time.monotonic() + STOP_GRACE_SECONDS
        for thread in stopping:
            thread.join(max(deadline - time.monotonic(), 0))
        if api is not None:
            api.stop()
        evaluation.close()
        stack.stop()
    _print_farewell(stack, workload)
    return 0


def publish_image(args: argparse.Namespace) -> int:
    """A newer image for one template of the running local stack (docs/rollouts.md)."""
    stack = LocalStack.from_environ()
    os.environ.update(stack.environment())
    table_name = os.environ.get("TABLE_NAME", DEFAULT_TABLE)
    try:
        template = FleetStore(boto3.client("dynamodb"), table_name).find_template(args.template)
    except (BotoCoreError, ClientError, Unavailable) as exc:
        print(f"error: the local stack does not answer ({exc}); start it with `make run`", file=sys.stderr)
        return 2
    if template is None:
        print(f"error: no template '{args.template}' in table {table_name}", file=sys.stderr)
        return 3
    image_id, name = publish_newer_image(
        boto3.client("ec2", region_name=args.region), template.ami_name_filter
    )
    print(
        f"published {image_id} ({name}) for '{template.ami_name_filter}' in {args.region}: the workers "
        "of every template with that filter show drift `image` after the next reconcile cycle"
    )
    return 0


def simulate(args: argparse.Namespace) -> int:
    """A health signal on one machine of the running local stack (docs/repair.md, "Locally"), or an
    instance type out of capacity (docs/fault-injection.md)."""
    from fleetkeeper.domain.durations import parse_duration  # noqa: PLC0415
    from fleetkeeper_local import ec2_time, health  # noqa: PLC0415

    stack = LocalStack.from_environ()
    os.environ.update(stack.environment())
    ec2 = boto3.client("ec2", region_name=args.region)
    try:
        if args.signal == "ice":
            ec2_time.set_capacity(ec2, args.instance_id, available=args.off)
            print(
                f"{args.instance_id} in {args.region}: " + ("capacity again" if args.off else "no capacity")
            )
        elif args.signal == "retirement":
            within = parse_duration(args.within)
            if within is None:
                print(f"error: --in {args.within!r} is not a duration such as 2h or 90m", file=sys.stderr)
                return 2
            event_id = health.retire(ec2, args.instance_id, within=within, code=args.code)
            print(f"{args.instance_id}: {args.code} ({event_id}) in {args.within}")
        elif args.signal == "impair":
            health.impair(ec2, args.instance_id)
            print(f"{args.instance_id}: instance status impaired")
        elif args.signal == "silence":
            health.impair(ec2, args.instance_id, status=health.SILENT)
            print(f"{args.instance_id}: no status (insufficient-data)")
        elif args.signal == "disconnect":
            health.disconnect(ec2, args.instance_id)
            print(f"{args.instance_id}: SSM agent ConnectionLost")
        else:
            health.recover(ec2, args.instance_id)
            print(f"{args.instance_id}: checks pass, the agent answers; a scheduled event is cancelled")
    except (BotoCoreError, ClientError) as exc:
        print(f"error: the local stack does not answer or has no such machine ({exc})", file=sys.stderr)
        return 2
    return 0
