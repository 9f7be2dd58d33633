"""The reconciler's batched reads: every worker machine's EC2 state and its latest metrics, per region.

Cost model (bench/results.md): DescribeInstances by tag at 1000 instances a call (or by id for small
sets), GetMetricData at 500 queries a call. A region whose read fails is reported with its error, so the
caller decides for that region's workers alone; the other regions' answers are kept.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, TypeVar

from fleetkeeper.cloud.ec2 import FILTER_VALUES_LIMIT, Ec2Gateway, Ec2Instance
from fleetkeeper.cloud.metrics import MetricsGateway

# The reconcile schedule's nominal rate, used to spread metric reads over the metrics interval.
NOMINAL_CYCLE_SECONDS = 60

T = TypeVar("T")


@dataclass
class RegionReads(Generic[T]):
    """What was read per key, and the regions whose read failed (with the error raised)."""

    found: dict[str, T] = field(default_factory=dict)
    failed: dict[str, Exception] = field(default_factory=dict)


def describe_instances(
    gateway: Ec2Gateway, instance_ids: set[str], *, managed_in_region: int | None = None
) -> dict[str, Ec2Instance]:
    """The instances among these ids, in the fewest DescribeInstances calls for what they return.

    Up to 200 ids fit one call with an instance-id filter. Beyond that, listing every managed instance
    by tag (1000 a page, 5 times fewer calls) is cheaper when these ids are nearly all of the region's
    managed instances (`managed_in_region`, when the caller knows it), and reading by id is cheaper
    when they are a part of it: an answer's time grows with the instances it holds, and a listing
    returns every managed instance whatever the caller wants. The line sits at three quarters, well
    away from both sides of the reconciler's use: a whole-fleet cycle wants about all of them and
    lists; a shard of two or more wants about half or less and reads its own by id, so its read does
    not grow with the whole fleet and does not flip between the two ways from one cycle to the next.
    The few ids a listing misses (an instance that lost its tag, or one that is gone) are asked for by
    id.
    """
    if len(instance_ids) <= FILTER_VALUES_LIMIT:
        return gateway.describe(instance_ids)
    if managed_in_region is not None and len(instance_ids) * 4 < managed_in_region * 3:
        return gateway.describe(instance_ids)
    found = {i.instance_id: i for i in gateway.describe_managed() if i.instance_id in instance_ids}
    missing = instance_ids - found.keys()
    if missing:
        found.update(gateway.describe(missing))
    return found


def read_instances(
    ec2: Callable[[str], Ec2Gateway],
    wanted: Mapping[str, set[str]],
    *,
    managed: Mapping[str, int] | None = None,
) -> RegionReads[Ec2Instance | None]:
    """instance id -> what EC2 says (None: EC2 does not know it), for each region's ids; `managed` is
    how many instances the fleet has in each region, when known (see describe_instances)."""
    reads: RegionReads[Ec2Instance | None] = RegionReads()
    for region, ids in sorted(wanted.items()):
        try:
            found = describe_instances(
                ec2(region), ids, managed_in_region=managed.get(region) if managed is not None else None
            )
        except Exception as error:  # one region's failure is the caller's to classify
            reads.failed[region] = error
            continue
        for instance_id in ids:
            reads.found[instance_id] = found.get(instance_id)
    return reads


def metrics_due(worker_id: str, now: datetime, interval_seconds: int) -> bool:
    """Whether this cycle reads the worker's metrics: each worker once per interval, spread evenly."""
    if interval_seconds <= 0:
        return False
    buckets = max(1, math.ceil(interval_seconds / NOMINAL_CYCLE_SECONDS))
    slot = int(now.timestamp() // NOMINAL_CYCLE_SECONDS) % buckets
    return zlib.crc32(worker_id.encode()) % buckets == slot


def read_metrics(
    cloudwatch: Callable[[str], MetricsGateway],
    wanted: Mapping[str, set[str]],
    *,
    now: datetime,
    window: timedelta,
) -> RegionReads[dict[str, float]]:
    """instance id -> {metric key: latest value}, for each region's ids that reported something."""
    reads: RegionReads[dict[str, float]] = RegionReads()
    for region, ids in sorted(wanted.items()):
        try:
            reads.found.update(cloudwatch(region).latest(ids, now=now, window=window))
        except Exception as error:  # one region's failure is the caller's to classify
            reads.failed[region] = error
    return reads
