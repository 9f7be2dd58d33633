"""Key and index attributes for each entity (layout in store/schema.py, docs/data-model.md).

Two layouts of the index attributes exist while a table written by an earlier release is migrated
(store/layout.py): the legacy one, where a status, a pool or a kind is one partition for the whole
fleet, and the bucket one, where every such key is split into `INDEX_PARTITIONS` write shards by the
worker's bucket (domain/sharding.py). Contiguous bucket ranges map to one write shard, so a reconcile
shard's range touches few of them.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from fleetkeeper.domain.lifecycle import InstanceState
from fleetkeeper.domain.models import AuditEvent, Instance, Pool, Worker, WorkerTemplate
from fleetkeeper.domain.scale_down import scope_of
from fleetkeeper.domain.sharding import BUCKETS, bucket_of

# Write shards of every index key a whole fleet would otherwise share (a status, a pool, an instance
# state). At 5,000 placements a second fleet-wide each takes about a sixteenth: see bench/results.md,
# "Hottest partition key".
INDEX_PARTITIONS = 16
# Placements into one pool check one of these copies of the pool's status, not the pool item itself.
POOL_GATES = INDEX_PARTITIONS
# Counter items per scope, spread over COUNTER_PARTITIONS partition keys (store/counters.py).
COUNTER_ITEMS = 64
COUNTER_PARTITIONS = 8


def worker_key(worker_id: str) -> dict[str, str]:
    return {"PK": f"WORKER#{worker_id}", "SK": "WORKER"}


def template_key(name: str) -> dict[str, str]:
    return {"PK": f"TEMPLATE#{name}", "SK": "TEMPLATE"}


def pool_key(name: str) -> dict[str, str]:
    return {"PK": f"POOL#{name}", "SK": "POOL"}


def pool_gate_key(name: str, gate: int) -> dict[str, str]:
    return {"PK": f"POOLGATE#{name}#{gate:02d}", "SK": "GATE"}


def instance_key(instance_id: str) -> dict[str, str]:
    return {"PK": f"INSTANCE#{instance_id}", "SK": "INSTANCE"}


def audit_partition(entity: str, entity_id: str) -> str:
    return f"AUDIT#{entity}#{entity_id}"


def partition_of(bucket: int) -> int:
    """The write shard of a bucket: contiguous bucket ranges share one."""
    return bucket * INDEX_PARTITIONS // BUCKETS


def partitions_of(buckets: range) -> range:
    """The write shards a contiguous range of buckets touches."""
    return range(partition_of(buckets.start), partition_of(buckets.stop - 1) + 1)


def gate_of(worker_id: str) -> int:
    """Which copy of its pool's status a placement on this worker checks."""
    return partition_of(bucket_of(worker_id)) % POOL_GATES


# ---- the bucket layout ---------------------------------------------------------------------------


def worker_shard_partition(status: str, partition: int) -> str:
    return f"WORKER#{status}#{partition:02d}"


def bucket_sort(bucket: int) -> str:
    """The by_shard sort key's prefix: a range of buckets is a BETWEEN on it."""
    return f"{bucket:04d}"


def pool_member_partition(pool: str, partition: int) -> str:
    return f"POOL#{pool}#{partition:02d}"


def instance_state_partition(state: str, partition: int) -> str:
    return f"INSTANCE#{state}#{partition:02d}"


# Marks the cell of an unhealthy worker (`RUNNING!@lab#labs`): counted in its status and among its
# status's unhealthy ones (store/counters.py), so the repair brake's count is exact.
UNHEALTHY_MARK = "!"


def counted_cell(worker: Worker) -> str:
    """The counter cell a worker is counted in: its status, whether it is unhealthy, and its scope
    (template and pool)."""
    mark = UNHEALTHY_MARK if worker.health is not None and worker.health.unhealthy else ""
    return f"{worker.status}{mark}@{scope_of(worker)}"


def health_counted_key(pool: str) -> dict[str, str]:
    """The mark that every member of the pool is counted in the cell its health says (store/workers.py,
    `count_health`)."""
    return {"PK": f"HEALTHCOUNTED#{pool}", "SK": "MARK"}


def worker_index_attributes(worker: Worker, *, legacy: bool = False) -> dict[str, Any]:
    """The index attributes of a worker item; with `legacy`, the earlier release's too (store/layout.py).

    `bucket` and `counted_as` are store bookkeeping: `counted_as` names the counter cell the worker is
    counted in (store/counters.py) and is written only with the counter's change."""
    bucket = bucket_of(worker.id)
    partition = partition_of(bucket)
    attributes: dict[str, Any] = {
        "bucket": bucket,
        "GSI4PK": worker_shard_partition(worker.status, partition),
        "GSI4SK": f"{bucket_sort(bucket)}#{worker.id}",
    }
    if worker.pool:
        attributes["GSI5PK"] = pool_member_partition(worker.pool, partition)
        attributes["GSI5SK"] = f"{worker.template}#{worker.id}"
    if legacy:
        attributes.update(legacy_worker_index_attributes(worker))
    return attributes


def booking_partition(pool: str) -> str:
    """The by_parent partition of a pool's waiting bookings, sorted by timeslot start."""
    return f"BOOKINGS#{pool}"


def booking_sort(timeslot_start: datetime) -> str:
    """A fixed-width UTC time, so that the sort key orders bookings by timeslot start."""
    return timeslot_start.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def instance_index_attributes(instance: Instance, *, legacy: bool = False) -> dict[str, Any]:
    """By parent: its worker's partition, or, while it waits for capacity, its pool's bookings (an
    ended booking that never had a worker is in neither)."""
    attributes: dict[str, Any] = {}
    if instance.worker_id:
        attributes.update(GSI2PK=f"WORKER#{instance.worker_id}", GSI2SK=f"INSTANCE#{instance.id}")
    elif instance.state == InstanceState.WAITING_FOR_CAPACITY and instance.pool and instance.timeslot_start:
        attributes.update(
            GSI2PK=booking_partition(instance.pool),
            GSI2SK=f"{booking_sort(instance.timeslot_start)}#{instance.id}",
        )
    if legacy:
        attributes.update(legacy_instance_index_attributes(instance))
    else:
        # A booking without a worker yet is spread by its own id.
        attributes["GSI1PK"] = instance_state_partition(
            instance.state, partition_of(bucket_of(instance.worker_id or instance.id))
        )
        attributes["GSI1SK"] = f"{instance.worker_id}#{instance.id}"
    return attributes


def template_index_attributes(template: WorkerTemplate) -> dict[str, Any]:
    return {"GSI3PK": kind_partition("TEMPLATE"), "GSI3SK": template.name}


def pool_index_attributes(pool: Pool) -> dict[str, Any]:
    return {"GSI3PK": kind_partition("POOL"), "GSI3SK": pool.name}


def audit_key(event: AuditEvent) -> dict[str, str]:
    # The random suffix keeps two events of the same microsecond apart; the time prefix keeps order.
    return {
        "PK": audit_partition(event.entity, event.entity_id),
        "SK": f"{event.at.isoformat()}#{uuid.uuid4().hex[:8]}",
    }


def kind_partition(kind: str) -> str:
    return f"KIND#{kind}"


def ec2_instance_key(instance_id: str) -> dict[str, str]:
    """The item naming the worker that recorded an EC2 instance (store/machine_keys.py)."""
    return {"PK": f"EC2#{instance_id}", "SK": "WORKER"}


# ---- the legacy layout: what the earlier release wrote and read ------------------------------------

# Worker attributes of the legacy layout, removed once the migration is done.
LEGACY_WORKER_ATTRIBUTES = ("GSI1PK", "GSI1SK", "GSI2PK", "GSI2SK", "GSI3PK", "GSI3SK")


def worker_status_partition(status: str) -> str:
    return f"WORKER#{status}"


def worker_status_sort(region: str | None = None, template: str | None = None) -> str:
    """Prefix of the legacy by_status sort key, to narrow a status query by region and template."""
    if region is None:
        return ""
    if template is None:
        return f"{region}#"
    return f"{region}#{template}#"


def legacy_instance_state_partition(state: str) -> str:
    return f"INSTANCE#{state}"


def legacy_worker_index_attributes(worker: Worker) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "GSI1PK": worker_status_partition(worker.status),
        "GSI1SK": f"{worker.region}#{worker.template}#{worker.id}",
        "GSI3PK": kind_partition("WORKER"),
        "GSI3SK": worker.id,
    }
    if worker.pool:
        attributes["GSI2PK"] = f"POOL#{worker.pool}"
        attributes["GSI2SK"] = f"WORKER#{worker.id}"
    return attributes


def legacy_instance_index_attributes(instance: Instance) -> dict[str, Any]:
    return {
        "GSI1PK": legacy_instance_state_partition(instance.state),
        "GSI1SK": f"{instance.worker_id}#{instance.id}",
        "GSI3PK": kind_partition("INSTANCE"),
        "GSI3SK": instance.id,
    }
