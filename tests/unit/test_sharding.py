"""The reconcile shards partition the fleet: every worker id has exactly one owner, whatever the count,
and every count splits the buckets evenly."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetkeeper.domain.sharding import (
    BUCKETS,
    MAX_SHARDS,
    Shard,
    bucket_of,
    shard_of,
    shard_of_bucket,
    split_mismatch,
)

worker_ids = st.text(min_size=1, max_size=64)
counts = st.integers(min_value=1, max_value=MAX_SHARDS)


# Up to 200 ids hashed once per shard: on a loaded machine one example can outlast the default 200 ms.
@settings(deadline=None)
@given(ids=st.lists(worker_ids, min_size=1, max_size=200, unique=True), count=counts)
def test_given_any_fleet_and_shard_count_then_each_worker_has_exactly_one_owner(ids, count):
    shards = [Shard(index, count) for index in range(count)]

    owners = {worker_id: [s.index for s in shards if s.owns(worker_id)] for worker_id in ids}

    assert all(len(found) == 1 for found in owners.values())
    assert all(owners[w] == [shard_of(w, count)] for w in ids)


def test_given_the_same_id_then_the_bucket_and_shard_are_the_same_in_every_process_and_release():
    # SHA-256, not the per-process salted hash(): the bucket is stored on the worker item and is part of
    # its index keys, so a value pinned once must never move.
    assert [bucket_of(f"w-{n:016x}") for n in range(8)] == [930, 92, 185, 82, 229, 984, 441, 964]
    assert [shard_of(f"w-{n:016x}", 4) for n in range(8)] == [3, 0, 0, 0, 0, 3, 1, 3]


@given(count=counts)
def test_given_any_shard_count_then_its_ranges_partition_the_buckets_within_one_bucket_of_each_other(count):
    ranges = [Shard(index, count).buckets for index in range(count)]

    assert [b for r in ranges for b in r] == list(range(BUCKETS))
    assert all(r.step == 1 for r in ranges)  # contiguous: a shard reads its buckets with one BETWEEN
    assert max(map(len, ranges)) - min(map(len, ranges)) <= 1


@given(bucket=st.integers(min_value=0, max_value=BUCKETS - 1), count=counts)
def test_given_any_bucket_then_its_shard_is_the_one_whose_range_holds_it(bucket, count):
    assert bucket in Shard(shard_of_bucket(bucket, count), count).buckets


def test_given_ten_thousand_ids_then_four_shards_hold_a_quarter_each_within_five_percent():
    sizes = [0] * 4
    for n in range(10_000):
        sizes[shard_of(f"w-{n:016x}", 4)] += 1

    assert all(abs(size - 2_500) <= 125 for size in sizes), sizes


@pytest.mark.parametrize(
    ("index", "count", "field"),
    [(0, 0, "count"), (0, MAX_SHARDS + 1, "count"), (4, 4, "index"), (-1, 2, "index")],
)
def test_given_an_impossible_shard_then_it_is_refused_naming_the_field(index, count, field):
    with pytest.raises(ValueError, match=f"shard {field}"):
        Shard(index, count)


def test_given_one_shard_then_its_names_stay_the_unsharded_ones_and_it_leads():
    assert (Shard().suffix, Shard().leads) == ("", True)
    assert (Shard(1, 4).suffix, Shard(1, 4).leads) == ("#2of4", False)


def test_given_the_configured_split_then_a_cycle_over_any_of_its_shards_may_run():
    assert [split_mismatch(Shard(index, 3), 3) for index in range(3)] == [None] * 3
    assert split_mismatch(Shard(), 1) is None


@pytest.mark.parametrize(("shard", "configured"), [(Shard(), 3), (Shard(1, 4), 3), (Shard(0, 2), 1)])
def test_given_another_split_than_the_configured_one_then_the_refusal_names_both(shard, configured):
    reason = split_mismatch(shard, configured)

    assert reason is not None
    assert f"runs {configured} reconcile shard(s)" in reason
    assert f"got shard {shard.index} of {shard.count}" in reason
