"""Repair: a worker whose machine is sick or retiring is replaced before it hurts a session
(docs/repair.md).

A worker's `health` keeps each source's unhealthy signal: an EC2 scheduled event (AWS's date), a
failed status check, a machine EC2 hears nothing from, an SSM agent that lost its connection, or what
its own agent reports. `observe` folds a new signal into it; a signal clears only what its own source
said (or what a restart of the machine made stale, `STALE_AFTER`: the health keeps the restart's time,
so a word said before it and recorded after it is stale too), the worker is unhealthy while any
source says so, and a scheduled event's signal counts first, because its date is fixed. A repair is
due once a signal has lasted its pool's toleration (a scheduled event at once). The brake stops a
pool's repairs while more than `max_unhealthy_percent` of its members are unhealthy: that many at once
is a systemic fault that replacement would only make worse; one sick worker alone is always repaired.
`plan_repair` says how a due repair goes through the door: an ordinary `repair`, held by the pool's
budgets like any other, and for a scheduled event (which the brake does not hold: AWS retires the
machine whatever we decide) imposed from its latest start on, when waiting longer would let the drain
run past the margin before NotBefore.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Annotated, Final

from pydantic import AfterValidator, AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from fleetkeeper.domain.disruption import MEMBERS
from fleetkeeper.domain.durations import DURATION_PATTERN
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.windows import check_duration

# A drain for a scheduled event ends at least this long before the event's NotBefore.
EVENT_MARGIN: Final = timedelta(minutes=30)
# A machine that failed its checks or stopped answering is drained with at most this deadline: its
# sessions are suffering already.
SICK_DRAIN_TIMEOUT: Final = timedelta(minutes=30)
# The shortest drain a repair starts: less lets nothing finish.
MIN_REPAIR_DRAIN: Final = timedelta(minutes=1)
MAX_REASON = 500
# Scheduled event codes AWS uses (DescribeInstanceStatus `Code`, or a Health event type code).
MAX_EVENT_CODE = 128
# Events whose newest AWS Health word a worker keeps (`Health.heard`): a machine has few in its life.
MAX_HEARD = 16


def _utc(value: datetime) -> datetime:
    return value.astimezone(UTC)


_When = Annotated[AwareDatetime, AfterValidator(_utc)]


class _Record(BaseModel):
    # domain/models.Record's rules; models.Worker holds a Health, so this module cannot import it.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


class HealthStatus(StrEnum):
    HEALTHY = "healthy"
    UNHEALTHY = "unhealthy"


class HealthSource(StrEnum):
    """Where a signal comes from."""

    SCHEDULED_EVENT = "scheduled_event"
    STATUS_CHECK = "status_check"
    UNREACHABLE = "unreachable"
    CONNECTION_LOST = "connection_lost"
    REPORTED = "reported"


# The machine itself is sick: its sessions are suffering already (a short drain, SICK_DRAIN_TIMEOUT).
SICK_MACHINE: Final = frozenset(
    {HealthSource.STATUS_CHECK, HealthSource.UNREACHABLE, HealthSource.CONNECTION_LOST}
)


class Restart(StrEnum):
    """What happened to a machine that makes what was said of it before stale."""

    # A stop: the machine starts again on other hardware. A reboot is no restart here: nothing dates it
    # reliably (AWS lists an event completed early with its later NotBefore), so the sources end their
    # own signals once the machine is back (docs/repair.md, "Signals").
    STOP = "stop"


# Per restart, the sources whose earlier signals it makes stale (docs/repair.md, "Signals").
# A stop leaves the old host behind, and with it what its checks, its silence and its scheduled events
# said. An agent's report is the agent's to withdraw: a full disk outlives a stop.
STALE_AFTER: Final[dict[Restart, frozenset[HealthSource]]] = {
    Restart.STOP: SICK_MACHINE | {HealthSource.SCHEDULED_EVENT},
}


class ScheduledEvent(_Record):
    """An EC2 scheduled event of the machine: its code, when AWS acts, and its id when known."""

    code: str = Field(max_length=MAX_EVENT_CODE)
    not_before: _When | None = None
    event_id: str | None = Field(default=None, max_length=2048)


class Standing(_Record):
    """One source's unhealthy signal that stands: what it said, since when, and its event."""

    reason: str | None = Field(default=None, max_length=MAX_REASON)
    since: _When
    event: ScheduledEvent | None = None


class Health(_Record):
    """A worker's health: the signal that counts now and since when, and every source's unhealthy
    signal that stands (`signals`), so that one source clearing never drops another's."""

    status: HealthStatus
    source: HealthSource
    reason: str | None = Field(default=None, max_length=MAX_REASON)
    since: _When
    event: ScheduledEvent | None = None
    signals: dict[HealthSource, Standing] = Field(default_factory=dict)
    # When AWS Health last spoke of each event, by its ARN, closed ones too: an older word is stale.
    heard: dict[str, _When] = Field(default_factory=dict)
    # Per source, the machine's last restart that makes its signals stale (STALE_AFTER): a word of the
    # source said before it is stale however late it arrives (a sweep's reading written after a stop,
    # an AWS Health event EventBridge delivered late).
    stale_before: dict[HealthSource, _When] = Field(default_factory=dict)

    @property
    def unhealthy(self) -> bool:
        return self.status == HealthStatus.UNHEALTHY

    @property
    def scheduled(self) -> bool:
        return self.unhealthy and self.source == HealthSource.SCHEDULED_EVENT

    @property
    def sick_since(self) -> datetime:
        """When the worker's sickness began: its oldest standing signal (`since` when healthy)."""
        return min((found.since for found in self.standing().values()), default=self.since)

    def standing(self) -> dict[HealthSource, Standing]:
        """Each source's unhealthy signal; a record written before `signals` was kept holds its one."""
        if self.signals or not self.unhealthy:
            return dict(self.signals)
        return {self.source: Standing(reason=self.reason, since=self.since, event=self.event)}

    def in_order(self) -> list[tuple[HealthSource, Standing]]:
        """The standing signals, the one that counts first: a scheduled event's (its date is fixed),
        then the oldest."""
        return _in_order(self.standing())


def _in_order(standing: dict[HealthSource, Standing]) -> list[tuple[HealthSource, Standing]]:
    return sorted(
        standing.items(), key=lambda pair: (pair[0] != HealthSource.SCHEDULED_EVENT, pair[1].since, pair[0])
    )


@dataclass(frozen=True)
class Signal:
    """One reading of one source: unhealthy with a reason (and the event), or healthy again."""

    status: HealthStatus
    source: HealthSource
    reason: str | None = None
    event: ScheduledEvent | None = None
    # When the source said it, for a word that carries its time (an AWS Health event); else when it is
    # recorded (`observe`'s now: a discovery sweep's start).
    at: datetime | None = None
    # A restart of the machine at this moment (`restart_signals`): what the source said before it is
    # stale, what it says since stands.
    stale_before: datetime | None = None


def _toleration(text: str) -> str:
    check_duration(text)
    return text.strip()


Toleration = Annotated[
    str, Field(max_length=32, json_schema_extra={"pattern": DURATION_PATTERN}), AfterValidator(_toleration)
]


class RepairPolicy(_Record):
    """A pool's repair settings (`PUT /api/v1/pools/{name}`, field `repair`)."""

    max_unhealthy_percent: int = Field(
        default=20,
        ge=0,
        le=100,
        description="repairs stop while more than this share of the pool's members is unhealthy",
    )
    status_check: Toleration = Field(
        default="10m", description="how long a failed EC2 status check lasts before the worker is repaired"
    )
    unreachable: Toleration = Field(
        default="15m", description="how long EC2 may hear nothing from a machine before it is repaired"
    )
    connection_lost: Toleration = Field(
        default="15m",
        description="how long the SSM agent of a worker that uses operations may stay ConnectionLost "
        "before it is repaired",
    )
    reported: Toleration = Field(
        default="5m", description="how long an unhealthy report may stand, not withdrawn, before a repair"
    )

    @field_validator("max_unhealthy_percent", mode="before")
    @classmethod
    def _whole(cls, value: object) -> object:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("a whole percentage from 0 to 100")
        return value

    def toleration(self, source: HealthSource) -> timedelta:
        if source == HealthSource.SCHEDULED_EVENT:
            return timedelta(0)
        return check_duration(getattr(self, str(source)))


def observe(current: Health | None, signal: Signal, now: datetime) -> Health | None:
    """The worker's health after `signal`; `current` itself when nothing changes (no write needed).

    Each source's unhealthy signal stands until that source says healthy (a scheduled event's, only the
    same event ending), keeping its `since`; the worker is unhealthy while any stands. The one that
    counts is a scheduled event's (its date is fixed), else the oldest. A timed word on an event older
    than the last one heard of it is stale (events arrive out of order), and so is any word of a source
    said before a restart that makes it stale, standing or arriving. Nothing is recorded for a healthy
    signal about a worker never found unhealthy, but when it names the time of its event or a
    restart."""
    stale = dict(current.stale_before) if current is not None else {}
    if signal.stale_before is not None:
        stale[signal.source] = max(signal.stale_before, stale.get(signal.source, signal.stale_before))
    elif _said_before_restart(stale, signal.source, signal.at or now):
        return current
    standing = current.standing() if current is not None else {}
    heard = dict(current.heard) if current is not None else {}
    event_id = signal.event.event_id if signal.event is not None else None
    if signal.at is not None and event_id is not None:
        last = heard.get(event_id)
        # EventBridge times are whole seconds: within one, a close outranks an open, AWS reopens nothing.
        if last is not None and (
            signal.at < last or (signal.at == last and signal.status == HealthStatus.UNHEALTHY)
        ):
            return current
        heard[event_id] = signal.at
        heard = dict(sorted(heard.items(), key=lambda pair: pair[1])[-MAX_HEARD:])
    found = standing.get(signal.source)
    if signal.stale_before is not None:
        # A restart says nothing of the machine since: it only makes earlier words stale, just below.
        standing = {s: f for s, f in standing.items() if not _said_before_restart(stale, s, f.since)}
    elif signal.status == HealthStatus.HEALTHY:
        if found is not None and not _other_event(found.event, signal.event):
            del standing[signal.source]
    else:
        reason = _cut(signal.reason)
        if found is None or (found.reason, found.event) != (reason, signal.event):
            since = found.since if found is not None else now
            standing[signal.source] = Standing(reason=reason, since=since, event=signal.event)
    if current is None and not standing and not heard and not stale:
        return None
    if current is not None and (standing, heard, stale) == (
        current.standing(),
        current.heard,
        current.stale_before,
    ):
        return current
    if not standing:
        if current is not None and not current.unhealthy:
            return current.model_copy(update={"heard": heard, "stale_before": stale})
        return Health(
            status=HealthStatus.HEALTHY,
            source=signal.source,
            reason=_cut(signal.reason),
            since=now,
            heard=heard,
            stale_before=stale,
        )
    source, counts = _in_order(standing)[0]
    return Health(
        status=HealthStatus.UNHEALTHY,
        source=source,
        reason=counts.reason,
        since=counts.since,
        event=counts.event,
        signals=standing,
        heard=heard,
        stale_before=stale,
    )


def _said_before_restart(
    stale: Mapping[HealthSource, datetime], source: HealthSource, said: datetime
) -> bool:
    """The one staleness rule: a word of a source said before the machine's last restart that makes
    that source stale (STALE_AFTER) no longer stands, whether it stood already or arrives late."""
    restart = stale.get(source)
    return restart is not None and said < restart


def restart_signals(restart: Restart, at: datetime) -> list[Signal]:
    """What a restart of the machine at `at` says: each source it makes stale is healthy again, for
    the signals begun before it."""
    return [
        Signal(HealthStatus.HEALTHY, source, f"machine {restart}", stale_before=at)
        for source in sorted(STALE_AFTER[restart])
    ]


def stopped(current: Health | None, now: datetime) -> Health | None:
    """The worker's health once its machine stopped (`Restart.STOP`)."""
    return observe_all(current, restart_signals(Restart.STOP, now), now)


def _other_event(standing: ScheduledEvent | None, ended: ScheduledEvent | None) -> bool:
    """Whether an event that ended is another than the one standing. Only ids of one kind compare: AWS
    Health names an event by its ARN, DescribeInstanceStatus by an `instance-event-` id, and the same
    event reaches a worker both ways."""
    if standing is None or ended is None or standing.event_id is None or ended.event_id is None:
        return False
    same_kind = standing.event_id.startswith("arn:") == ended.event_id.startswith("arn:")
    return same_kind and standing.event_id != ended.event_id


def _cut(reason: str | None) -> str | None:
    return None if reason is None else reason[:MAX_REASON]


def repair_due(health: Health | None, policy: RepairPolicy, now: datetime) -> bool:
    """Whether the worker is to be repaired now: one of its sources unhealthy for its toleration."""
    if health is None or not health.unhealthy:
        return False
    return any(now >= found.since + policy.toleration(source) for source, found in health.standing().items())


@dataclass(frozen=True)
class Brake:
    """A pool's repair brake: its unhealthy members out of all, and whether repairs stop."""

    unhealthy: int
    members: int
    max_percent: int

    @property
    def holds(self) -> bool:
        # One sick worker is never a systemic fault: a pool of fewer than five would otherwise never be
        # repaired, one sick member being more than 20 % of it.
        return self.unhealthy > 1 and self.unhealthy * 100 > self.max_percent * self.members

    @property
    def detail(self) -> str:
        return f"repair brake, {self.unhealthy} of {self.members} unhealthy"


def brake(
    by_status: Mapping[WorkerStatus, int],
    unhealthy_by_status: Mapping[WorkerStatus, int],
    policy: RepairPolicy,
) -> Brake:
    """The brake over a pool's counts, its workers and its unhealthy ones by status: its members
    (RUNNING and those being disrupted) count, the rest do not."""
    return Brake(
        unhealthy=sum(unhealthy_by_status.get(status, 0) for status in MEMBERS),
        members=sum(by_status.get(status, 0) for status in MEMBERS),
        max_percent=policy.max_unhealthy_percent,
    )


@dataclass(frozen=True)
class RepairPlan:
    """How a due repair goes through the door and drains.

    `imposed`: AWS's date forces it now, so neither the pool's budgets nor `do_not_disrupt` hold it
    back; otherwise it is an ordinary `repair`. `braked`: the pool's brake holds it back. `start_by`:
    when its drain starts at the latest, replacement running or not (None: once the replacement runs).
    """

    imposed: bool
    braked: bool
    start_by: datetime | None
    timeout_seconds: int


def plan_repair(health: Health, held: Brake, template_timeout_seconds: int, now: datetime) -> RepairPlan:
    """A due repair's plan. A scheduled event passes the brake and drains with the template's timeout,
    ending EVENT_MARGIN before its NotBefore: it waits for the budgets like any repair until its latest
    start (that end less the timeout), and is imposed from then on, its drain shortened to what is left
    (an event with no date, imposed at once: nothing says how long waiting is safe). A sick machine
    drains within SICK_DRAIN_TIMEOUT; a reported one with the template's timeout."""
    template = timedelta(seconds=template_timeout_seconds)
    if health.scheduled:
        event = health.event
        if event is None or event.not_before is None:
            return RepairPlan(imposed=True, braked=False, start_by=None, timeout_seconds=_seconds(template))
        latest_end = event.not_before - EVENT_MARGIN
        latest_start = latest_end - template
        left = max(latest_end - now, MIN_REPAIR_DRAIN)
        return RepairPlan(
            imposed=now >= latest_start,
            braked=False,
            start_by=latest_start,
            timeout_seconds=_seconds(min(template, left)),
        )
    sick = health.source in SICK_MACHINE
    return RepairPlan(
        imposed=False,
        braked=held.holds,
        start_by=None,
        timeout_seconds=_seconds(min(template, SICK_DRAIN_TIMEOUT) if sick else template),
    )


def _seconds(length: timedelta) -> int:
    return max(math.ceil(length.total_seconds()), int(MIN_REPAIR_DRAIN.total_seconds()))


@dataclass(frozen=True)
class EventReading:
    """One scheduled event as DescribeInstanceStatus lists it."""

    code: str
    not_before: datetime | None
    description: str | None
    event_id: str | None


@dataclass(frozen=True)
class StatusReading:
    """One machine's line of DescribeInstanceStatus: its state, its two checks, its scheduled events."""

    instance_id: str
    state: str
    system_status: str | None
    instance_status: str | None
    events: tuple[EventReading, ...] = ()


@dataclass(frozen=True)
class AgentReading:
    """What Systems Manager says of the machine's SSM agent (DescribeInstanceInformation)."""

    ping_status: str
    last_ping: datetime | None = None


# Statuses that mean EC2 has heard nothing from the machine (an `initializing` machine is still booting).
_SILENT: Final = frozenset({"insufficient-data"})
# A machine still booting (after a launch, a start or a reboot): its agent has not pinged yet, so SSM
# still says ConnectionLost from before; that is no signal until the checks have run.
_BOOTING: Final = frozenset({"initializing"})
# SSM's PingStatus of an agent that stopped answering, and of one that answers.
CONNECTION_LOST: Final = "ConnectionLost"
ONLINE: Final = "Online"


def signals_of(reading: StatusReading, agent: AgentReading | None = None) -> list[Signal]:
    """What a running machine's status line (and, for a worker that uses operations, its SSM agent)
    says, healthy signals first so that a signal of the same reading that is still unhealthy stands:
    scheduled events (an ended one clears, the earliest live one counts), failed checks (`impaired`),
    no status at all (`insufficient-data`), and an agent that lost its connection. `agent` None: no
    word on the agent (not read, or the machine is not registered with Systems Manager), which clears
    nothing."""
    if reading.state != "running":
        return []
    healthy: list[Signal] = []
    unhealthy: list[Signal] = []
    live = []
    for found in reading.events:
        event = ScheduledEvent(
            code=found.code[:MAX_EVENT_CODE], not_before=found.not_before, event_id=found.event_id
        )
        text = f"{found.code}: {found.description or '-'}"
        if event_ended(found.description):
            healthy.append(Signal(HealthStatus.HEALTHY, HealthSource.SCHEDULED_EVENT, text, event))
        else:
            live.append((found.not_before or datetime.max.replace(tzinfo=UTC), text, event))
    if live:
        _, text, event = min(live, key=lambda entry: entry[0])
        unhealthy.append(Signal(HealthStatus.UNHEALTHY, HealthSource.SCHEDULED_EVENT, text, event))
    checks = f"system status {reading.system_status or '-'}, instance status {reading.instance_status or '-'}"
    statuses = {reading.system_status, reading.instance_status}
    if "impaired" in statuses:
        unhealthy.append(Signal(HealthStatus.UNHEALTHY, HealthSource.STATUS_CHECK, checks))
    elif statuses & _SILENT:
        unhealthy.append(Signal(HealthStatus.UNHEALTHY, HealthSource.UNREACHABLE, checks))
    if statuses == {"ok"}:
        healthy += [
            Signal(HealthStatus.HEALTHY, HealthSource.STATUS_CHECK, checks),
            Signal(HealthStatus.HEALTHY, HealthSource.UNREACHABLE, checks),
        ]
    if agent is not None:
        last = agent.last_ping.astimezone(UTC).isoformat() if agent.last_ping is not None else "-"
        said = f"SSM agent {agent.ping_status}, last ping {last}"
        if agent.ping_status == CONNECTION_LOST and statuses.isdisjoint(_BOOTING):
            unhealthy.append(Signal(HealthStatus.UNHEALTHY, HealthSource.CONNECTION_LOST, said))
        elif agent.ping_status == ONLINE:
            healthy.append(Signal(HealthStatus.HEALTHY, HealthSource.CONNECTION_LOST, said))
    return healthy + unhealthy


def observe_all(current: Health | None, signals: Iterable[Signal], now: datetime) -> Health | None:
    """`observe` of each signal in turn."""
    for signal in signals:
        current = observe(current, signal, now)
    return current


# Words of DescribeInstanceStatus and Health that say an event is over.
_ENDED_PREFIXES: Final = ("[Completed]", "[Canceled]", "[Cancelled]")


def event_ended(description: str | None) -> bool:
    """Whether a DescribeInstanceStatus event's description says AWS completed or cancelled it."""
    return description is not None and description.strip().startswith(_ENDED_PREFIXES)
