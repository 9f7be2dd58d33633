"""A template's lead time: p95 of the last 50 samples of each kind, the stated default below 5 samples,
and the one sample a worker's move to RUNNING yields."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetkeeper.domain.lead_time import (
    DEFAULT_LAUNCH,
    DEFAULT_START,
    MIN_SAMPLES,
    SAMPLES_KEPT,
    LeadKind,
    coming_up,
    kept,
    lead_time_of,
    percentile,
    sample_of,
    settled_lead,
)
from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker

S = WorkerStatus
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def worker(status: S, **changes: object) -> Worker:
    return Worker(id="w-1", template="lab", region="us-east-1", capacity=4, status=status).model_copy(
        update=changes
    )


def test_given_no_samples_then_both_figures_are_the_stated_defaults() -> None:
    lead = lead_time_of({})

    assert (lead.launch_seconds, lead.start_seconds) == (600.0, 120.0)
    assert (timedelta(minutes=10), timedelta(minutes=2)) == (DEFAULT_LAUNCH, DEFAULT_START)
    assert (lead.samples_launch, lead.samples_start, lead.source) == (0, 0, "default")


def test_given_four_launches_then_the_launch_is_still_the_default_and_says_how_many_were_measured() -> None:
    lead = lead_time_of({LeadKind.LAUNCH: [30.0] * (MIN_SAMPLES - 1), LeadKind.START: [10.0] * MIN_SAMPLES})

    assert lead.launch_seconds == 600.0
    assert lead.samples_launch == MIN_SAMPLES - 1
    assert lead.start_seconds == 10.0
    assert lead.source == "default"


def test_given_enough_samples_of_both_kinds_then_each_is_their_p95_and_measured() -> None:
    launches = [float(s) for s in range(1, 21)]  # 1..20: p95 by nearest rank is the 19th
    starts = [5.0] * 9 + [50.0]

    lead = lead_time_of({LeadKind.LAUNCH: launches, LeadKind.START: starts})

    assert lead.launch_seconds == 19.0
    assert lead.start_seconds == 50.0
    assert (lead.samples_launch, lead.samples_start, lead.source) == (20, 10, "measured")


def test_given_more_than_fifty_samples_then_only_the_last_fifty_count() -> None:
    samples = [1000.0] * 10 + [60.0] * SAMPLES_KEPT

    lead = lead_time_of({LeadKind.LAUNCH: samples, LeadKind.START: samples})

    assert lead.launch_seconds == 60.0
    assert lead.samples_launch == SAMPLES_KEPT


@given(st.lists(st.floats(min_value=0, max_value=10_000), min_size=1, max_size=200))
def test_given_any_samples_then_the_p95_is_one_of_them_and_at_least_95_percent_are_at_or_under_it(
    samples: list[float],
) -> None:
    p95 = percentile(samples)

    assert p95 in samples
    assert sum(1 for s in samples if s <= p95) >= 0.95 * len(samples)
    assert sum(1 for s in samples if s < p95) < 0.95 * len(samples)


@given(st.lists(st.floats(min_value=0, max_value=10_000), max_size=120), st.floats(min_value=0, max_value=99))
def test_given_a_new_sample_then_the_newest_fifty_are_kept_in_order(samples: list[float], new: float) -> None:
    after = kept(samples, new)

    assert after == [*samples, new][-SAMPLES_KEPT:]
    assert len(after) <= SAMPLES_KEPT


@pytest.mark.parametrize(
    ("kind", "status"), [(LeadKind.LAUNCH, S.PROVISIONING), (LeadKind.START, S.STARTING)]
)
def test_given_a_worker_coming_up_when_it_runs_then_the_sample_is_from_its_begin_to_ec2_running(
    kind: LeadKind, status: S
) -> None:
    before = worker(status, ec2_observed_at=T0, **coming_up(kind, T0))
    ran = T0 + timedelta(seconds=95)
    after = worker(S.RUNNING, ec2_observed_at=ran, updated_at=ran + timedelta(seconds=2))

    assert sample_of(before, after) == (kind, 95.0)


def test_given_a_move_that_carries_no_new_observation_then_the_moves_time_ends_the_sample() -> None:
    before = worker(S.STARTING, ec2_observed_at=T0, **coming_up(LeadKind.START, T0))
    after = worker(S.RUNNING, ec2_observed_at=T0, updated_at=T0 + timedelta(seconds=42))

    assert sample_of(before, after) == (LeadKind.START, 42.0)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (worker(S.PROVISIONING), worker(S.RUNNING)),  # nobody said when it began
        (worker(S.DRAINING, **coming_up(LeadKind.START, T0)), worker(S.RUNNING)),  # a cancelled drain
        (worker(S.PROVISIONING, **coming_up(LeadKind.LAUNCH, T0)), worker(S.STARTING)),  # not running yet
        (worker(S.STARTING, **coming_up(LeadKind.LAUNCH, T0)), worker(S.STOPPED)),
    ],
    ids=["no-begin", "not-coming-up", "still-coming-up", "never-ran"],
)
def test_given_a_move_that_is_not_coming_up_to_running_then_it_yields_no_sample(
    before: Worker, after: Worker
) -> None:
    assert sample_of(before, after) is None


def test_given_a_worker_coming_up_then_only_leaving_provisioning_and_starting_clears_its_begin() -> None:
    launching = worker(S.PROVISIONING, **coming_up(LeadKind.LAUNCH, T0))

    assert settled_lead(launching, S.STARTING) == {}
    assert settled_lead(launching, S.RUNNING) == {"lead_kind": None, "lead_since": None}
    assert settled_lead(launching, S.FAILED) == {"lead_kind": None, "lead_since": None}
    assert settled_lead(worker(S.RUNNING), S.DRAINING) == {}
