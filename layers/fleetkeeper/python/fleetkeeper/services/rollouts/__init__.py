"""Rollouts (docs/rollouts.md): replacing a scope of workers wave by wave.

Modules: `commands` (start or plan one, read them, pause, resume, cancel, roll back: what the API
asks), `step` (what the engine's and the rollback's steps share: the door they pass, the replacements
they create, why a rollout waits), `engine` (the leading reconcile shard advances RUNNING rollouts),
`rollbacks` (and ROLLING_BACK ones), `alarms` (`rollback_on_alarms`), `auto` (`auto_rollout` templates).
Callers use the commands' names re-exported here.
"""

from __future__ import annotations

from fleetkeeper.services.rollouts.commands import (
    METRIC_EVENTS,
    PLAN_LISTED_WORKERS,
    RollbackView,
    RolloutPlan,
    RolloutView,
    RolloutWave,
    begin_rollback,
    cancel,
    emit,
    get,
    page,
    pause,
    plan,
    resume,
    rollback,
    start,
    store_of,
)

__all__ = [
    "METRIC_EVENTS",
    "PLAN_LISTED_WORKERS",
    "RollbackView",
    "RolloutPlan",
    "RolloutView",
    "RolloutWave",
    "begin_rollback",
    "cancel",
    "emit",
    "get",
    "page",
    "pause",
    "plan",
    "resume",
    "rollback",
    "start",
    "store_of",
]
