"""Provisioning PENDING workers: launched in batches, each worker claiming its place first; adopting
what an earlier claimed launch started; retiring a worker abandoned after its launch was claimed without
leaving its machine behind.

A cycle's launches that differ only in their workers share one RunInstances (docs/capacity.md, "One
launch call per batch"):

1. each worker alone: its template and tags checked, a launch in flight waited for, the machine its
   earlier claimed launch started adopted, a closed pool's worker held or retired, its image picked;
2. the launches alike (region, image, instance type, tags but the worker's own) grouped into batches of
   at most LAUNCH_BATCH_LIMIT; each worker claims its place in its own conditional write: the batch id
   (the call's ClientToken, also tagged on its machines), its index and the batch's count;
3. one RunInstances per batch, MinCount 1 and MaxCount the count;
4. worker i paired with the machine whose AmiLaunchIndex is i, each in its own conditional write, then
   its own tags (worker id, name) written on that machine. A worker the answer holds no machine for was
   refused for capacity, as a launch EC2 refused is.

A batch whose answer was lost is found again by its tag, each worker adopting the machine at its index,
or repeated exactly as claimed, so EC2 answers with the machines it started instead of starting more.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any, Final

from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.cloud.ec2 import Ec2Instance, short_launch
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.launch import refused_instance_type
from fleetkeeper.domain.lead_time import LeadKind, coming_up
from fleetkeeper.domain.lifecycle import Cause, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Worker, utcnow
from fleetkeeper.domain.reconcile import LAUNCH_CLAIM_TTL, Outcome, Step
from fleetkeeper.domain.tags import (
    BATCH_TAG,
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
    Isolated,
    Result,
    Work,
    apply_transition,
    fail,
    merged,
    raising,
    reset_backoff,
)
from fleetkeeper.services.reconcile.images import NewestImages

# Machines one RunInstances asks for at most. EC2 sets no number of its own but the account's quotas (a
# call beyond them launches what they allow); the bound keeps what one refused or lost answer holds up.
LAUNCH_BATCH_LIMIT: Final = 100
# EC2 states of a machine that is gone or going: nothing to adopt or to terminate.
_ENDING_STATES = frozenset({"terminated", "shutting-down"})


def launch_tags(ctx: Context, worker: Worker, template_tags: Mapping[str, str]) -> dict[str, str]:
    """Region defaults, then template tags, then fleetkeeper's own tags, which always win (the batch tag
    comes with the call)."""
    region = ctx.settings.region_configs.get(worker.region)
    tags = {**(region.default_tags if region else {}), **template_tags}
    tags.update({**own_tags(worker), MANAGED_BY_TAG: MANAGED_BY_VALUE, TEMPLATE_TAG: worker.template})
    if worker.pool:
        tags[POOL_TAG] = worker.pool
    return tags


def own_tags(worker: Worker) -> dict[str, str]:
    """The tags that differ between the machines of a batch: written on each once it is paired."""
    return {"Name": f"fleetkeeper-{worker.id}", WORKER_ID_TAG: worker.id}


def new_batch_id() -> str:
    """A launch batch's id, sent as its RunInstances' ClientToken (64 ASCII characters at most)."""
    return f"fkb-{uuid.uuid4().hex}"


class LaunchedMachines:
    """The live machines of each claimed launch batch, read by its tag once per cycle: the workers of a
    batch whose answer was lost find theirs with one DescribeInstances between them."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._found: dict[tuple[str, str], list[Ec2Instance]] = {}
        self._locks: dict[tuple[str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def of(self, worker: Worker) -> Ec2Instance | None:
        """The machine at the worker's place in its claimed batch, if EC2 launched one."""
        if worker.launch_token is None:
            return None  # no launch claimed, or its answer came: nothing of it is unknown
        key = (worker.region, worker.launch_token)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        # A claim from before batches (no index) launched one machine with the worker's id and no batch
        # tag; a repeat of its token with the batch tag would be another request, which EC2 refuses.
        tag = (
            (BATCH_TAG, worker.launch_token)
            if worker.launch_index is not None
            else (WORKER_ID_TAG, worker.id)
        )
        with lock:
            if key not in self._found:
                tagged = self._ctx.ec2(worker.region).describe_managed(
                    [{"Name": f"tag:{tag[0]}", "Values": [tag[1]]}]
                )
                self._found[key] = [m for m in tagged if m.state not in _ENDING_STATES]
        index = worker.launch_index or 0
        return next((m for m in self._found[key] if m.launch_index == index), None)


@dataclass(frozen=True)
class Batch:
    """One RunInstances: what every machine of it is launched with. Launches with equal batches share
    the call; a claimed batch being repeated carries its own token and count."""

    region: str
    image_id: str
    instance_type: str
    shared_tags: tuple[tuple[str, str], ...]
    token: str | None = None
    count: int = 1


@dataclass(frozen=True)
class Launch:
    """One worker's place in a batch."""

    item: Work
    batch: Batch
    index: int = 0


def launch_all(
    ctx: Context,
    items: list[Work],
    *,
    now: datetime,
    images: NewestImages,
    pool: Executor,
    run: Isolated,
    finish: Isolated,
) -> list[Result]:
    """Launch the cycle's PENDING workers, batched (module docstring): one result per item. `run` runs
    each worker's preparation (and may defer it), `finish` its claim and what follows the call."""
    launched = LaunchedMachines(ctx)
    results: dict[str, Result] = {}
    prepared: dict[str, Launch] = {}

    def prepare(item: Work) -> None:
        def step(counters: Counter[str]) -> Outcome:
            found = _prepare(ctx, item, now=now, counters=counters, images=images, launched=launched)
            if isinstance(found, Launch):
                prepared[item.worker.id] = found
                return Outcome.SUCCESS
            return found

        results[item.worker.id] = run(item, step)

    list(pool.map(prepare, items))
    claimed: dict[str, Worker] = {}
    places = [launch for batch in _batches(list(prepared.values())) for launch in batch]

    def claim(launch: Launch) -> None:
        item, batch = launch.item, launch.batch

        def step(counters: Counter[str]) -> Outcome:
            # Of two reconcilers that read the same PENDING worker, only one wins this write. It carries
            # the whole request, so whoever repeats the launch repeats this very call.
            claimed[item.worker.id] = ctx.store.update_worker(
                item.worker,
                {
                    "launch_claimed_at": now,
                    "launch_token": batch.token,
                    "launch_image_id": batch.image_id,
                    "launch_index": launch.index,
                    "launch_count": batch.count,
                },
                actor=ACTOR,
                action="LaunchClaimed",
                reason=batch.image_id,
            )
            return Outcome.SUCCESS

        # Never deferred: a batch's count is fixed, and a place left unclaimed launches a machine for none.
        results[item.worker.id] = merged(results[item.worker.id], finish(item, step))

    list(pool.map(claim, places))
    batches: dict[Batch, list[Launch]] = defaultdict(list)
    for launch in places:
        if launch.item.worker.id in claimed:
            batches[launch.batch].append(launch)

    def call(batch: Batch) -> None:
        members = batches[batch]
        for worker_id, result in _launch_batch(
            ctx, batch, members=members, claimed=claimed, now=now, run=finish
        ):
            results[worker_id] = merged(results[worker_id], result)

    list(pool.map(call, batches))
    return [results[item.worker.id] for item in items]


def _batches(launches: list[Launch]) -> Iterator[list[Launch]]:
    """Launches alike, as batches: a claimed one repeated as it was, the rest in new batches of at most
    LAUNCH_BATCH_LIMIT, each worker at its index."""
    alike: dict[Batch, list[Launch]] = defaultdict(list)
    for launch in launches:
        alike[launch.batch].append(launch)
    for batch, members in alike.items():
        if batch.token is not None:
            yield members
            continue
        for start in range(0, len(members), LAUNCH_BATCH_LIMIT):
            chunk = members[start : start + LAUNCH_BATCH_LIMIT]
            placed = replace(batch, token=new_batch_id(), count=len(chunk))
            yield [replace(launch, batch=placed, index=index) for index, launch in enumerate(chunk)]


def _prepare(
    ctx: Context,
    item: Work,
    *,
    now: datetime,
    counters: Counter[str],
    images: NewestImages,
    launched: LaunchedMachines,
) -> Outcome | Launch:
    """Everything one worker's launch needs before its batch: an outcome when it needs no call."""
    worker = item.worker
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
    if configs and worker.region not in configs:
        return fail(ctx, worker, f"no region config for {worker.region}", counters)
    # A tag EC2 refuses (a template stored before the API checked tags, or a region's default tags)
    # fails this worker alone, before any call: never a launch that poisons what EC2 answers later. The
    # batch tag counts among EC2's 50.
    tags = launch_tags(ctx, worker, template.tags)
    problem = tag_problem({**tags, BATCH_TAG: ""})
    if problem:
        reason = f"template '{template.name}' launches with tags EC2 refuses: {problem}"
        return fail(ctx, worker, reason, counters)

    if worker.launch_claimed_at is not None and now - worker.launch_claimed_at < LAUNCH_CLAIM_TTL:
        return Outcome.SKIP  # another reconciler is launching it right now
    # A reconciler died mid-launch, or an earlier attempt failed after RunInstances may have gone
    # through: adopt the machine it may have started instead of launching a second one.
    adopted = launched.of(worker)
    if adopted is not None:
        return _paired(ctx, worker, adopted, now, counters, adopted=True)

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

    mine = own_tags(worker)
    shared = tuple(sorted((k, v) for k, v in tags.items() if k not in mine))
    # An earlier launch whose answer may be lost is repeated as it was sent: same batch, same image.
    if worker.launch_token is not None and worker.launch_image_id is not None:
        batch = Batch(
            worker.region,
            worker.launch_image_id,
            instance_type,
            shared,
            token=worker.launch_token,
            count=worker.launch_count or 1,
        )
        return Launch(item, batch, index=worker.launch_index or 0)
    image_id = worker.pinned_image_id or images.newest(template.ami_name_filter, worker.region)
    if image_id is None:
        return fail(ctx, worker, f"no AMI matches '{template.ami_name_filter}'", counters)
    return Launch(item, Batch(worker.region, image_id, instance_type, shared))


def _launch_batch(
    ctx: Context,
    batch: Batch,
    *,
    members: list[Launch],
    claimed: Mapping[str, Worker],
    now: datetime,
    run: Isolated,
) -> Iterator[tuple[str, Result]]:
    """One RunInstances for the members that hold their claim, and each one's pairing."""
    region = ctx.settings.region_configs.get(batch.region)
    tags = dict(batch.shared_tags)
    tags[BATCH_TAG] = batch.token or ""
    if batch.count == 1:
        # A batch of one carries its worker's own tags at once: no tagging after the answer.
        tags.update(own_tags(members[0].item.worker))
    try:
        machines = ctx.ec2(batch.region).run_instances(
            image_id=batch.image_id,
            instance_type=batch.instance_type,
            count=batch.count,
            tags=tags,
            # The same token returns the machines an earlier attempt started instead of starting more.
            client_token=batch.token or "",
            subnet_id=region.subnet_id if region else None,
            security_group_ids=region.security_group_ids if region else (),
            key_name=region.key_name if region else None,
            instance_profile=ctx.settings.worker_instance_profile,
        )
    except Exception as error:  # each member meets it as its own launch's failure
        for launch in members:
            yield launch.item.worker.id, run(launch.item, raising(error))
        return
    at = {m.launch_index: m for m in machines}
    for launch in members:
        worker = claimed[launch.item.worker.id]
        machine = at.get(launch.index)
        if machine is None:
            # EC2 launched fewer than asked: it had no room for this one, as if refused alone.
            refused = short_launch(batch.instance_type, len(machines), batch.count)
            yield worker.id, run(launch.item, raising(refused))
            continue

        def pair(counters: Counter[str], worker: Worker = worker, machine: Ec2Instance = machine) -> Outcome:
            return _paired(ctx, worker, machine, now, counters, image_id=batch.image_id)

        yield worker.id, run(launch.item, pair)


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
    found = LaunchedMachines(ctx).of(worker)
    machines = [found] if found is not None else []
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


def _paired(
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
    _tag_own(ctx, worker, instance, counters)
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


def _tag_own(ctx: Context, worker: Worker, machine: Ec2Instance, counters: Counter[str]) -> None:
    """Write the worker's own tags on its machine, unless it names the worker already (a batch of one's):
    IAM lets the reconciler tag only a machine that names no worker. A failure leaves them to discovery,
    which writes them on every tracked machine that lacks them."""
    if machine.tags.get(WORKER_ID_TAG) == worker.id:
        return
    wanted = own_tags(worker)
    try:
        ctx.ec2(worker.region).tag(machine.instance_id, wanted)
    except (ClientError, BotoCoreError) as error:
        counters["launch_tags_deferred"] += 1
        logger.warning(
            "paired machine not tagged",
            worker_id=worker.id,
            instance_id=machine.instance_id,
            error=str(error),
        )


def scaling_audit(ctx: Context, detail_type: str, detail: Mapping[str, Any]) -> None:
    """A scaling audit record on the audit bus; the worker's own audit item is already in the table."""
    try:
        ctx.audit.publish(detail_type, detail)
    except Exception:  # the audit item in the table is the record; the event is a copy
        logger.exception("audit event not published", detail_type=detail_type)
