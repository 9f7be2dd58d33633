"""Rollouts advanced by reconcile cycles, with the real drain workflow on moto's Step Functions: never
more than max_unavailable of the scope out of placement, surge never below the RUNNING count it
started with, a checkpoint pauses, a cancel stops new waves."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import WorkerStatus
from fleetkeeper.domain.models import Worker
from fleetkeeper.domain.rollouts import replacement_id
from fleetkeeper.observability import metrics
from fleetkeeper.services.rollouts import step
from tests.integration.emf import metric_totals
from tests.integration.functions import reconcile_fleet

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MAX_CYCLES = 80


@pytest.fixture
def pool_of(control_plane, live_worker) -> Callable[[int], list[Worker]]:
    """`count` RUNNING workers of template lab in pool labs, whose budget lets two be disrupted at once.
    Each wave costs about four reconcile cycles, so a test takes as few workers as its waves need."""

    def make(count: int) -> list[Worker]:
        status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 2}]}})
        assert status == 201
        return [live_worker(pool="labs") for _ in range(count)]

    return make


def _statuses(control_plane, ids: list[str]) -> dict[str, WorkerStatus]:
    found: dict[str, WorkerStatus] = control_plane.ctx.store.worker_statuses(ids)
    return found


def _run(
    control_plane, rollout_id: str, sample: Callable[[], None], *, until: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Reconcile cycles until `until` holds for the rollout's view, sampling after every cycle."""
    view: dict[str, Any] = {}
    for _ in range(MAX_CYCLES):
        reconcile_fleet(control_plane.ctx)
        sample()
        _, view = control_plane.api("GET", f"/api/v1/rollouts/{rollout_id}")
        if until(view):
            return view
        time.sleep(0.2)
    raise AssertionError(f"rollout did not get there in {MAX_CYCLES} cycles: {view}")


def test_given_drain_first_with_max_unavailable_2_then_never_more_than_2_are_out_of_placement(
    control_plane, pool_of
):
    old = [w.id for w in pool_of(4)]
    _, started = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {"template": "lab", "pool": "labs", "max_unavailable": 2, "strategy": "drain_first"},
    )
    new = [replacement_id(started["id"], w) for w in old]
    worst: list[int] = []

    def sample() -> None:
        statuses = _statuses(control_plane, old + new)
        serving = sum(1 for s in statuses.values() if s == WorkerStatus.RUNNING)
        worst.append(len(old) - serving)

    done = _run(control_plane, started["id"], sample, until=lambda v: v["status"] != "RUNNING")

    assert (done["status"], done["replaced"], done["percent"]) == ("SUCCEEDED", 4, 100), done
    assert max(worst) <= 2, worst
    assert max(worst) == 2, worst  # both workers of a wave drain together, never more
    finals = _statuses(control_plane, old + new)
    assert all(finals[w] == WorkerStatus.TERMINATED for w in old)
    assert all(finals[w] == WorkerStatus.RUNNING for w in new)


def test_given_surge_then_the_running_count_never_drops_below_the_start(control_plane, pool_of, capsys):
    # The cycles run the reconciler's service without its handler: publish what earlier tests left.
    metrics.flush_metrics()
    capsys.readouterr()
    old = [w.id for w in pool_of(4)]
    _, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "max_unavailable": 2}
    )
    new = [replacement_id(started["id"], w) for w in old]
    running: list[int] = []

    def sample() -> None:
        statuses = _statuses(control_plane, old + new)
        running.append(sum(1 for s in statuses.values() if s == WorkerStatus.RUNNING))

    done = _run(control_plane, started["id"], sample, until=lambda v: v["status"] != "RUNNING")

    assert (done["status"], done["replaced"]) == ("SUCCEEDED", 4), done
    assert min(running) >= 4, running
    # Each old worker's drain started only once its replacement ran: they ran side by side.
    store = control_plane.ctx.store
    for old_id, new_id in zip(old, new, strict=True):
        ran = min(e.at for e in store.audit_page("worker", new_id).items if e.to_status == "RUNNING")
        drained = min(
            e.at for e in store.audit_page("worker", old_id).items if e.action == "WorkerDrainStarted"
        )
        assert ran <= drained, (old_id, ran, drained)
    metrics.flush_metrics()
    published = metric_totals(capsys.readouterr().out)
    outcomes = (published["RolloutStarted"], published["RolloutSucceeded"], published["RolloutFailed"])
    assert outcomes == (1, 1, 0)
    assert published["RolloutWaveStarted"] == 2  # four workers, two a wave: each wave announced once
    assert published["Reconcile.rollout_steps"] >= 2  # a step per cycle at least, one wave each


def test_given_a_checkpoint_then_the_rollout_pauses_there_and_a_cancel_stops_new_waves(
    control_plane, pool_of
):
    # Three waves of one: the first reaches the checkpoint, the second starts, the third never does.
    old = [w.id for w in pool_of(3)]
    _, started = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {
            "template": "lab",
            "pool": "labs",
            "max_unavailable": 1,
            "strategy": "drain_first",
            "checkpoints": [30],
        },
    )

    paused = _run(control_plane, started["id"], lambda: None, until=lambda v: v["status"] != "RUNNING")

    assert (paused["status"], paused["checkpoint"], paused["replaced"]) == ("PAUSED", 30, 1), paused
    assert paused["blocked"]["reason"] == "checkpoint"
    # Paused: cycles start nothing new.
    before = _statuses(control_plane, old)
    for _ in range(3):
        reconcile_fleet(control_plane.ctx)
    assert _statuses(control_plane, old) == before

    status, resumed = control_plane.api("POST", f"/api/v1/rollouts/{started['id']}/resume")
    assert (status, resumed["status"], resumed["checkpoint"]) == (200, "RUNNING", None)
    reconcile_fleet(control_plane.ctx)  # the next wave starts: one more drain
    status, cancelled = control_plane.api("POST", f"/api/v1/rollouts/{started['id']}/cancel")
    assert (status, cancelled["status"]) == (200, "CANCELLED")
    touched = {w for w, s in _statuses(control_plane, old).items() if s != WorkerStatus.RUNNING}
    for _ in range(5):
        reconcile_fleet(control_plane.ctx)
        time.sleep(0.2)
    # No wave after the cancel: the last two workers stay in service.
    after = _statuses(control_plane, old)
    untouched = sorted(old)[2:]
    assert all(after[w] == WorkerStatus.RUNNING for w in untouched), after
    assert len(touched) == 2


def test_given_a_budget_that_allows_no_rollout_then_it_waits_and_says_why(control_plane, live_worker):
    status, _ = control_plane.api(
        "PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 0, "reasons": ["rollout"]}]}}
    )
    assert status == 201
    old = [live_worker(pool="labs").id for _ in range(2)]
    _, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "strategy": "drain_first"}
    )

    for _ in range(2):
        reconcile_fleet(control_plane.ctx)

    _, view = control_plane.api("GET", f"/api/v1/rollouts/{started['id']}")
    assert (view["status"], view["blocked"]["reason"], view["in_progress"]) == ("RUNNING", "budget", 1), view
    assert "budget 0 allows 0" in view["blocked"]["detail"]
    assert set(_statuses(control_plane, old).values()) == {WorkerStatus.RUNNING}


def test_given_a_checkpoint_delay_then_the_rollout_goes_on_by_itself_and_replace_false_creates_none(
    control_plane, live_worker
):
    # A pool budget governs: the stage default (no budget applies) would count the first drain's
    # ledger entry for minutes after the worker is gone.
    status, _ = control_plane.api("PUT", "/api/v1/pools/labs", {"disruption": {"budgets": [{"max": 1}]}})
    assert status == 201
    old = [live_worker(pool="labs").id for _ in range(2)]
    _, started = control_plane.api(
        "POST",
        "/api/v1/rollouts",
        {
            "worker_ids": old,
            "max_unavailable": 1,
            "checkpoints": [50],
            "checkpoint_delay_seconds": 0,
            "replace": False,
        },
    )

    done = _run(
        control_plane,
        started["id"],
        lambda: None,
        until=lambda v: v["status"] != "RUNNING" and v["status"] != "PAUSED",
    )

    assert (done["status"], done["replaced"], done["skipped"]) == ("SUCCEEDED", 2, 0), done
    assert set(_statuses(control_plane, old).values()) == {WorkerStatus.TERMINATED}
    assert not _statuses(control_plane, [replacement_id(started["id"], w) for w in old])
    trail = control_plane.ctx.store.audit_page("rollout", started["id"]).items
    assert [e.action for e in reversed(trail)] == [
        "RolloutStarted",
        "RolloutPaused",
        "RolloutResumed",
        "RolloutSucceeded",
    ]


def test_given_a_worker_already_draining_for_another_reason_then_a_surge_rollout_gives_it_no_replacement(
    control_plane, pool_of
):
    # Its expiry (or an operator) already drains it, and replaces it if it should be: a second
    # replacement would add a worker the scope never lost.
    ids = sorted(w.id for w in pool_of(4))
    _, started = control_plane.api(
        "POST", "/api/v1/rollouts", {"template": "lab", "pool": "labs", "max_unavailable": 2}
    )
    # The last wave's worker starts draining after the rollout began; a session keeps it DRAINING
    # while its wave comes.
    leaving, others = ids[-1], ids[:-1]
    status, placed = control_plane.api("POST", "/api/v1/instances", {"worker_id": leaving})
    assert status == 201, placed
    status, _ = control_plane.api(
        "POST", f"/api/v1/workers/{leaving}/drain", {"timeout_seconds": 3600, "reschedule": False}
    )
    assert status == 202

    done = _run(control_plane, started["id"], lambda: None, until=lambda v: v["status"] != "RUNNING")

    assert (done["status"], done["replaced"], done["skipped"]) == ("SUCCEEDED", 3, 1), done
    assert control_plane.ctx.store.find_worker(replacement_id(started["id"], leaving)) is None
    assert control_plane.ctx.store.get_worker(leaving).status is WorkerStatus.DRAINING
    finals = _statuses(control_plane, [replacement_id(started["id"], w) for w in others])
    assert set(finals.values()) == {WorkerStatus.RUNNING}


def test_given_more_active_rollouts_than_a_cycle_serves_then_each_advances_within_two_cycles(
    control_plane, live_worker, monkeypatch
):
    # The limit is what the test is about, not its size: four a cycle shows it as twenty would.
    monkeypatch.setattr(step, "MAX_ROLLOUTS_PER_CYCLE", 4)
    served = step.MAX_ROLLOUTS_PER_CYCLE
    started = []
    for _ in range(served + 3):
        worker = live_worker(pool="labs")
        status, view = control_plane.api("POST", "/api/v1/rollouts", {"worker_ids": [worker.id]})
        assert status == 202, view
        started.append(view["id"])
    rollouts = control_plane.ctx.rollouts
    stored = {r: rollouts.get(r).version for r in started}

    def advanced() -> set[str]:
        return {r for r in started if rollouts.get(r).version > stored[r]}

    first = reconcile_fleet(control_plane.ctx)
    after_first = advanced()
    second = reconcile_fleet(control_plane.ctx)

    assert first.counters["rollout_steps"] == len(after_first) == served
    # The second cycle starts after the last one served: the three left first, then around.
    assert second.counters["rollout_steps"] == served
    assert advanced() == set(started)
