"""The live views of a worker's drain (what is left, the deadline, the estimate, each instance as it
ends) and of a rollout (its wave, what is replaced, what blocks it).

Both only read (GET the drain status and the worker's instances; GET the rollout), so detaching with
Ctrl-C leaves the drain or the rollout running; `fleetkeeper drain-status ID --watch` and
`fleetkeeper rollout status ID --wait` re-attach.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from fleetkeeper.domain.lifecycle import ACTIVE_INSTANCE_STATES, ForceReason
from fleetkeeper_cli.client import ApiClient
from fleetkeeper_cli.durations import format_seconds

FINAL_DRAIN_STATES = frozenset({"SUCCESS", "ERROR", "CANCELLED", "TIMED_OUT", "NOT_RUN"})
# What a drain's force step writes on the instances it ends, whether at the deadline or forced now.
FORCE_REASONS = frozenset(ForceReason)


def was_forced(instance: dict[str, Any]) -> bool:
    return instance.get("reason") in FORCE_REASONS


def _time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def _until(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    left = (moment - now).total_seconds()
    return f"in {format_seconds(left)}" if left >= 0 else f"{format_seconds(-left)} ago"


@dataclass
class DrainWatch:
    """Polls one worker's drain until it ends; `outcome()` counts graceful and forced ends."""

    client: ApiClient
    worker_id: str
    interval: float = 2.0
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    status: dict[str, Any] = field(default_factory=dict)
    instances: dict[str, dict[str, Any]] = field(default_factory=dict)

    def poll(self) -> list[dict[str, Any]]:
        """Refresh the status and instances; return the instances that ended since the last poll."""
        self.status = self.client.get(f"/api/v1/workers/{self.worker_id}/drain")
        current = {
            i["id"]: i for i in self.client.pages("/api/v1/instances", worker_id=self.worker_id, limit=1000)
        }
        ended = [
            instance
            for instance_id, instance in sorted(current.items())
            if instance["state"] not in ACTIVE_INSTANCE_STATES
            and self.instances.get(instance_id, {}).get("state") in ACTIVE_INSTANCE_STATES
        ]
        self.instances = current
        return ended

    @property
    def finished(self) -> bool:
        return self.status.get("status") in FINAL_DRAIN_STATES

    def _ended_in_drain(self) -> list[dict[str, Any]]:
        started = _time(self.status.get("started_at"))
        return [
            i
            for i in self.instances.values()
            if i["state"] not in ACTIVE_INSTANCE_STATES
            and (started is None or _time(i["updated_at"]) >= started)  # type: ignore[operator]
        ]

    def outcome(self) -> dict[str, Any]:
        ended = self._ended_in_drain()
        forced = int(self.status.get("forced_instances") or 0)
        return {
            **self.status,
            "graceful_instances": sum(1 for i in ended if not was_forced(i)),
            "forced_instances": forced,
        }

    def view(self) -> Group:
        now = self.clock()
        status = self.status
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row(
            "drain",
            f"{self.worker_id}  {status.get('status', '?')}  (worker {status.get('worker_status', '?')})",
        )
        table.add_row("active instances left", str(status.get("active_instances", "?")))
        deadline = _time(status.get("deadline"))
        table.add_row(
            "deadline", f"{_until(deadline, now)}" + (f"  ({deadline:%H:%M:%S} UTC)" if deadline else "")
        )
        table.add_row("estimated completion", _until(_time(status.get("estimated_completion")), now))
        if status.get("forced_instances"):
            table.add_row("forced so far", str(status["forced_instances"]))
        if self.finished:
            return Group(table)
        return Group(table, Text("Ctrl-C detaches; the drain goes on.", style="dim"))


def describe_end(instance: dict[str, Any]) -> str:
    how = "forced" if was_forced(instance) else "ended"
    reason = f" ({instance['reason']})" if instance.get("reason") and how != "forced" else ""
    return f"instance {instance['id']} {how}: {instance['state']}{reason}"


def follow(watch: DrainWatch, console: Console, *, live: bool = True) -> dict[str, Any]:
    """Poll until the drain ends, printing each instance as it ends; returns `watch.outcome()`.

    KeyboardInterrupt propagates to the caller, which says how to re-attach.
    """
    watch.poll()
    if not live:
        while not watch.finished:
            time.sleep(watch.interval)
            watch.poll()
        return watch.outcome()
    from rich.live import Live  # noqa: PLC0415 - only a live view needs it

    try:
        with Live(watch.view(), console=console, refresh_per_second=4, transient=False) as view:
            while not watch.finished:
                time.sleep(watch.interval)
                for instance in watch.poll():
                    console.print(describe_end(instance))
                view.update(watch.view())
    finally:
        if not console.is_terminal:
            console.line()  # a non-terminal Live leaves its last frame without a line end, Ctrl-C too
    return watch.outcome()


# ---- rollouts -----------------------------------------------------------------------------------------

FINAL_ROLLOUT_STATES = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "ROLLED_BACK"})


def ended_as_asked(view: dict[str, Any]) -> bool:
    """Whether a rollout ended as its operator asked: SUCCEEDED, or ROLLED_BACK by an operator's own
    rollback. One its alarms rolled back is a deploy that failed, whoever follows it (a pipeline's
    `rollout start --wait` must not read it as success)."""
    if view.get("status") == "SUCCEEDED":
        return True
    started_by = str((view.get("rollback") or {}).get("started_by") or "")
    return view.get("status") == "ROLLED_BACK" and not started_by.startswith("alarm:")


def wave_of(view: dict[str, Any]) -> str:
    """`wave 2/5`: the API counts waves from 0, operators from 1; a finished rollout shows its last."""
    waves = int(view.get("waves") or 0)
    return f"{min(int(view.get('wave') or 0) + 1, max(waves, 1))}/{waves}"


def blocked_line(view: dict[str, Any], now: datetime) -> str | None:
    """`blocked: budget for 3m10s (since 12:04:01 UTC): <detail>`, or None while it progresses."""
    blocked = view.get("blocked")
    if not blocked:
        return None
    since = _time(blocked.get("since"))
    how_long = (
        f" for {format_seconds((now - since).total_seconds())} (since {since:%H:%M:%S} UTC)" if since else ""
    )
    return f"blocked: {blocked.get('reason')}{how_long}: {blocked.get('detail')}"


def checkpoints_cell(view: dict[str, Any]) -> str:
    marks = [
        f"{c}% (paused here)" if c == view.get("checkpoint") else f"{c}%"
        for c in view.get("checkpoints") or []
    ]
    return ", ".join(marks) if marks else "-"


def rollback_cell(view: dict[str, Any]) -> str | None:
    """`wave 1/2, 3/4 rolled back, 1 in progress`, once a rollback has started (the view's `rollback`)."""
    rollback = view.get("rollback")
    if not rollback:
        return None
    return (
        f"wave {wave_of(rollback)}, {rollback.get('rolled_back')}/{rollback.get('total')} rolled back, "
        f"{rollback.get('in_progress')} in progress"
    )


def progress_line(view: dict[str, Any]) -> str:
    line = (
        f"rollout {view.get('id')} {view.get('status')}: wave {wave_of(view)}, "
        f"{view.get('replaced')}/{view.get('total')} replaced ({view.get('percent')}%), "
        f"{view.get('in_progress')} in progress, {view.get('remaining')} remaining, "
        f"{view.get('skipped')} skipped"
    )
    rollback = rollback_cell(view)
    return f"{line}; rollback {rollback}" if rollback else line


@dataclass
class RolloutWatch:
    """Polls one rollout until it reaches a final status; only reads, so detaching leaves it running."""

    client: ApiClient
    rollout_id: str
    interval: float = 2.0
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    view_of: dict[str, Any] = field(default_factory=dict)

    def poll(self) -> list[str]:
        """Refresh the view; return a line for each change worth keeping (status, wave, blocker)."""
        before = self.view_of
        self.view_of = self.client.get(f"/api/v1/rollouts/{self.rollout_id}")
        after = self.view_of
        if not before:
            return []
        changes: list[str] = []
        if after.get("wave") != before.get("wave"):
            changes.append(f"wave {wave_of(after)} started")
        rollback_wave = (after.get("rollback") or {}).get("wave")
        if rollback_wave is not None and rollback_wave != (before.get("rollback") or {}).get("wave"):
            changes.append(f"rollback wave {wave_of(after['rollback'])} started")
        old_reason = (before.get("blocked") or {}).get("reason")
        new_blocked = after.get("blocked") or {}
        if new_blocked.get("reason") != old_reason and new_blocked:
            changes.append(f"blocked: {new_blocked.get('reason')}: {new_blocked.get('detail')}")
        if after.get("status") != before.get("status"):
            changes.append(f"{before.get('status')} -> {after.get('status')}")
        return changes

    @property
    def finished(self) -> bool:
        return self.view_of.get("status") in FINAL_ROLLOUT_STATES

    def view(self) -> Group:
        view = self.view_of
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_row("rollout", f"{self.rollout_id}  {view.get('status', '?')}")
        table.add_row("wave", wave_of(view))
        table.add_row(
            "replaced", f"{view.get('replaced', '?')}/{view.get('total', '?')}  ({view.get('percent', '?')}%)"
        )
        table.add_row("in progress", str(view.get("in_progress", "?")))
        table.add_row("remaining", str(view.get("remaining", "?")))
        if view.get("skipped"):
            table.add_row("skipped", str(view["skipped"]))
        table.add_row("checkpoints", checkpoints_cell(view))
        rollback = rollback_cell(view)
        if rollback:
            table.add_row("rollback", rollback)
        blocked = blocked_line(view, self.clock())
        table.add_row("blocked", blocked.removeprefix("blocked: ") if blocked else "-")
        if self.finished:
            return Group(table)
        hint = "Ctrl-C detaches; the rollout goes on."
        if view.get("status") == "PAUSED":
            hint = f"Paused: `fleetkeeper rollout resume {self.rollout_id}` goes on. " + hint
        return Group(table, Text(hint, style="dim"))


def follow_rollout(watch: RolloutWatch, console: Console, *, live: bool = True) -> dict[str, Any]:
    """Poll until the rollout reaches a final status, printing each change; returns its last view.

    KeyboardInterrupt propagates to the caller, which says how to follow it again.
    """
    watch.poll()
    if not live:
        while not watch.finished:
            time.sleep(watch.interval)
            watch.poll()
        return watch.view_of
    from rich.live import Live  # noqa: PLC0415 - only a live view needs it

    try:
        with Live(watch.view(), console=console, refresh_per_second=4, transient=False) as view:
            while not watch.finished:
                time.sleep(watch.interval)
                for line in watch.poll():
                    console.print(line, markup=False, highlight=False)
                view.update(watch.view())
    finally:
        if not console.is_terminal:
            console.line()
    return watch.view_of
