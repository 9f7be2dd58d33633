"""One simulated Monday of the capacity week benchmark (bench/capacity_week_bench.py): its headline
relations hold on a slice small enough for the unit suite."""

from __future__ import annotations

from datetime import timedelta

from bench.capacity_week_bench import Strategy, simulate


def test_given_a_simulated_monday_when_strategies_run_then_fleetkeeper_books_all_on_time_for_less() -> None:
    results = simulate(horizon=timedelta(days=1))
    always_on, reactive, fleetkeeper = (results[s] for s in Strategy)

    assert fleetkeeper.booked > 100  # Monday's classes in all three zones fall inside the day
    assert fleetkeeper.on_time == fleetkeeper.booked
    assert fleetkeeper.dollars < always_on.dollars
    # The reactive strategy launches only once a placement finds no room: the 09:00 classes wait.
    assert reactive.on_time < reactive.booked
    assert sum(c["RunInstances"] for c in fleetkeeper.calls.values()) > 0
