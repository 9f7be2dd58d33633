"""The functions' own services, as their handlers run them: each AWS request they make is that
function's, and is evaluated against its role's policies (fleetkeeper_local.iam).

Tests that call a function's service directly, instead of invoking its handler, import it from here.
"""

from __future__ import annotations

from fleetkeeper.services import discovery, drains, reconcile
from fleetkeeper_local.iam import as_function

reconcile_fleet = as_function("reconcile", reconcile.reconcile_fleet)
discover_and_collect = as_function("discover", discovery.discover_and_collect)
run_step = as_function("drain-tasks", drains.run_step)

__all__ = ["discover_and_collect", "reconcile_fleet", "run_step"]
