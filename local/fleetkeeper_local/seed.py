"""A small demo fleet: templates, pools, workers backed by emulated EC2 instances, a few placements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetkeeper.cloud.ec2 import Ec2Gateway
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy
from fleetkeeper.domain.lifecycle import Cause, InstanceState, WorkerStatus
from fleetkeeper.domain.models import Instance, Worker, WorkerTemplate
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE, POOL_TAG, TEMPLATE_TAG, WORKER_ID_TAG
from fleetkeeper.services import catalog, instances, placement, workers
from fleetkeeper.services.context import Context
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import ec2_time
from fleetkeeper_local.controlplane import ensure_worker_profile
from fleetkeeper_local.images import stock_image

SEED_ACTOR = "seed"
# One lab worker disrupted at a time (docs/disruption.md).
LAB_BUDGETS = DisruptionPolicy(budgets=[Budget(max=1)])

TEMPLATES = [
    WorkerTemplate(name="lab-small", instance_type="m5.large", ami_name_filter="fleet-lab-*", capacity=4),
    WorkerTemplate(
        name="lab-large",
        instance_type="m5.2xlarge",
        ami_name_filter="fleet-lab-*",
        capacity=8,
        drain_timeout_hours=6,
    ),
    WorkerTemplate(
        name="batch",
        instance_type="c5.xlarge",
        ami_name_filter="fleet-batch-*",
        capacity=6,
        drain_timeout_hours=1,
    ),
]

# (template, pool, running?) for each demo worker; the last one waits to be provisioned.
WORKERS = [
    ("lab-small", "labs", True),
    ("lab-small", "labs", True),
    ("lab-large", "labs", True),
    ("batch", "batch", True),
    ("batch", "batch", True),
    ("lab-small", "labs", False),
]

# (template, pool, started?) for each demo instance. A started one is RUNNING: a drain waits for it (a drain
# in progress to watch, and to cancel); one not started yet is SCHEDULED, and a drain moves it to another
# worker with room (the lab-small and batch workers have a twin).
PLACEMENTS = [
    ("lab-small", "labs", True),
    ("lab-small", "labs", False),
    ("lab-large", "labs", True),
    ("batch", "batch", False),
]


@dataclass
class SeededFleet:
    workers: list[Worker]
    instances: list[Instance]


def _launch(ec2: Any, worker: Worker, image_id: str) -> dict[str, Any]:
    tags = [
        {"Key": MANAGED_BY_TAG, "Value": MANAGED_BY_VALUE},
        {"Key": WORKER_ID_TAG, "Value": worker.id},
        {"Key": TEMPLATE_TAG, "Value": worker.template},
        {"Key": "Name", "Value": f"fleetkeeper-{worker.id}"},
    ]
    if worker.pool:
        tags.append({"Key": POOL_TAG, "Value": worker.pool})
    template = next(t for t in TEMPLATES if t.name == worker.template)
    reservation = ec2.run_instances(
        ImageId=image_id,
        InstanceType=template.instance_type,
        MinCount=1,
        MaxCount=1,
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags}],
        # Registered with Systems Manager, as a stage's workers are: Run Command reaches it.
        IamInstanceProfile={"Name": ensure_worker_profile()},
    )
    return dict(reservation["Instances"][0])


def seed_demo_fleet(ctx: Context, ec2: Any, region: str) -> SeededFleet:
    """Seed the demo fleet; running it twice adds a second set of workers, never breaks the first."""
    store = ctx.store
    for template in TEMPLATES:
        catalog.put_template(store, template, actor=SEED_ACTOR)
    # The lab pool takes one worker out of service at a time, whatever takes it (a rollout, expiry,
    # scale-down): as a stage's pools should, rather than lean on the stage default (README, Quick start).
    catalog.put_pool(store, "labs", actor=SEED_ACTOR, disruption=LAB_BUDGETS)
    catalog.ensure_pool(store, "batch", actor=SEED_ACTOR)

    fallback = stock_image(ec2)
    # Each worker runs its template's image, as the reconciler would launch it, so the demo fleet starts
    # without drift (docs/rollouts.md); an Amazon image stands in where no template image is registered.
    gateway = Ec2Gateway(ec2)
    images = {t.name: gateway.newest_image(t.ami_name_filter, owners=["self"]) or fallback for t in TEMPLATES}
    seeded: list[Worker] = []
    for template_name, pool, running in WORKERS:
        worker = workers.create_worker(
            store, template=template_name, region=region, pool=pool, actor=SEED_ACTOR
        )
        if running:
            # The demo fleet stands for machines that run already: no boot to wait for.
            with ec2_time.instant():
                launched = _launch(ec2, worker, images[template_name])
            worker = store.transition_worker(
                worker,
                WorkerStatus.PROVISIONING,
                cause=Cause.CONTROL,
                actor=SEED_ACTOR,
                reason="demo fleet",
                changes={
                    "ec2_instance_id": launched["InstanceId"],
                    "image_id": launched["ImageId"],
                    "instance_type": launched["InstanceType"],
                    "launched_at": launched["LaunchTime"],
                },
            )
            worker = store.transition_worker(
                worker,
                WorkerStatus.RUNNING,
                cause=Cause.EC2,
                actor=SEED_ACTOR,
                reason="EC2 reports running",
                changes={
                    "private_ip": launched.get("PrivateIpAddress"),
                    "public_ip": launched.get("PublicIpAddress"),
                },
            )
        seeded.append(worker)

    placed: list[Instance] = []
    for template_name, pool, started in PLACEMENTS:
        instance = placement.place_instance(store, actor=SEED_ACTOR, template=template_name, pool=pool)
        if started:
            instance = instances.change_instance_state(
                ctx, instance.id, InstanceState.RUNNING, actor=SEED_ACTOR, reason="demo workload"
            )
        placed.append(instance)
    return SeededFleet(workers=[store.get_worker(w.id) for w in seeded], instances=placed)


def describe_fleet(store: FleetStore) -> str:
    """A plain-text table of every worker and the instances it runs."""
    lines = [
        f"{'worker':<20} {'template':<10} {'pool':<6} {'status':<12} {'ec2 instance':<20} slots  instances"
    ]
    page = store.list_workers(limit=1000)
    for worker in sorted(page.items, key=lambda w: (w.pool or "", w.template, w.id)):
        running = [f"{i.id} ({i.state})" for i in store.active_instances_of(worker.id)]
        lines.append(
            f"{worker.id:<20} {worker.template:<10} {worker.pool or '-':<6} {worker.status:<12} "
            f"{worker.ec2_instance_id or '-':<20} {worker.active_instances}/{worker.capacity:<4} "
            f"{', '.join(running) or '-'}"
        )
    return "\n".join(lines)
