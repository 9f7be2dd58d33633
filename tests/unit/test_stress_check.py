"""The torture run's invariant checker finds what it is there to find (bench/stress_check.py)."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import stress_check as sc

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def found() -> dict[str, list[str]]:
    return {name: [] for name in sc.INVARIANTS}


def shot(audit: dict[tuple[str, str], list[dict[str, Any]]] | None = None, **kw: Any) -> sc.Snapshot:
    trail: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list, audit or {})
    return sc.Snapshot(kw.get("workers", {}), kw.get("instances", {}), kw.get("pools", {}), trail)


def event(
    seconds: float, source: str | None, target: str, action: str = "X", cause: str = "CONTROL"
) -> dict[str, Any]:
    return {
        "at": at(seconds).isoformat(),
        "from_status": source,
        "to_status": target,
        "action": action,
        "actor": "t",
        "details": {"cause": cause},
    }


def placement(sent: float, received: float, worker: str = "w1", pool: str | None = None) -> sc.Placement:
    return sc.Placement("i1", worker, pool, "caller", {}, at(sent), at(received))


def test_given_a_drain_acknowledged_when_a_later_placement_lands_on_the_worker_then_it_is_a_violation() -> (
    None
):
    seen = sc.Observations(started_at=T0)
    seen.drain_acks.append(sc.Ack("w1", at(1), at(2), 1))
    seen.placements.append(placement(3, 4))
    trail = {("worker", "w1"): [event(1.5, "RUNNING", "DRAINING")]}
    result = found()
    sc._placements_after_drains(seen, shot(trail), result)
    assert len(result["placement onto a worker after its drain was acknowledged"]) == 1


def test_given_the_worker_reopened_after_its_drain_when_a_placement_lands_then_it_is_fine() -> None:
    seen = sc.Observations(started_at=T0)
    seen.drain_acks.append(sc.Ack("w1", at(1), at(2), 1))
    seen.placements.append(placement(3, 4))
    # A cancel committed between the drain's own move and the acknowledgement: the drain was over.
    trail = {("worker", "w1"): [event(1.2, "RUNNING", "DRAINING"), event(1.8, "DRAINING", "RUNNING")]}
    result = found()
    sc._placements_after_drains(seen, shot(trail), result)
    assert result["placement onto a worker after its drain was acknowledged"] == []


def test_given_a_read_answered_when_a_later_read_sees_an_older_version_then_it_is_a_violation() -> None:
    seen = sc.Observations(started_at=T0)
    seen.samples += [sc.Sample("w1", 5, 0, 3, at(0), at(1)), sc.Sample("w1", 4, 0, 3, at(2), at(3))]
    result = found()
    sc._versions(seen, shot(workers={"w1": {"version": 5}}), result)
    assert len(result["worker version went backwards"]) == 1


def test_given_overlapping_reads_when_they_see_different_versions_then_it_is_fine() -> None:
    seen = sc.Observations(started_at=T0)
    seen.samples += [sc.Sample("w1", 5, 0, 3, at(0), at(2)), sc.Sample("w1", 4, 0, 3, at(1), at(3))]
    result = found()
    sc._versions(seen, shot(workers={"w1": {"version": 5}}), result)
    assert result["worker version went backwards"] == []


def test_given_an_audit_trail_with_an_illegal_move_then_the_replay_reports_it() -> None:
    workers = {"w1": {"id": "w1", "status": "RUNNING"}}
    trail = {("worker", "w1"): [event(0, None, "PENDING"), event(1, "PENDING", "RUNNING", cause="CONTROL")]}
    result = found()
    sc._audit(shot(trail, workers=workers), result)
    # PENDING -> RUNNING is only believable with EC2 as the witness.
    assert len(result["audit trail does not replay through the transition table"]) == 1


def test_given_two_cancels_of_one_drain_both_acknowledged_then_it_is_a_violation() -> None:
    seen = sc.Observations(started_at=T0)
    seen.pool_drain_acks.append(sc.Ack("p", at(0), at(1)))
    seen.pool_cancels += [sc.Ack("p", at(2), at(3)), sc.Ack("p", at(2.1), at(3.1))]
    result = found()
    sc._exclusive_acks(seen, shot(), result)
    assert len(result["cancel acknowledged twice for one drain"]) == 1


def test_given_a_drain_that_finished_while_an_instance_ran_then_it_is_a_violation() -> None:
    workers = {"w1": {"id": "w1", "status": "STOPPING"}}
    instances = {"i1": {"id": "i1", "worker_id": "w1", "state": "TERMINATED"}}
    trail = {
        ("worker", "w1"): [event(0, "RUNNING", "DRAINING"), event(5, "DRAINING", "STOPPING")],
        ("instance", "i1"): [
            {"at": at(-1).isoformat(), "action": "InstancePlaced", "to_status": "SCHEDULED"},
            {
                "at": at(6).isoformat(),
                "action": "InstanceTerminated",
                "to_status": "TERMINATED",
                "reason": "worker_stopped",
            },
        ],
    }
    result = found()
    sc._drain_endings(shot(trail, workers=workers, instances=instances), result)
    assert len(result["drain finished while its worker still had active instances"]) == 1
