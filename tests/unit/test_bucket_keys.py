"""The bucket layout's keys: a shard's queries cover exactly its own buckets, and every key a fleet would
share is split into write shards."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker
from fleetkeeper.domain.sharding import BUCKETS, MAX_SHARDS, Shard, bucket_of
from fleetkeeper.store import keys
from fleetkeeper.store.workers import shard_queries


def covered(query: dict[str, Any], status: WorkerStatus) -> set[int]:
    """The buckets a by_shard query returns workers of."""
    values = query["ExpressionAttributeValues"]
    partition = int(values[":pk"]["S"].removeprefix(f"WORKER#{status}#"))
    inside = [b for b in range(BUCKETS) if keys.partition_of(b) == partition]
    if ":lo" not in values:
        return set(inside)
    low, high = values[":lo"]["S"], values[":hi"]["S"]
    return {b for b in inside if low <= f"{keys.bucket_sort(b)}#w-x" <= high}


@given(
    count=st.integers(min_value=1, max_value=MAX_SHARDS),
    index=st.integers(min_value=0, max_value=MAX_SHARDS - 1),
)
def test_given_any_shard_then_its_status_queries_cover_its_buckets_and_no_other(count, index):
    shard = Shard(index % count, count)

    queries = shard_queries([WorkerStatus.RUNNING], shard.buckets)
    reached = [covered(q, WorkerStatus.RUNNING) for q in queries]

    assert set().union(*reached) == set(shard.buckets)
    assert sum(map(len, reached)) == len(shard.buckets)  # no bucket read twice
    # One query per write shard the range touches: few for a shard of many.
    assert len(queries) == len(keys.partitions_of(shard.buckets)) <= keys.INDEX_PARTITIONS // count + 2


@given(worker_id=st.text(min_size=1, max_size=40))
def test_given_any_worker_then_its_keys_carry_its_bucket_and_its_write_shard(worker_id):
    worker = Worker(id=worker_id, template="lab", region="us-east-1", pool="p", capacity=2)
    bucket = bucket_of(worker_id)

    attributes = keys.worker_index_attributes(worker)

    assert attributes["bucket"] == bucket
    assert attributes["GSI4PK"] == f"WORKER#PENDING#{keys.partition_of(bucket):02d}"
    assert attributes["GSI4SK"].startswith(f"{bucket:04d}#")
    assert attributes["GSI5PK"] == f"POOL#p#{keys.partition_of(bucket):02d}"
    assert not {"GSI1PK", "GSI2PK", "GSI3PK"} & attributes.keys()
    assert {"GSI1PK", "GSI2PK", "GSI3PK"} <= keys.worker_index_attributes(worker, legacy=True).keys()


def test_given_the_buckets_then_each_write_shard_holds_an_equal_contiguous_share():
    shares = [[b for b in range(BUCKETS) if keys.partition_of(b) == p] for p in range(keys.INDEX_PARTITIONS)]

    assert {len(share) for share in shares} == {BUCKETS // keys.INDEX_PARTITIONS}
    assert all(share == list(range(share[0], share[-1] + 1)) for share in shares)
