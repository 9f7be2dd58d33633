"""Restarting the local control plane into a kept table (`--data-dir`).

DynamoDB Local keeps the table in the data directory, but moto keeps nothing: after a restart the
emulated EC2 has none of the fleet's machines and Step Functions none of the drain executions. Left
alone, the reconciler and discovery would read every machine as lost and end the fleet. Instead the
restart reconciles that side on purpose, and says so line by line:

- each worker that had a machine (PROVISIONING through STOPPED) gets a new emulated machine, tagged as
  before; a STOPPING or STOPPED worker's machine is stopped again. The worker records the new instance id
  (audit action `WorkerMachineRecreated`).
- each drain that was running (a worker's or a pool's) gets a new execution of the same generation, with
  the same deadline, so it ends as it would have (at once if its deadline passed). Its audit action is
  `WorkerDrainResumed` (`PoolDrainResumed`): the drain goes on, it was neither cancelled nor restarted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.drain_policy import drain_deadline
from fleetkeeper.domain.errors import FleetkeeperError
from fleetkeeper.domain.lifecycle import PoolStatus, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, Pool, Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE, POOL_TAG, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper.services import drains
from fleetkeeper.services.context import Context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.controlplane import ensure_worker_profile
from fleetkeeper_local.images import register_template_images, stock_image

RESTART_ACTOR = "local-restart"
RESUMED_REASON = "its workflow was lost in a restart of the local control plane; same drain, new execution"
WITH_MACHINE = frozenset(
    {
        WorkerStatus.PROVISIONING,
        WorkerStatus.STARTING,
        WorkerStatus.RUNNING,
        WorkerStatus.DRAINING,
        WorkerStatus.STOPPING,
        WorkerStatus.STOPPED,
    }
)
STOPPED_MACHINE = frozenset({WorkerStatus.STOPPING, WorkerStatus.STOPPED})


def has_fleet(store: FleetStore) -> bool:
    """Whether the table holds anything an operator made: a template, a pool or a worker."""
    return bool(store.list_templates() or store.list_pools() or store.list_workers(limit=1).items)


def _all_workers(store: FleetStore) -> Iterator[Worker]:
    token: str | None = None
    while True:
        page = store.list_workers(limit=1000, next_token=token)
        yield from page.items
        token = page.next_token
        if not token:
            return


def _launch(ec2: Any, worker: Worker, template: WorkerTemplate | None, image_id: str) -> dict[str, Any]:
    tags = [
        {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
        {"Key": WORKER_ID_TAG, "Value": worker.id},
        {"Key": TEMPLATE_TAG, "Value": worker.template},
        {"Key": "Name", "Value": f"fleetkeeper-{worker.id}"},
    ]
    if worker.pool:
        tags.append({"Key": POOL_TAG, "Value": worker.pool})
    reservation = ec2.run_instances(
        ImageId=image_id,
        InstanceType=template.instance_type if template else "m5.large",
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        # Registered with Systems Manager, as a stage's workers are: Run Command reaches it.
        IamInstanceProfile={"Name": ensure_worker_profile()},
    )
    return dict(reservation["Instances"][0])


def recreate_machines(ctx: Context, ec2: Any, say: Callable[[str], None]) -> int:
    store = ctx.store
    templates = {t.name: t for t in store.list_templates()}
    images = register_template_images(ec2, templates.values())
    fallback_image = stock_image(ec2)
    count = 0
    for worker in _all_workers(store):
        if worker.status not in WITH_MACHINE or not worker.ec2_instance_id:
            continue
        template = templates.get(worker.template)
        image_id = images.get(template.ami_name_filter, fallback_image) if template else fallback_image
        launched = _launch(ec2, worker, template, image_id)
        new_id = launched["InstanceId"]
        if worker.status in STOPPED_MACHINE:
            ec2.stop_instances(InstanceIds=[new_id])
        store.update_worker(
            worker,
            {
                "ec2_instance_id": new_id,
                "private_ip": launched.get("PrivateIpAddress"),
                "public_ip": launched.get("PublicIpAddress"),
                # The stand-in runs the template's image as registered again after the reset: the image
                # the worker ran is gone with moto, so keeping its id would report a drift nobody made.
                # Its launch time stays: the worker is as old as it was.
                "image_id": launched["ImageId"],
                "instance_type": launched["InstanceType"],
            },
            actor=RESTART_ACTOR,
            action="WorkerMachineRecreated",
            reason=f"the emulated EC2 was reset by a restart; {worker.ec2_instance_id} re-created",
        )
        say(f"worker {worker.id} ({worker.status}): machine {worker.ec2_instance_id} re-created as {new_id}")
        count += 1
    return count


def _resume_worker_drain(ctx: Context, worker_id: str) -> Worker | None:
    """Point the open drain at a new execution of the same generation and deadline, and start it."""

    def claim() -> Worker | None:
        worker = ctx.store.get_worker(worker_id)
        record = worker.drain
        if worker.status != WorkerStatus.DRAINING or record is None or record.outcome != DrainOutcome.RUNNING:
            return None
        name = drains.execution_name("drain", worker.id, record.generation, record.restarts)
        # The old execution's task token died with it; the new one stores its own.
        resumed = record.model_copy(
            update={"execution_arn": ctx.workflows.execution_arn(name), "task_token": None}
        )
        return ctx.store.update_worker(
            worker,
            {"drain": resumed},
            actor=RESTART_ACTOR,
            action="WorkerDrainResumed",
            reason=RESUMED_REASON,
        )

    worker = retry_conflicts(claim)
    if worker is None or worker.drain is None:
        return None
    drains.launch_worker_drain(ctx, worker.id, worker.drain)
    return worker


def _resume_pool_drain(ctx: Context, name: str) -> Pool | None:
    def claim() -> Pool | None:
        pool = ctx.store.get_pool(name)
        if pool.status != PoolStatus.DRAINING or pool.drain_outcome != DrainOutcome.RUNNING:
            return None
        execution = drains.execution_name("pool", pool.name, pool.drain_generation, pool.drain_restarts)
        changes = {"drain_execution_arn": ctx.workflows.execution_arn(execution), "drain_task_token": None}
        return ctx.store.save_pool(
            pool, changes, actor=RESTART_ACTOR, action="PoolDrainResumed", reason=RESUMED_REASON
        )

    pool = retry_conflicts(claim)
    if pool is None:
        return None
    drains.launch_pool_drain(ctx, pool)
    return pool


def _lost(what: str, deadline: datetime) -> str:
    left = max(0, int((deadline - utcnow()).total_seconds()))
    return f"drain of {what}: its workflow was lost in the restart; resumed with {left} s left"


def resume_drains(ctx: Context, say: Callable[[str], None]) -> int:
    """Give each running drain a new execution: same generation, same deadline, audited as resumed."""
    count = 0
    for worker in _all_workers(ctx.store):
        record = worker.drain
        if worker.status != WorkerStatus.DRAINING or record is None or record.outcome != DrainOutcome.RUNNING:
            continue
        try:
            resumed = _resume_worker_drain(ctx, worker.id)
        except (FleetkeeperError, ClientError, BotoCoreError) as exc:
            say(f"drain of {worker.id} could not be resumed: {exc}; drain it again by hand")
            continue
        if resumed is not None:
            say(_lost(worker.id, record.deadline))
            count += 1
    for pool in ctx.store.list_pools():
        if pool.status != PoolStatus.DRAINING or pool.drain_outcome != DrainOutcome.RUNNING:
            continue
        try:
            resumed_pool = _resume_pool_drain(ctx, pool.name)
        except (FleetkeeperError, ClientError, BotoCoreError) as exc:
            say(f"drain of pool {pool.name} could not be resumed: {exc}; drain it again by hand")
            continue
        if resumed_pool is not None:
            started = resumed_pool.drain_started_at or utcnow()
            say(_lost(f"pool {pool.name}", drain_deadline(started, resumed_pool.drain_timeout_seconds or 0)))
            count += 1
    return count


def reconcile_after_restart(ctx: Context, ec2: Any, say: Callable[[str], None] = print) -> None:
    """Bring the fresh emulated EC2 and Step Functions in line with the kept table."""
    machines = recreate_machines(ctx, ec2, say)
    resumed = resume_drains(ctx, say)
    say(f"restart: {machines} machine(s) re-created, {resumed} drain(s) resumed")
