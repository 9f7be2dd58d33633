"""One simulated Monday of the capacity week benchmark (bench/capacity_week_bench.py): its headline
relations hold on a slice small enough for the unit suite."""

from __future__ import annotations

from datetime import timedelta

from bench.capacity_week_bench import Strategy, simulate

MONDAY = timedelta(days=1)


def test_given_a_simulated_monday_when_strategies_run_then_fleetkeeper_books_all_in_time_for_less() -> None:
    results = simulate(horizon=MONDAY)
    always_on, reactive, fleetkeeper = (results[s] for s in Strategy)

    assert fleetkeeper.booked > 100  # Monday's classes in all three zones fall inside the day
    # Main's booking clock places every booking by its timeslot: none FAILED no_capacity_by_timeslot.
    assert fleetkeeper.failed == 0
    # Scale-in keeps what due bookings need: every booked session starts on a RUNNING worker.
    assert fleetkeeper.on_time == fleetkeeper.booked
    assert fleetkeeper.scaled_in > 0
    assert fleetkeeper.dollars < always_on.dollars
    # The reactive strategy launches only once a placement finds no room: the 09:00 classes wait.
    assert reactive.on_time < reactive.booked
    assert sum(c["RunInstances"] for c in fleetkeeper.calls.values()) > 0
