"""Provisioning a PENDING worker: launch (claimed first), adopt a machine an earlier attempt started, or
retire a worker abandoned after its launch was claimed without leaving its machine behind.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from fleetkeeper.cloud.ec2 import Ec2Gateway, Ec2Instance
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.launch import refused_instance_type
from fleetkeeper.domain.lead_time import LeadKind, coming_up
from fleetkeeper.domain.lifecycle import Cause, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.reconcile import LAUNCH_CLAIM_TTL, Outcome, Step, launch_may_have_run
from fleetkeeper.domain.tags import (
    MANAGED_BY_TAG,
    MANAGED_BY_VALUE,
    POOL_TAG,
    TEMPLATE_TAG,
    WORKER_ID_TAG,
    tag_problem,
)
from fleetkeeper.observability import logger
from fleetkeeper.services.context import Context
from fleetkeeper.services.reconcile.actions import (
    ACTOR,
    LAUNCH_FORGOTTEN,
    apply_transition,
    fail,
    reset_backoff,
)
from fleetkeeper.services.reconcile.images import NewestImages

# EC2 states of a machine that is gone or going: nothing to adopt or to terminate.
_ENDING_STATES = frozenset({"terminated", "shutting-down"})


def launch_tags(ctx: Context, worker: Worker, template_tags: Mapping[str, str]) -> dict[str, str]:
    """Region defaults, then template tags, then fleetkeeper's own tags, which always win."""
    region = ctx.settings.region_configs.get(worker.region)
    tags = {**(region.default_tags if region else {}), **template_tags}
    tags.update(
        {
            "Name": f"fleetkeeper-{worker.id}",
            MANAGED_BY_TAG: MANAGED_BY_VALUE,
            WORKER_ID_TAG: worker.id,
            TEMPLATE_TAG: worker.template,
        }
    )
    if worker.pool:
        tags[POOL_TAG] = worker.pool
    return tags


def machines_of(gateway: Ec2Gateway, worker: Worker) -> list[Ec2Instance]:
    """The live machines tagged with this worker's id (a launch the worker never heard back from)."""
    found = gateway.describe_managed([{"Name": f"tag:{WORKER_ID_TAG}", "Values": [worker.id]}])
    return [machine for machine in found if machine.state not in _ENDING_STATES]


def launch(
    ctx: Context, worker: Worker, now: datetime, counters: Counter[str], images: NewestImages | None = None
) -> Outcome:
    """Template, region config, newest AMI, RunInstances, PROVISIONING (docs/lifecycle.md)."""
    template = ctx.store.find_template(worker.template)
    if template is None:
        return fail(ctx, worker, f"template '{worker.template}' not found", counters)
    # A template older than the stage's instance_types: IAM would deny the launch, say why instead.
    # A pinned worker (a rollback's) launches as its old machine was launched.
    instance_type = worker.pinned_instance_type or template.instance_type
    refusal = refused_instance_type(instance_type, ctx.settings.instance_types)
    if refusal:
        where = "pinned launch" if worker.pinned_instance_type else f"template '{template.name}'"
        return fail(ctx, worker, f"{where}: {refusal}", counters)
    configs = ctx.settings.region_configs
    region = configs.get(worker.region)
    if configs and region is None:
        return fail(ctx, worker, f"no region config for {worker.region}", counters)
    # A tag EC2 refuses (a template stored before the API checked tags, or a region's default tags)
    # fails this worker alone, before any call: never a launch that poisons what EC2 answers later.
    tags = launch_tags(ctx, worker, template.tags)
    problem = tag_problem(tags)
    if problem:
        reason = f"template '{template.name}' launches with tags EC2 refuses: {problem}"
        return fail(ctx, worker, reason, counters)
    gateway = ctx.ec2(worker.region)

    if worker.launch_claimed_at is not None and now - worker.launch_claimed_at < LAUNCH_CLAIM_TTL:
        return Outcome.SKIP  # another reconciler is launching it right now
    if launch_may_have_run(worker):
        # A reconciler died mid-launch, or an earlier attempt failed after RunInstances may have gone
        # through: adopt the machine it may have started instead of launching a second one.
        adopted = next(iter(machines_of(gateway, worker)), None)
        if adopted is not None:
            return _provisioned(ctx, worker, adopted, now, counters, adopted=True)

    closed = _pool_closed(ctx, worker)
    if closed is not None:
        # Never launched: a pool being drained takes no new machine (it waits), an inactive one never.
        if closed == PoolStatus.DRAINING:
            return Outcome.SKIP
        ctx.store.transition_worker(
            worker,
            WorkerStatus.TERMINATED,
            cause=Cause.CONTROL,
            actor=ACTOR,
            reason=f"pool {worker.pool} is {closed}: never launched",
            changes={"status_reason": f"pool {worker.pool} is {closed}", **LAUNCH_FORGOTTEN},
        )
        counters["launches_abandoned"] += 1
        return Outcome.SUCCESS

    # An earlier launch whose answer may be lost is repeated as it was sent: same token, same image.
    image_id = worker.launch_image_id if worker.launch_token else None
    token = worker.launch_token
    if image_id is None or token is None:
        image_id = worker.pinned_image_id or (images or NewestImages(ctx)).newest(
            template.ami_name_filter, worker.region
        )
        if image_id is None:
            return fail(ctx, worker, f"no AMI matches '{template.ami_name_filter}'", counters)
        token = f"fk-{worker.id}-{image_id}"[:64]

    # The claim: of two reconcilers that read the same PENDING worker, only one wins this write. It
    # carries the launch's ClientToken, so whoever repeats the launch repeats this very request.
    claimed = ctx.store.update_worker(
        worker,
        {"launch_claimed_at": now, "launch_token": token, "launch_image_id": image_id},
        actor=ACTOR,
        action="LaunchClaimed",
        reason=image_id,
    )
    instance = gateway.run_instance(
        image_id=image_id,
        instance_type=instance_type,
        tags=tags,
        # The same token returns the machine an earlier attempt started instead of starting another.
        client_token=token,
        subnet_id=region.subnet_id if region else None,
        security_group_ids=region.security_group_ids if region else (),
        key_name=region.key_name if region else None,
        instance_profile=ctx.settings.worker_instance_profile,
    )
    return _provisioned(ctx, claimed, instance, now, counters, image_id=image_id, instance_type=instance_type)


def _pool_closed(ctx: Context, worker: Worker) -> PoolStatus | None:
    """The worker's pool's status when it is not active (None: active, or no pool)."""
    if worker.pool is None:
        return None
    pool = ctx.store.find_pool(worker.pool)
    if pool is None or pool.status == PoolStatus.ACTIVE:
        return None
    return pool.status


def retire_launched(ctx: Context, worker: Worker, step: Step, counters: Counter[str]) -> Outcome:
    """A PENDING worker abandoned after its launch was claimed: terminate what the launch started first.

    The worker is marked TERMINATED only after the terminate calls returned; a crash in between leaves it
    PENDING with its claim, so the next cycle looks again. Discovery terminates any machine that still
    turns up later for this worker (see services/discovery.py).
    """
    # The cycle read the worker from the status index, which may lag: terminating is not conditional,
    # so it acts only on the item as it is now.
    fresh = ctx.store.get_worker(worker.id)
    if fresh.version != worker.version:
        raise StaleWrite("worker", worker.id, str(fresh.status))
    gateway = ctx.ec2(worker.region)
    machines = machines_of(gateway, worker)
    for machine in machines:
        gateway.terminate(machine.instance_id)
        counters["abandoned_launches_terminated"] += 1
        logger.info(
            "machine of an abandoned launch terminated", worker_id=worker.id, instance_id=machine.instance_id
        )
    changes: dict[str, Any] = {"launch_claimed_at": None, **LAUNCH_FORGOTTEN}
    if machines:
        # The worker keeps the machine's id, so its history shows what was ended.
        # Its time makes any older event about the machine stale.
        changes.update(
            {
                "ec2_instance_id": machines[0].instance_id,
                "ec2_state": "shutting-down",
                "ec2_observed_at": utcnow(),
            }
        )
    apply_transition(
        ctx, worker, Step(step.outcome, step.reason, target=step.target, changes=changes), counters
    )
    return step.outcome


def _provisioned(
    ctx: Context,
    worker: Worker,
    instance: Ec2Instance,
    now: datetime,
    counters: Counter[str],
    *,
    image_id: str | None = None,
    instance_type: str | None = None,
    adopted: bool = False,
) -> Outcome:
    # What the machine runs, recorded with the launch itself: drift (domain/drift.py) compares it with
    # what the template would launch now. An adopted machine says for itself what it was launched with.
    launched = {
        "image_id": image_id or instance.image_id,
        "instance_type": instance.instance_type or instance_type,
        "launched_at": instance.launch_time or now,
    }
    ctx.store.transition_worker(
        worker,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor=ACTOR,
        reason="adopted an instance launched earlier" if adopted else "EC2 instance launched",
        action="WorkerProvisioned",
        changes={
            "ec2_instance_id": instance.instance_id,
            "ec2_state": instance.state,
            "ec2_observed_at": now,
            "launch_claimed_at": None,
            **LAUNCH_FORGOTTEN,
            **reset_backoff(worker),
            **launched,
            # The lead time runs from the RunInstances that started it (an adopted machine's own launch).
            **coming_up(LeadKind.LAUNCH, (instance.launch_time or now) if adopted else now),
        },
    )
    counters["provisioned_count"] += 1
    scaling_audit(
        ctx,
        "Worker Provisioned",
        {
            "worker_id": worker.id,
            "template": worker.template,
            "region": worker.region,
            "pool": worker.pool,
            "ec2_instance_id": instance.instance_id,
            "image_id": launched["image_id"],
            "instance_type": launched["instance_type"],
            "adopted": adopted,
        },
    )
    return Outcome.SUCCESS


def scaling_audit(ctx: Context, detail_type: str, detail: Mapping[str, Any]) -> None:
    """A scaling audit record on the audit bus; the worker's own audit item is already in the table."""
    try:
        ctx.audit.publish(detail_type, detail)
    except Exception:  # the audit item in the table is the record; the event is a copy
        logger.exception("audit event not published", detail_type=detail_type)
