"""The metrics the reconciler and discovery emit are the ones the stack's dashboard and alarms read."""

from __future__ import annotations

import inspect

from fleetkeeper.services import bookings, discovery, reconcile, rollouts
from fleetkeeper.services.drains import watchdog
from fleetkeeper.services.reconcile import capacity, repair
from fleetkeeper.services.rollouts import engine, step
from infra import metrics as dashboard


def test_given_the_reconcile_metrics_then_the_dashboard_knows_each_name():
    names = {
        reconcile.METRIC_DURATION_MS,
        reconcile.METRIC_ERRORS,
        reconcile.METRIC_HEARTBEAT,
        *(reconcile.workers_metric(status) for status in reconcile.RECONCILE_STATUSES),
    }
    assert names <= set(dashboard.ALL_METRICS)
    assert {reconcile.workers_metric(s) for s in dashboard.REPORTED_STATUSES} <= names


def test_given_discovery_then_its_orphan_metric_is_the_dashboards():
    assert discovery.METRIC_ORPHANS_TERMINATED == dashboard.ORPHANS_TERMINATED
    assert discovery.METRIC_ORPHAN_GC_HELD_BACK == dashboard.ORPHAN_GC_HELD_BACK


def test_given_the_repair_brake_then_its_metric_is_the_one_the_alarm_watches():
    assert repair.METRIC_REPAIR_BLOCKED == dashboard.REPAIR_BLOCKED
    assert dashboard.REPAIR_BLOCKED in dashboard.ALL_METRICS


def test_given_scale_out_then_its_metrics_are_the_ones_the_alarm_and_dashboard_name():
    assert capacity.METRIC_BLOCKED == dashboard.CAPACITY_BLOCKED
    assert (
        capacity.METRIC_TARGET,
        capacity.METRIC_FREE_SLOTS,
        capacity.METRIC_WARM,
    ) == dashboard.CAPACITY_GAUGES
    assert dashboard.CAPACITY_BLOCKED in dashboard.ALL_METRICS


def test_given_bookings_then_their_metrics_are_the_ones_the_alarm_and_dashboard_name():
    assert (bookings.METRIC_WAITING, bookings.METRIC_AT_RISK) == dashboard.BOOKING_GAUGES
    assert bookings.METRIC_FAILED == dashboard.BOOKINGS_FAILED
    # The alarm watches the cycle's counter, published as Reconcile.<counter>.
    assert f"Reconcile.{bookings.COUNTER_AT_RISK}" == dashboard.BOOKINGS_AT_RISK_COUNTER


def test_given_the_drain_watchdog_then_its_metric_is_the_one_the_alarm_watches():
    assert watchdog.METRIC_EXECUTION_LOST == dashboard.DRAIN_EXECUTION_LOST


def test_given_the_rollout_events_with_a_metric_then_the_dashboard_plots_exactly_those():
    assert set(rollouts.METRIC_EVENTS) == set(dashboard.ROLLOUT_EVENTS)
    assert set(dashboard.ROLLOUT_EVENTS) <= set(dashboard.ALL_METRICS)


def test_given_the_rollout_engine_then_the_counters_the_dashboard_plots_are_its_own():
    source = inspect.getsource(engine) + inspect.getsource(step)
    for name in dashboard.ROLLOUT_ENGINE_COUNTERS:
        prefix, counter = name.split(".")
        assert prefix == "Reconcile"
        assert f'counters["{counter}"]' in source, name
