"""Discovery and orphan GC (seed 001), per region.

1. Discover: every managed instance (by tag, and optionally by AMI name pattern), 1000 per call.
2. Import the live ones no worker knows; resurrect a TERMINATED worker whose machine is back after GC
   retired it; terminate a machine whose worker was retired on purpose (or that a live worker does not
   own, or whose place in a launch batch no worker claims): every machine carrying the managed tag
   belongs to a live worker or is terminated.
3. Health: one paged DescribeInstanceStatus of the region (1000 machines a call) records the scheduled
   events, failed status checks and silent machines of RUNNING workers (services/repair.py), so a
   missed AWS Health event is caught here; DescribeInstanceInformation lists the region's lost SSM
   agents (one paged read filtered on ConnectionLost), a signal on the workers that use operations,
   and reads by id (50 a call) only the agents of workers whose lost connection stands, to clear it.
   Only a change is written.
4. GC: workers (not TERMINATED, not PENDING) whose machine is missing from what was discovered are
   verified with one batched DescribeInstances by id; confirmed missing or terminated -> TERMINATED
   (soft delete, terminated_by discovery-gc), their active instances end as worker_lost, an open
   drain is closed. A circuit breaker (services/orphan_gc.py) holds them all back when too large a
   share of the region's live workers look orphaned at once. One pass retires at most
   ORPHAN_GC_MAX_RETIRE_PER_RUN of them; the rest are found again, and retired, by the next passes.

A run keeps TIME_MARGIN_SECONDS of its invocation for its report: a region, a machine or an orphan that
does not fit is left to the next run and counted (`regions_deferred`, `deferred_for_time`). The region
whose last turn (a pass begun, complete or not) is oldest goes first, so a slow one cannot starve the
others: a region that never fits its run still goes last after its turn.

GC_MODE=report-only turns the whole run into a dry run: the same findings as events, log lines and
counters, and no write to any worker.
"""

from __future__ import annotations

import fnmatch
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import BotoCoreError, ClientError

from fleetkeeper.cloud import ssm
from fleetkeeper.cloud.ec2 import Ec2Gateway, Ec2Instance
from fleetkeeper.domain.errors import Conflict, Unavailable
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus, can_transition, worker_status_for_ec2_state
from fleetkeeper.domain.models import Worker, WorkerTemplate, utcnow
from fleetkeeper.domain.orphan_breaker import BreakerDecision, decide
from fleetkeeper.domain.reconcile import GC_ACTOR, may_resurrect
from fleetkeeper.domain.repair import AgentReading, HealthSource, StatusReading, observe_all, signals_of
from fleetkeeper.domain.tags import (
    BATCH_TAG,
    MANAGED_BY_TAG,
    MANAGED_BY_VALUE,
    POOL_TAG,
    TEMPLATE_TAG,
    WORKER_ID_TAG,
)
from fleetkeeper.observability import emit_counters, logger, metrics
from fleetkeeper.services import orphan_gc, repair
from fleetkeeper.services.context import Context
from fleetkeeper.services.worker_exit import retire_worker
from fleetkeeper.settings import GcMode

ACTOR = GC_ACTOR
STATS_SCOPE = "discovery"
REASON_MISSING = "EC2 instance not found during discovery"
REASON_TERMINATED = "EC2 reports the instance terminated"

# The metric the stack's dashboard reads (infra/metrics.py).
METRIC_ORPHANS_TERMINATED = "OrphansTerminated"
# Orphans the circuit breaker held back in this run; the breaker's alarm watches it.
METRIC_ORPHAN_GC_HELD_BACK = "OrphanGcHeldBack"

GC_STATUSES = tuple(s for s in WorkerStatus if s not in (WorkerStatus.TERMINATED, WorkerStatus.PENDING))
# States in which an instance is worth a worker record.
_IMPORTABLE_STATES = frozenset({"pending", "running", "stopping", "stopped"})
# DescribeInstances may not see an instance for a few seconds after RunInstances: a worker launched
# that recently is not suspected yet (the next sweep, or the reconciler, will look again).
LAUNCH_VISIBILITY_GRACE = timedelta(minutes=2)
# What a run keeps of its invocation for writing its stats and answering: the DynamoDB and CloudWatch
# calls after the last region, with their retries.
TIME_MARGIN_SECONDS = 20.0
# The stats timestamp of a region's last complete pass (nothing left for lack of time).
_COMPLETED_PREFIX = "completed_at:"
# The stats timestamp of a region's last turn: a pass begun, whether it completed or not.
_TAKEN_PREFIX = "taken_at:"
# At most this many ids are named in one report event (EventBridge caps an entry at 256 KB), and in each
# list of the run's result (a Lambda answers at most 6 MB); the counters count them all.
MAX_IDS_IN_EVENT = 100


@dataclass
class RegionFindings:
    region: str
    discovered: int = 0
    imported: list[str] = field(default_factory=list)
    resurrected: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    orphans_terminated: list[str] = field(default_factory=list)
    # Orphans the circuit breaker kept from GC in this pass (worker ids), and what it decided.
    held_back: list[str] = field(default_factory=list)
    breaker: BreakerDecision = BreakerDecision.CLOSED
    # Orphans past this pass's bound, left for the next pass.
    deferred: list[str] = field(default_factory=list)
    unimportable: list[str] = field(default_factory=list)
    # Machines and orphans this run had no time left for; the next run finds them again.
    deferred_for_time: int = 0
    # Machines launched within the import grace: perhaps a launch in flight, looked at again next run.
    import_deferred: list[str] = field(default_factory=list)
    untagged: list[str] = field(default_factory=list)
    # Workers whose health this pass changed (services/repair.py).
    health_changed: list[str] = field(default_factory=list)
    # Managed machines no live worker owns (instance ids), and those terminated this run.
    leaked: list[str] = field(default_factory=list)
    leaked_terminated: list[str] = field(default_factory=list)
    errors: int = 0


@dataclass
class DiscoveryReport:
    mode: GcMode
    regions: list[RegionFindings] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": str(self.mode),
            "counters": dict(sorted(self.counters.items())),
            "regions": [
                {
                    "region": r.region,
                    "discovered": r.discovered,
                    "imported": _named(r.imported),
                    "resurrected": _named(r.resurrected),
                    "orphans": _named(r.orphans),
                    "orphans_terminated": _named(r.orphans_terminated),
                    "orphan_gc_breaker": str(r.breaker),
                    "orphans_held_back": _named(r.held_back),
                    "orphans_deferred": _named(r.deferred),
                    "unimportable": _named(r.unimportable),
                    "import_deferred": _named(r.import_deferred),
                    "leaked_machines": _named(r.leaked),
                    "leaked_machines_terminated": _named(r.leaked_terminated),
                }
                for r in self.regions
            ],
        }


def discover_and_collect(
    ctx: Context,
    *,
    regions: list[str] | None = None,
    now: datetime | None = None,
    time_left: Callable[[], float] | None = None,
) -> DiscoveryReport:
    """One discovery + GC run over the given regions (default: every configured region), inside
    `time_left()` seconds less TIME_MARGIN_SECONDS (unbounded without it)."""
    now = now or utcnow()
    remaining = time_left or (lambda: math.inf)

    def out_of_time() -> bool:
        return remaining() < TIME_MARGIN_SECONDS

    report = DiscoveryReport(mode=ctx.settings.gc_mode)
    configured = list(regions or ctx.settings.regions)
    turns: dict[str, datetime] = {}
    for region in taking_turns(configured, _completed_passes(ctx)):
        if out_of_time():
            report.counters["regions_deferred"] += 1
            logger.warning("discovery out of time; region left to the next run", region=region)
            continue
        findings = RegionFindings(region=region)
        turns[f"{_TAKEN_PREFIX}{region}"] = now
        _discover_region(ctx, findings, now, out_of_time)
        report.regions.append(findings)
        report.counters["deferred_for_time"] += findings.deferred_for_time
        if not findings.deferred_for_time:
            turns[f"{_COMPLETED_PREFIX}{region}"] = now
        report.counters["discovered"] += findings.discovered
        report.counters["unimportable"] += len(findings.unimportable)
        report.counters["import_deferred"] += len(findings.import_deferred)
        report.counters["imported_untagged"] += len(findings.untagged)
        report.counters["leaked_machines"] += len(findings.leaked)
        report.counters["leaked_machines_terminated"] += len(findings.leaked_terminated)
        report.counters["discovery_errors"] += findings.errors
        report.counters["orphans_held_back"] += len(findings.held_back)
        report.counters["orphans_deferred"] += len(findings.deferred)
        report.counters["health_changed"] += len(findings.health_changed)
        if report.mode is GcMode.TERMINATE:
            report.counters["imported"] += len(findings.imported)
            report.counters["resurrected"] += len(findings.resurrected)
            report.counters["orphans_terminated"] += len(findings.orphans_terminated)
        else:
            report.counters["would_import"] += len(findings.imported)
            report.counters["would_resurrect"] += len(findings.resurrected)
            report.counters["orphans_reported"] += len(findings.orphans)
        logger.info(
            "discovery finished",
            region=region,
            mode=str(report.mode),
            discovered=findings.discovered,
            imported=len(findings.imported),
            resurrected=len(findings.resurrected),
            orphans=len(findings.orphans),
            orphans_terminated=len(findings.orphans_terminated),
            leaked_machines=len(findings.leaked),
            orphan_gc_breaker=str(findings.breaker),
            orphans_held_back=findings.held_back[:MAX_IDS_IN_EVENT],
            orphans_deferred=len(findings.deferred),
        )
        # A held-back pass terminated nothing: its own event comes from the breaker (services/orphan_gc.py).
        if findings.orphans and (report.mode is GcMode.REPORT_ONLY or not findings.held_back):
            _announce(ctx, report.mode, findings)
    report.regions.sort(key=lambda f: configured.index(f.region))
    discovered = report.counters.pop("discovered", 0)
    ctx.stats.record(
        STATS_SCOPE,
        counters=report.counters,
        gauges={"discovered": discovered},
        timestamps={"last_run_at": now, **turns},
    )
    report.counters["discovered"] = discovered
    emit_counters("Discovery", report.counters)
    metrics.add_metric(
        name=METRIC_ORPHANS_TERMINATED, unit=MetricUnit.Count, value=report.counters["orphans_terminated"]
    )
    metrics.add_metric(
        name=METRIC_ORPHAN_GC_HELD_BACK, unit=MetricUnit.Count, value=report.counters["orphans_held_back"]
    )
    return report


def taking_turns(regions: Sequence[str], completed: Mapping[str, str]) -> list[str]:
    """The regions in the order a run takes them: never taken first, then the oldest turn (UTC ISO
    timestamps sort as times; stats written before turns were recorded hold only complete passes), ties
    in configured order. A turn that ran out of time counts: ordered by complete passes alone, a region
    that never fits its run would go first in every run and starve those after it."""

    def last_turn(region: str) -> str:
        taken = completed.get(f"{_TAKEN_PREFIX}{region}")
        return taken if taken is not None else completed.get(f"{_COMPLETED_PREFIX}{region}", "")

    return sorted(regions, key=lambda r: (last_turn(r), list(regions).index(r)))


def _completed_passes(ctx: Context) -> dict[str, str]:
    """Each region's last complete pass, from the discovery stats; none when they cannot be read (the
    configured order is as good a start as any)."""
    try:
        return ctx.stats.read(STATS_SCOPE).timestamps
    except Exception:  # the order is an optimisation: a failed read must not stop the run
        logger.exception("discovery stats unreadable; regions in configured order")
        return {}


def _discover_region(
    ctx: Context, findings: RegionFindings, now: datetime, out_of_time: Callable[[], bool]
) -> None:
    gateway = ctx.ec2(findings.region)
    discovered = {i.instance_id: i for i in gateway.describe_managed()}
    pattern = ctx.settings.discovery_ami_pattern
    if pattern:
        images = gateway.image_ids(pattern, owners=ctx.settings.ami_owners)
        if images:
            discovered.update({i.instance_id: i for i in gateway.describe_by_images(images)})
    findings.discovered = len(discovered)
    alive = {iid for iid, instance in discovered.items() if instance.state != "terminated"}

    tracked = list(ctx.store.iter_workers_by_status(GC_STATUSES, region=findings.region))
    tracked_ids = {w.ec2_instance_id for w in tracked if w.ec2_instance_id}
    _backfill_machine_keys(ctx, findings, tracked, now)
    # PENDING workers may be mid-launch: their machines belong to the reconciler, never imported twice.
    templates: dict[str, WorkerTemplate] | None = None
    image_names: dict[str, str] = {}
    claims = LaunchClaims(ctx, findings.region)
    unknown = sorted(alive - tracked_ids)
    for index, instance_id in enumerate(unknown):
        if out_of_time():
            findings.deferred_for_time += len(unknown) - index
            break
        instance = discovered[instance_id]
        if instance.state not in _IMPORTABLE_STATES:
            continue
        if templates is None:
            templates = {t.name: t for t in ctx.store.list_templates()}
        try:
            _adopt(
                ctx,
                gateway,
                instance,
                templates=templates,
                image_names=image_names,
                claims=claims,
                findings=findings,
                now=now,
            )
        except Exception:  # one machine's failure is its own; the next run tries again
            logger.exception("machine not settled", instance_id=instance_id)
            findings.errors += 1

    if ctx.settings.gc_mode is not GcMode.REPORT_ONLY:
        # An earlier import may have failed to tag its machine (without the managed tag IAM denies
        # stopping it), or a launch to write its worker's id on a machine of its batch: keep trying.
        untagged = [
            (worker, machine)
            for worker in tracked
            if (machine := discovered.get(worker.ec2_instance_id or "")) is not None
            and (
                machine.tags.get(MANAGED_BY_TAG) != MANAGED_BY_VALUE
                or machine.tags.get(WORKER_ID_TAG) != worker.id
            )
        ]
        for index, (worker, machine) in enumerate(untagged):
            if out_of_time():
                findings.deferred_for_time += len(untagged) - index
                break
            _ensure_tags(gateway, machine, worker.id, worker.template, findings)

    _sweep_health(ctx, gateway, tracked, findings, now=now, out_of_time=out_of_time)
    _collect_orphans(
        ctx,
        gateway,
        tracked=tracked,
        discovered=discovered,
        alive=alive,
        findings=findings,
        now=now,
        out_of_time=out_of_time,
    )


def _sweep_health(
    ctx: Context,
    gateway: Ec2Gateway,
    tracked: list[Worker],
    findings: RegionFindings,
    *,
    now: datetime,
    out_of_time: Callable[[], bool],
) -> None:
    """Record what the region's status lines, and the SSM agents of the workers that use operations,
    say of its RUNNING workers; a report-only run writes nothing. A failed read is counted, and the
    next run reads again (a failed agent read leaves the agents' signals as they stand)."""
    running = {
        w.ec2_instance_id: w for w in tracked if w.status == WorkerStatus.RUNNING and w.ec2_instance_id
    }
    if not running:
        return
    try:
        readings = [r for r in gateway.describe_status() if r.instance_id in running]
    except (ClientError, BotoCoreError) as error:
        logger.warning("DescribeInstanceStatus failed", region=findings.region, error=str(error))
        findings.errors += 1
        return
    agents = _agent_readings(ctx, running, readings, findings)
    for index, reading in enumerate(readings):
        worker = running[reading.instance_id]
        signals = signals_of(reading, agents.get(reading.instance_id))
        if observe_all(worker.health, signals, now) == worker.health:
            continue
        if out_of_time():
            findings.deferred_for_time += len(readings) - index
            return
        findings.health_changed.append(worker.id)
        if ctx.settings.gc_mode is GcMode.REPORT_ONLY:
            continue
        try:
            repair.record_health(ctx, worker.id, signals, actor=ACTOR, now=now)
        except Conflict:
            findings.health_changed.remove(worker.id)  # terminated since it was read
        except Exception:  # one worker's, never the pass's: read again next run
            logger.exception("health not recorded", worker_id=worker.id)
            findings.errors += 1


def _agent_readings(
    ctx: Context, running: Mapping[str, Worker], readings: Sequence[StatusReading], findings: RegionFindings
) -> dict[str, AgentReading]:
    """What Systems Manager says of the agents of the running workers: a lost one, for the workers whose
    template uses operations (their agent must answer), from one paged read of the region's lost
    agents; and by id, 50 a call, only the agents of the workers whose lost connection stands, to clear
    it (a machine not listed lost says nothing: it may be Online, or not registered). The ids asked
    for are those the status read saw running. None when no worker needs either, or when a read
    failed (counted)."""
    settings = ctx.settings
    interval = settings.system_info_interval_seconds
    before_stop = {t.name: t.before_stop for t in ctx.store.list_templates()}
    seen_running = [r.instance_id for r in readings if r.state == "running"]
    wanted = {
        instance_id
        for instance_id in seen_running
        if settings.operations_catalogue.used_by(before_stop.get(running[instance_id].template, []), interval)
    }
    lost_standing = [
        instance_id
        for instance_id in seen_running
        if (health := running[instance_id].health) is not None
        and HealthSource.CONNECTION_LOST in health.standing()
    ]
    if not wanted and not lost_standing:
        return {}
    client = ctx.ssm(findings.region)
    try:
        lost = ssm.lost_agents(client) if wanted else {}
        known = ssm.agent_readings(client, lost_standing) if lost_standing else {}
    except (ClientError, BotoCoreError, Unavailable) as error:
        logger.warning("DescribeInstanceInformation failed", region=findings.region, error=str(error))
        findings.errors += 1
        return {}
    return {**{i: reading for i, reading in lost.items() if i in wanted}, **known}


def _backfill_machine_keys(
    ctx: Context, findings: RegionFindings, tracked: list[Worker], now: datetime
) -> None:
    """Give the machines of the region's live workers their key items, if the table was written before
    they existed (store/machine_keys.py); nothing once the region is done. Bookkeeping, not a worker
    write, so a report-only run does it too."""
    try:
        ctx.store.backfill_machine_keys(findings.region, tracked, now=now)
    except Exception:  # the next run tries again; events use the index meanwhile
        logger.exception("machine keys not backfilled", region=findings.region)
        findings.errors += 1


def _adopt(
    ctx: Context,
    gateway: Ec2Gateway,
    instance: Ec2Instance,
    *,
    templates: dict[str, WorkerTemplate],
    image_names: dict[str, str],
    claims: LaunchClaims,
    findings: RegionFindings,
    now: datetime,
) -> None:
    """Settle a machine no tracked worker has: resurrect, terminate as leaked, or import it."""
    report_only = ctx.settings.gc_mode is GcMode.REPORT_ONLY
    tagged_id = instance.tags.get(WORKER_ID_TAG)
    batch = instance.tags.get(BATCH_TAG)
    # A machine of a launch batch, not paired yet: the PENDING worker claiming its place pairs it. The
    # claims are read before the machine's key item, so a pairing in between shows in one or the other.
    claimant = claims.claimant(batch, instance.launch_index or 0) if batch and not tagged_id else None
    owner = ctx.store.find_worker_by_ec2_instance(instance.instance_id, findings.region)
    if owner is None and tagged_id:
        # No worker recorded the machine (yet: a launch in flight), or a retired worker recorded it before
        # machine key items existed: the tag names the worker.
        owner = ctx.store.find_worker(tagged_id)
    owner = owner or claimant
    if owner is not None:
        _settle_owned(ctx, gateway, owner, instance, findings=findings, now=now, report_only=report_only)
        return
    grace = timedelta(seconds=ctx.settings.import_grace_seconds)
    if instance.launch_time is not None and now - instance.launch_time < grace:
        # A launch in flight has a machine before its worker records it (and before the by-instance
        # index shows it): importing now would give that machine a second worker.
        findings.import_deferred.append(instance.instance_id)
        return
    if batch and not tagged_id:
        # Its place in the batch is claimed by no worker (the claim was lost to a concurrent write):
        # nobody will pair it, and it is not imported either.
        _terminate_leaked(gateway, None, instance, findings, report_only=report_only)
        return
    template = _template_for(gateway, instance, templates, image_names)
    if template is None:
        findings.unimportable.append(instance.instance_id)
        logger.warning("managed instance matches no template; not imported", instance_id=instance.instance_id)
        return
    status = worker_status_for_ec2_state(instance.state)
    pool = instance.tags.get(POOL_TAG)
    worker = Worker(
        # Deterministic, so two overlapping runs import the machine once (the second create conflicts).
        id=tagged_id or f"w-{instance.instance_id.removeprefix('i-')}",
        template=template.name,
        region=findings.region,
        pool=pool if pool and ctx.store.find_pool(pool) is not None else None,
        status=status,
        ec2_instance_id=instance.instance_id,
        private_ip=instance.private_ip,
        public_ip=instance.public_ip,
        capacity=template.capacity,
        ec2_state=instance.state,
        ec2_observed_at=now,
        # What the machine says it was launched with: drift compares it with its template.
        image_id=instance.image_id,
        instance_type=instance.instance_type,
        launched_at=instance.launch_time,
    )
    findings.imported.append(worker.id)
    if report_only:
        return
    try:
        ctx.store.create_worker(worker, actor=ACTOR, reason="imported by discovery")
    except Conflict:
        findings.imported.remove(worker.id)
        return
    _ensure_tags(gateway, instance, worker.id, template.name, findings)


def _settle_owned(
    ctx: Context,
    gateway: Ec2Gateway,
    owner: Worker,
    instance: Ec2Instance,
    *,
    findings: RegionFindings,
    now: datetime,
    report_only: bool,
) -> None:
    """A machine whose worker exists: it is that worker's, back from a GC retirement, or leaked."""
    if owner.status == WorkerStatus.PENDING:
        return  # mid-launch: the reconciler links them (or retires the launch and its machine)
    if owner.status == WorkerStatus.TERMINATED:
        if owner.ec2_instance_id == instance.instance_id and may_resurrect(owner):
            # GC retired the worker because it could not see this machine; it was wrong.
            _resurrect(ctx, owner, instance, findings, now, report_only=report_only)
        else:
            # Retired on purpose (desired TERMINATED, a drain then terminate, a failed launch cleaned
            # up, an abandoned launch): its machine must not outlive it.
            _terminate_leaked(gateway, owner, instance, findings, report_only=report_only)
        return
    if owner.ec2_instance_id not in (None, instance.instance_id):
        # A second machine for a live worker (a launch that was retried after its first answer was lost).
        _terminate_leaked(gateway, owner, instance, findings, report_only=report_only)


def _terminate_leaked(
    gateway: Ec2Gateway,
    owner: Worker | None,
    instance: Ec2Instance,
    findings: RegionFindings,
    *,
    report_only: bool,
) -> None:
    findings.leaked.append(instance.instance_id)
    logger.warning(
        "managed machine without a live worker",
        instance_id=instance.instance_id,
        worker_id=owner.id if owner else None,
        worker_status=str(owner.status) if owner else None,
        state=instance.state,
        terminated=not report_only,
    )
    if report_only:
        return
    try:
        gateway.terminate(instance.instance_id)
    except (ClientError, BotoCoreError) as error:
        # Counted as leaked and not terminated; the next discovery run tries again.
        logger.warning("leaked machine not terminated", instance_id=instance.instance_id, error=str(error))
        return
    findings.leaked_terminated.append(instance.instance_id)


class LaunchClaims:
    """The places the region's PENDING workers claim in launch batches, read from the base table the
    first time a machine of a batch turns up without a worker."""

    def __init__(self, ctx: Context, region: str) -> None:
        self._ctx = ctx
        self._region = region
        self._claims: dict[tuple[str, int], Worker] | None = None

    def claimant(self, batch: str, index: int) -> Worker | None:
        if self._claims is None:
            listed = self._ctx.store.iter_workers_by_status((WorkerStatus.PENDING,), region=self._region)
            pending = self._ctx.store.get_workers([w.id for w in listed])
            self._claims = {
                (w.launch_token, w.launch_index or 0): w
                for w in pending
                if w.status == WorkerStatus.PENDING and w.launch_token is not None
            }
        return self._claims.get((batch, index))


def _ensure_tags(
    gateway: Ec2Gateway, instance: Ec2Instance, worker_id: str, template: str, findings: RegionFindings
) -> None:
    """Tag a machine as fleetkeeper's; without the tag, stop and terminate are denied by IAM."""
    wanted = {MANAGED_BY_TAG: MANAGED_BY_VALUE, WORKER_ID_TAG: worker_id, TEMPLATE_TAG: template}
    if all(instance.tags.get(k) == v for k, v in wanted.items()):
        return
    try:
        gateway.tag(instance.instance_id, wanted)
    except (ClientError, BotoCoreError) as error:
        # The worker exists either way; the next discovery run tries again.
        findings.untagged.append(worker_id)
        logger.warning("imported instance not tagged", instance_id=instance.instance_id, error=str(error))


def _template_for(
    gateway: Ec2Gateway,
    instance: Ec2Instance,
    templates: dict[str, WorkerTemplate],
    image_names: dict[str, str],
) -> WorkerTemplate | None:
    named = instance.tags.get(TEMPLATE_TAG)
    if named:
        return templates.get(named)
    if not instance.image_id:
        return None
    if instance.image_id not in image_names:
        try:
            image_names.update(gateway.image_names([instance.image_id]))
        except (ClientError, BotoCoreError) as error:
            logger.warning("AMI name unavailable", image_id=instance.image_id, error=str(error))
            image_names[instance.image_id] = ""
    name = image_names.get(instance.image_id)
    if not name:
        return None
    matching = sorted(t.name for t in templates.values() if fnmatch.fnmatchcase(name, t.ami_name_filter))
    return templates[matching[0]] if matching else None


def _resurrect(
    ctx: Context,
    worker: Worker,
    instance: Ec2Instance,
    findings: RegionFindings,
    now: datetime,
    *,
    report_only: bool,
) -> None:
    target = worker_status_for_ec2_state(instance.state)
    if not can_transition(worker.status, target, Cause.EC2):
        return
    findings.resurrected.append(worker.id)
    if report_only:
        return
    try:
        ctx.store.transition_worker(
            worker,
            target,
            cause=Cause.EC2,
            actor=ACTOR,
            reason=f"EC2 instance is {instance.state} again",
            action="WorkerResurrected",
            changes={
                "terminated_by": None,
                "terminated_reason": None,
                "status_reason": f"resurrected: EC2 reports {instance.state}",
                "ec2_state": instance.state,
                "ec2_observed_at": now,
                "private_ip": instance.private_ip,
                "public_ip": instance.public_ip,
            },
        )
    except Conflict:
        findings.resurrected.remove(worker.id)


def _collect_orphans(
    ctx: Context,
    gateway: Ec2Gateway,
    *,
    tracked: list[Worker],
    discovered: dict[str, Ec2Instance],
    alive: set[str],
    findings: RegionFindings,
    now: datetime,
    out_of_time: Callable[[], bool],
) -> None:
    suspects = [
        w
        for w in tracked
        if w.ec2_instance_id
        and w.ec2_instance_id not in alive
        and not (
            w.status in (WorkerStatus.PROVISIONING, WorkerStatus.STARTING)
            and now - w.updated_at < LAUNCH_VISIBILITY_GRACE
        )
    ]
    # No early return without suspects: the breaker's pass is also how it resumes by itself.
    # Discovery already saw some of them terminated; the rest are asked for by id, in one batch.
    unseen = {
        w.ec2_instance_id for w in suspects if w.ec2_instance_id and w.ec2_instance_id not in discovered
    }
    verified = gateway.describe(unseen) if unseen else {}
    report_only = ctx.settings.gc_mode is GcMode.REPORT_ONLY
    orphans: list[tuple[Worker, str]] = []
    # By id, whatever order the index listed them in (its keys sort by bucket): the held-back list, the
    # run's bound and what it defers follow one stable order.
    for worker in sorted(suspects, key=lambda w: w.id):
        instance = discovered.get(worker.ec2_instance_id or "") or verified.get(worker.ec2_instance_id or "")
        if instance is not None and instance.state != "terminated":
            continue  # alive after all (it merely lost its tag): not an orphan
        orphans.append((worker, REASON_MISSING if instance is None else REASON_TERMINATED))
    findings.orphans = [worker.id for worker, _ in orphans]
    findings.breaker = _breaker(ctx, findings, live=len(tracked), now=now, report_only=report_only)
    if findings.breaker is BreakerDecision.HOLD:
        findings.held_back = list(findings.orphans)
        return
    bound = ctx.settings.orphan_gc_max_retire_per_run
    findings.deferred = [worker.id for worker, _ in orphans[bound:]]
    for index, (worker, reason) in enumerate(orphans[:bound]):
        if out_of_time():
            findings.deferred_for_time += len(orphans[:bound]) - index
            findings.deferred = [w.id for w, _ in orphans[index:]]
            break
        instance_id = worker.ec2_instance_id or ""
        logger.info(
            "orphan worker",
            worker_id=worker.id,
            ec2_instance_id=instance_id,
            status=str(worker.status),
            reason=reason,
            mode=str(ctx.settings.gc_mode),
        )
        if report_only:
            continue
        try:
            fresh = ctx.store.get_worker(worker.id)  # the status index may lag the item
            if fresh.status == WorkerStatus.TERMINATED or fresh.ec2_instance_id != instance_id:
                continue
            retire_worker(
                ctx,
                fresh,
                cause=Cause.EC2,
                actor=ACTOR,
                reason=reason,
                changes={"ec2_state": "terminated", "ec2_observed_at": now},
            )
            findings.orphans_terminated.append(worker.id)
        except Conflict:
            logger.info("orphan changed concurrently; left for the next sweep", worker_id=worker.id)


def _breaker(
    ctx: Context, findings: RegionFindings, *, live: int, now: datetime, report_only: bool
) -> BreakerDecision:
    """The circuit breaker's verdict on this pass's orphans; a dry run records nothing."""
    if report_only:
        return decide(
            None,
            findings.orphans,
            live=live,
            max_share_percent=ctx.settings.orphan_gc_max_share_percent,
            now=now,
        )
    return orphan_gc.gate(
        ctx,
        findings.region,
        findings.orphans,
        live=live,
        now=now,
        retire_per_pass=ctx.settings.orphan_gc_max_retire_per_run,
    )


def _named(ids: list[str]) -> list[str]:
    return ids[:MAX_IDS_IN_EVENT]


def _announce(ctx: Context, mode: GcMode, findings: RegionFindings) -> None:
    detail_type = "Orphans Reported" if mode is GcMode.REPORT_ONLY else "Orphans Terminated"
    ids = findings.orphans if mode is GcMode.REPORT_ONLY else findings.orphans_terminated
    try:
        ctx.audit.publish(
            detail_type,
            {
                "region": findings.region,
                "mode": str(mode),
                "count": len(ids),
                "worker_ids": ids[:MAX_IDS_IN_EVENT],
            },
        )
    except (ClientError, BotoCoreError, RuntimeError):
        logger.exception("orphan report not published", region=findings.region)
