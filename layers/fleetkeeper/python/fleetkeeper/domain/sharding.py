"""How the reconcile cycle splits the fleet between parallel invocations.

Every worker has a fixed bucket, `bucket_of(id)` in `range(BUCKETS)`: SHA-256 of its id, so it is stable
across processes and deploys (Python's `hash()` is salted per process) and even for ids that share a
prefix. The store keeps the bucket on the worker item and keys the status index by it
(docs/data-model.md), so that a shard reads its own workers and nobody else's.

Shard `i` of `count` owns the contiguous range of buckets `[i * BUCKETS // count, (i + 1) * BUCKETS //
count)`: the ranges of one count partition the buckets, so no worker is handled twice or skipped in a
cycle, and any two ranges differ by at most one bucket, so every count from 1 to MAX_SHARDS is balanced.
A hash spreads every region, template and pool evenly over the buckets, so each shard's EC2 reads stay
batched per region.

Fleet-wide work (pool drains and their watchdog, the fleet's gauges) runs in shard 0 only. The
fleet-wide limits (the minimum per scope, the scale-down cooldown, the disruption budget) hold across
shards: the minimum and the budget through the scale-down ledger (domain/scale_down_ledger.py), the
cooldown through a conditional claim; see docs/operations.md, "Sharding the reconciler".
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# The stage setting's ceiling: one schedule (and one lease item) per shard per region.
MAX_SHARDS = 64
# Fixed for the life of a table: a worker's bucket is stored on its item and is part of index keys.
BUCKETS = 1024


def bucket_of(worker_id: str) -> int:
    """The worker's bucket in `range(BUCKETS)`, the same in every process and release."""
    digest = hashlib.sha256(worker_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % BUCKETS


def _check_count(count: int) -> None:
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shard count must be 1..{MAX_SHARDS}, got {count}")


def bucket_range(index: int, count: int) -> range:
    """The buckets shard `index` of `count` owns."""
    return range(index * BUCKETS // count, (index + 1) * BUCKETS // count)


def shard_of_bucket(bucket: int, count: int) -> int:
    """The index in `range(count)` of the shard whose range holds this bucket."""
    _check_count(count)
    # The largest i with i * BUCKETS // count <= bucket.
    return ((bucket + 1) * count - 1) // BUCKETS


def shard_of(worker_id: str, count: int) -> int:
    """The index in `range(count)` of the shard that owns this worker."""
    return shard_of_bucket(bucket_of(worker_id), count)


@dataclass(frozen=True)
class Shard:
    """One invocation's share of the fleet: shard `index` of `count`."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        _check_count(self.count)
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard index must be 0..{self.count - 1}, got {self.index}")

    @property
    def leads(self) -> bool:
        """Whether the fleet-wide work runs here (pool drains and their watchdog, the fleet's gauges): in
        exactly one of the cycle's shards, the first."""
        return self.index == 0

    def owns(self, worker_id: str) -> bool:
        """Whether this shard handles the worker."""
        return self.count == 1 or bucket_of(worker_id) in self.buckets

    @property
    def buckets(self) -> range:
        """The buckets this shard owns: a contiguous range, all of them for the unsharded cycle."""
        return bucket_range(self.index, self.count)

    @property
    def suffix(self) -> str:
        """What the shard adds to the lease and stats names: nothing for the unsharded cycle, so its
        names stay what they always were; `#2of4` for the second of four shards."""
        return "" if self.count == 1 else f"#{self.index + 1}of{self.count}"


WHOLE_FLEET = Shard()


def split_mismatch(shard: Shard, configured: int) -> str | None:
    """Why a cycle over `shard` must not run on a stage configured for `configured` shards, or None.

    A cycle of another split overlaps the configured shards' cycles on some workers (a different
    lease, the same workers), and only the configured split's claims keep the scale-down limits.
    """
    if shard.count == configured:
        return None
    return (
        f"this stage runs {configured} reconcile shard(s), so a cycle must name shard 0..{configured - 1}"
        f" of shards={configured}; got shard {shard.index} of {shard.count}"
    )
