"""The functions' own services, as their handlers run them: each AWS request they make is that
function's, and is evaluated against its role's policies (fleetkeeper_local.iam).

Tests that call a function's service directly, instead of invoking its handler, import it from here.
A direct call of a function's own code is attributed to it by its call stack anyway; naming the
function here also covers what its threads and the code it shares with other functions ask AWS for.
"""

from __future__ import annotations

from fleetkeeper.services import discovery, drains, reconcile
from fleetkeeper_local.iam import as_function

reconcile_fleet = as_function("reconcile", reconcile.reconcile_fleet)
discover_and_collect = as_function("discover", discovery.discover_and_collect)
run_step = as_function("drain-tasks", drains.run_step)
# The reconcile cycle's share of the drains package: its sweep of open drains and their watchdog.
sweep_waiting_drains = as_function("reconcile", drains.sweep_waiting_drains)
run_watchdog = as_function("reconcile", drains.run_watchdog)

__all__ = ["discover_and_collect", "reconcile_fleet", "run_step", "run_watchdog", "sweep_waiting_drains"]
