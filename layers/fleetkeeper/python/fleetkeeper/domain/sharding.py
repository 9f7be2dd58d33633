"""How the reconcile cycle splits the fleet between parallel invocations.

Worker `w` belongs to shard `shard_of(w, count)`. The hash is SHA-256 of the worker id, so the split is
stable across processes and deploys (Python's `hash()` is salted per process) and even for ids that
share a prefix. Each id maps to exactly one index in `range(count)`: for a given count the shards
partition the fleet, so no worker is handled twice or skipped in a cycle. A hash spreads every region,
template and pool evenly over the shards, so each shard's EC2 reads stay batched per region.

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


def shard_of(worker_id: str, count: int) -> int:
    """The index in `range(count)` of the shard that owns this worker."""
    if not 1 <= count <= MAX_SHARDS:
        raise ValueError(f"shard count must be 1..{MAX_SHARDS}, got {count}")
    digest = hashlib.sha256(worker_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


@dataclass(frozen=True)
class Shard:
    """One invocation's share of the fleet: shard `index` of `count`."""

    index: int = 0
    count: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS:
            raise ValueError(f"shard count must be 1..{MAX_SHARDS}, got {self.count}")
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard index must be 0..{self.count - 1}, got {self.index}")

    @property
    def leads(self) -> bool:
        """Whether the fleet-wide work runs here (pool drains and their watchdog, the fleet's gauges): in
        exactly one of the cycle's shards, the first."""
        return self.index == 0

    def owns(self, worker_id: str) -> bool:
        """Whether this shard handles the worker."""
        return self.count == 1 or shard_of(worker_id, self.count) == self.index

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
