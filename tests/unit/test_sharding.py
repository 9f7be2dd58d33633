"""The reconcile shards partition the fleet: every worker id has exactly one owner, whatever the count."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetkeeper.domain.sharding import MAX_SHARDS, Shard, shard_of, split_mismatch

worker_ids = st.text(min_size=1, max_size=64)
counts = st.integers(min_value=1, max_value=MAX_SHARDS)


@given(ids=st.lists(worker_ids, min_size=1, max_size=200, unique=True), count=counts)
def test_given_any_fleet_and_shard_count_then_each_worker_has_exactly_one_owner(ids, count):
    shards = [Shard(index, count) for index in range(count)]

    owners = {worker_id: [s.index for s in shards if s.owns(worker_id)] for worker_id in ids}

    assert all(len(found) == 1 for found in owners.values())
    assert all(owners[w] == [shard_of(w, count)] for w in ids)


def test_given_the_same_id_then_the_shard_is_the_same_in_every_process_and_release():
    # SHA-256, not the per-process salted hash(): values pinned once must never move, or a deploy would
    # hand workers to another shard while the old one may still be running.
    assert [shard_of(f"w-{n:016x}", 4) for n in range(8)] == [2, 0, 1, 2, 1, 0, 1, 0]


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
