"""The reconciler: one cycle over every worker needing action (see docs/operations.md).

- `cycle`: the lease, the batched reads, one isolated step per worker, the report and its metrics;
- `actions`: the transition and EC2 call a step names, starts in batches, and the persisted RETRY backoff;
- `provisioning`: launching in batches (claimed first), adopting, and retiring a launch that was abandoned;
- `scale_down`: idle tracking and scale-down of steady RUNNING workers.

The batched EC2 and CloudWatch reads are in `fleetkeeper.cloud.fleet_reads`.
"""

from fleetkeeper.cloud.fleet_reads import NOMINAL_CYCLE_SECONDS, describe_instances, metrics_due
from fleetkeeper.domain.reconcile import LAUNCH_CLAIM_TTL
from fleetkeeper.services.reconcile.actions import ACTOR, Work
from fleetkeeper.services.reconcile.cycle import (
    LEASE_NAME,
    METRIC_DURATION_MS,
    METRIC_ERRORS,
    METRIC_HEARTBEAT,
    PARALLELISM,
    RECONCILE_STATUSES,
    SAFETY_MARGIN_SECONDS,
    STATS_SCOPE,
    CycleReport,
    reconcile_fleet,
    workers_metric,
)
from fleetkeeper.services.reconcile.provisioning import launch_tags
from fleetkeeper.services.reconcile.scale_down import (
    SCALE_DOWN_ACTOR,
    SCALE_DOWN_SCOPE,
    scale_down_policy,
)

__all__ = [
    "ACTOR",
    "LAUNCH_CLAIM_TTL",
    "LEASE_NAME",
    "METRIC_DURATION_MS",
    "METRIC_ERRORS",
    "METRIC_HEARTBEAT",
    "NOMINAL_CYCLE_SECONDS",
    "PARALLELISM",
    "RECONCILE_STATUSES",
    "SAFETY_MARGIN_SECONDS",
    "SCALE_DOWN_ACTOR",
    "SCALE_DOWN_SCOPE",
    "STATS_SCOPE",
    "CycleReport",
    "Work",
    "describe_instances",
    "launch_tags",
    "metrics_due",
    "reconcile_fleet",
    "scale_down_policy",
    "workers_metric",
]
