"""The torture run's invariant checker finds what it is there to find (bench/stress_check.py)."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

from bench import stress_check as sc
from fleetkeeper.domain.rollouts import replacement_id, restoration_id

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


def call(status: int, error: str | None) -> sc.Call:
    return sc.Call("place_pool", "POST", "/api/v1/instances", status, {"error": error}, at(0), at(1))


def test_given_a_full_fleet_answered_409_then_it_is_counted_apart_and_any_5xx_is_a_violation() -> None:
    seen = sc.Observations(started_at=T0)
    for answer in (call(409, "NO_CAPACITY"), call(409, "NO_CAPACITY"), call(503, "NO_CAPACITY")):
        seen.record_call(answer)
    result = found()
    no_capacity = sc._statuses(seen, result)
    assert no_capacity == 2  # the 409s keep their error code through record_call
    # The contract answers a full fleet with 409: a 503 saying NO_CAPACITY is a server error like any.
    assert len(result["5xx answer"]) == 1


def test_given_an_acknowledged_placement_missing_from_the_table_then_it_is_a_violation() -> None:
    seen = sc.Observations(started_at=T0)
    seen.placements += [
        sc.Placement(instance, "w1", None, "caller", {}, at(0), at(1))
        for instance in ("i1", "i2", "i3", "i4")
    ]
    # i1 is where it was answered and i2 was moved by a drain's reschedule; i3's write was lost with its
    # answer and never retried; i4 is on another worker with no move in its trail.
    instances = {
        "i1": {"id": "i1", "worker_id": "w1", "state": "SCHEDULED"},
        "i2": {"id": "i2", "worker_id": "w2", "state": "SCHEDULED"},
        "i4": {"id": "i4", "worker_id": "w2", "state": "SCHEDULED"},
    }
    trail = {("instance", "i2"): [{"at": at(2).isoformat(), "action": "InstanceMoved"}]}
    result = found()
    sc._placements_kept(seen, shot(trail, instances=instances), result)
    assert [line.split()[1] for line in result["acknowledged placement not in the table"]] == ["i3", "i4"]


def scale_down(seconds: float, target: str = "STOPPING") -> dict[str, Any]:
    return {**event(seconds, "RUNNING", target), "actor": sc.SCALE_DOWN_ACTOR}


def test_given_two_scale_downs_of_one_scope_inside_the_cooldown_then_it_is_a_violation() -> None:
    workers = {w: {"id": w, "template": "t", "pool": "p"} for w in ("w1", "w2", "w3")}
    trail = {
        ("worker", "w1"): [scale_down(0)],
        ("worker", "w2"): [scale_down(2, "DRAINING")],  # another shard's, in the same breath
        ("worker", "w3"): [scale_down(40)],  # a cooldown later: fine
    }
    result = found()
    sc._scale_downs(shot(trail, workers=workers), timedelta(seconds=30), result)
    assert len(result["two scale-downs of one scope inside its cooldown"]) == 1


def test_given_scale_downs_of_different_scopes_at_once_then_it_is_fine() -> None:
    workers = {
        "w1": {"id": "w1", "template": "t", "pool": "p"},
        "w2": {"id": "w2", "template": "t", "pool": "q"},
    }
    trail = {("worker", "w1"): [scale_down(0)], ("worker", "w2"): [scale_down(0)]}
    result = found()
    sc._scale_downs(shot(trail, workers=workers), timedelta(seconds=30), result)
    assert result["two scale-downs of one scope inside its cooldown"] == []


def operation(op_id: str, status: str, origin: str = "request", created: float = 0) -> dict[str, Any]:
    return {
        "id": op_id,
        "worker_id": "w1",
        "status": status,
        "origin": origin,
        "created_at": at(created).isoformat(),
    }


def test_given_a_lock_without_its_open_operation_or_two_open_operations_then_each_is_a_violation() -> None:
    cases = [
        ({"operation_in_flight": "op1"}, [operation("op1", "SUCCESS")]),  # finished, lock left behind
        ({}, [operation("op1", "PENDING")]),  # open, no lock: another could start beside it
        ({"operation_in_flight": "op1"}, [operation("op1", "RUNNING"), operation("op2", "PENDING")]),
    ]
    for lock, operations in cases:
        snapshot = shot(workers={"w1": {"id": "w1", "status": "RUNNING", **lock}})
        snapshot.operations["w1"] = operations
        result = found()
        sc._operation_locks(snapshot, result)
        assert len(result["worker's operation lock and its open operations disagree"]) == 1, (
            lock,
            operations,
        )
    snapshot = shot(workers={"w1": {"id": "w1", "status": "RUNNING", "operation_in_flight": "op2"}})
    snapshot.operations["w1"] = [operation("op1", "SUCCESS"), operation("op2", "RUNNING")]
    result = found()
    sc._operation_locks(snapshot, result)
    assert result["worker's operation lock and its open operations disagree"] == []


def test_given_a_drain_that_stopped_its_worker_without_its_before_stop_operation_then_it_is_a_violation() -> (
    None
):
    workers = {"w1": {"id": "w1", "status": "STOPPING", "template": "t"}}
    completed = {**event(10, "DRAINING", "STOPPING"), "action": "WorkerDrainCompleted"}
    trail = {("worker", "w1"): [event(0, "RUNNING", "DRAINING"), completed]}
    snapshot = shot(trail, workers=workers)
    snapshot.before_stop["t"] = ["deregister-license"]
    # An operation from before the drain does not count for it.
    snapshot.operations["w1"] = [operation("op0", "SUCCESS", origin="before_stop", created=-5)]
    result = found()
    sc._before_stops(snapshot, result)
    assert len(result["drain stopped its worker without its before_stop operations"]) == 1

    snapshot.operations["w1"].append(operation("op1", "SUCCESS", origin="before_stop", created=8))
    result = found()
    sc._before_stops(snapshot, result)
    assert result["drain stopped its worker without its before_stop operations"] == []


def test_given_an_instance_moved_onto_a_worker_after_its_drain_finished_then_that_drain_is_fine() -> None:
    workers = {"w2": {"id": "w2", "status": "STOPPING"}}
    instances = {"i1": {"id": "i1", "worker_id": "w2", "state": "SCHEDULED"}}
    trail = {
        ("worker", "w2"): [event(0, "RUNNING", "DRAINING"), event(5, "DRAINING", "STOPPING")],
        # Placed on another worker before w2's drain finished, moved onto w2 only after it.
        ("instance", "i1"): [
            {"at": at(-1).isoformat(), "action": "InstancePlaced", "to_status": "SCHEDULED"},
            {"at": at(6).isoformat(), "action": "InstanceMoved"},
        ],
    }
    result = found()
    sc._drain_endings(shot(trail, workers=workers, instances=instances), result)
    assert result["drain finished while its worker still had active instances"] == []


# ---- rollouts ----------------------------------------------------------------------------------------

RID = "ro-0000000000000001"


def rollout(
    scope: list[str], *, status: str = "RUNNING", strategy: str = "surge", limit: int = 1, **kw: Any
) -> dict[str, Any]:
    return {
        "id": RID,
        "status": status,
        "worker_ids": scope,
        "max_unavailable": limit,
        "strategy": strategy,
        "replace": True,
        "blocked": None,
        "updated_at": at(0).isoformat(),
    } | kw


def worker(wid: str, status: str, drained_by: str | None = None) -> dict[str, Any]:
    drain = {"requested_by": drained_by, "outcome": "RUNNING"} if drained_by else None
    return {"id": wid, "status": status, "drain": drain, "version": 1}


def test_given_two_workers_drained_by_a_rollout_of_max_unavailable_one_then_it_is_a_violation() -> None:
    by = f"rollout:{RID}"
    workers = {
        "w1": worker("w1", "DRAINING", by),
        "w2": worker("w2", "DRAINING", by),
        # One drained by an operator is not the rollout's doing.
        "w3": worker("w3", "DRAINING", "arn:aws:iam::1:user/op"),
        replacement_id(RID, "w1"): worker(replacement_id(RID, "w1"), "RUNNING"),
        replacement_id(RID, "w2"): worker(replacement_id(RID, "w2"), "RUNNING"),
    }
    result = found()
    sc.judge_rollout_sample(sc.RolloutSample(at(5), rollout(["w1", "w2", "w3"]), workers), result)
    assert len(result["rollout took more than max_unavailable of its scope out of placement"]) == 1
    assert result["surge rollout drained a worker before its replacement ran"] == []
    result = found()
    sc.judge_rollout_sample(sc.RolloutSample(at(5), rollout(["w1", "w2", "w3"], limit=2), workers), result)
    assert result["rollout took more than max_unavailable of its scope out of placement"] == []


def test_given_drain_first_workers_gone_with_replacements_not_yet_running_then_they_count_as_out() -> None:
    by = f"rollout:{RID}"
    workers = {
        "w1": worker("w1", "TERMINATED", by),
        "w2": worker("w2", "DRAINING", by),
        replacement_id(RID, "w1"): worker(replacement_id(RID, "w1"), "PROVISIONING"),
    }
    result = found()
    sample = sc.RolloutSample(at(5), rollout(["w1", "w2"], strategy="drain_first"), workers)
    sc.judge_rollout_sample(sample, result)
    assert len(result["rollout took more than max_unavailable of its scope out of placement"]) == 1


def test_given_a_surge_rollout_draining_a_worker_whose_replacement_never_ran_then_it_is_a_violation() -> None:
    by = f"rollout:{RID}"
    new = replacement_id(RID, "w1")
    workers = {"w1": worker("w1", "DRAINING", by), new: worker(new, "STARTING")}
    result = found()
    sc.judge_rollout_sample(sc.RolloutSample(at(5), rollout(["w1"]), workers), result)
    assert len(result["surge rollout drained a worker before its replacement ran"]) == 1
    # The same replacement had been RUNNING before the sample (an operator stopped and restarted it).
    result = found()
    sc.judge_rollout_sample(sc.RolloutSample(at(5), rollout(["w1"]), workers), result, {new: at(2)})
    assert result["surge rollout drained a worker before its replacement ran"] == []


def test_given_an_idle_unblocked_running_rollout_then_it_is_a_violation_and_a_blocked_one_is_not() -> None:
    stuck = rollout(["w1"], updated_at=at(0).isoformat())
    blocked = rollout(
        ["w2"], id="ro-2", blocked={"reason": "budget", "detail": "x", "since": at(0).isoformat()}
    )
    snap = shot(workers={"w1": worker("w1", "RUNNING"), "w2": worker("w2", "RUNNING")})
    snap.rollouts = {RID: stuck, "ro-2": blocked}
    result = found()
    sc._rollouts_at_end(snap, at(600), result)
    assert len(result["rollout RUNNING or ROLLING_BACK with nothing to move it"]) == 1


def test_given_a_rollout_that_created_a_worker_under_another_id_then_it_is_a_second_replacement() -> None:
    ours = replacement_id(RID, "w1")
    created = {"action": "WorkerCreated", "actor": f"rollout:{RID}", "at": at(1).isoformat()}
    trail = {("worker", ours): [created], ("worker", "w-extra"): [created]}
    snap = shot(trail, workers={ours: worker(ours, "RUNNING"), "w-extra": worker("w-extra", "RUNNING")})
    snap.rollouts = {RID: rollout(["w1"], status="SUCCEEDED")}
    result = found()
    sc._rollouts_at_end(snap, at(10), result)
    assert len(result["worker with two replacements from one rollout"]) == 1
    assert "w-extra" in result["worker with two replacements from one rollout"][0]


def test_given_a_rolled_back_rollout_with_replacement_and_restoration_serving_then_it_is_a_violation() -> (
    None
):
    new, back = replacement_id(RID, "w1"), restoration_id(RID, "w1")
    snap = shot(workers={new: worker(new, "RUNNING"), back: worker(back, "RUNNING")})
    snap.rollouts = {RID: rollout(["w1"], status="ROLLED_BACK")}
    result = found()
    sc._rollouts_at_end(snap, at(10), result)
    assert len(result["worker with two replacements from one rollout"]) == 1


def test_given_a_rollout_whose_scope_is_in_member_pages_then_the_checks_read_it_from_them() -> None:
    # As the current release stores it: no ids on the item, the scope in pages beside it, in page order.
    stored = rollout([], status="SUCCEEDED")
    del stored["worker_ids"]
    sc._with_scope(stored, {"MEMBERS#00001": ["w3"], "MEMBERS#00000": ["w1", "w2"]})
    assert stored["worker_ids"] == ["w1", "w2", "w3"]

    ours = [replacement_id(RID, w) for w in ("w1", "w2", "w3")]
    created = {"action": "WorkerCreated", "actor": f"rollout:{RID}", "at": at(1).isoformat()}
    snap = shot({("worker", r): [created] for r in ours}, workers={r: worker(r, "RUNNING") for r in ours})
    snap.rollouts = {RID: stored}
    result = found()
    sc._rollouts_at_end(snap, at(10), result)
    # Each replacement is derived from a worker of the paged scope: none is a second one.
    assert result["worker with two replacements from one rollout"] == []


def pool_write(
    seconds: float, budgets: list[dict[str, Any]] | None, action: str = "PoolUpdated"
) -> dict[str, Any]:
    details = {} if budgets is None else {"disruption": json.dumps({"budgets": budgets})}
    return {**event(seconds, "active", "active", action), "SK": f"{seconds:08.1f}", "details": details}


def taken(seconds: float, version: int, reason: str = "expired") -> dict[str, Any]:
    details = {"in_use": 1, "owner": reason, "owner_since": at(seconds).isoformat(), "pool_version": version}
    return {
        **event(seconds, "RUNNING", "DRAINING", "WorkerDrainStarted"),
        "SK": f"{seconds:08.1f}",
        "details": details,
    }


def test_given_budgets_changed_after_two_admissions_then_each_is_judged_on_the_version_it_read() -> None:
    # Version 2 allows two at once and both admissions read it; version 3, written later, is a freeze
    # that only the third admission read.
    audit = {
        ("pool", "p"): [
            pool_write(0, None, "PoolCreated"),
            pool_write(10, [{"max": 2}]),
            pool_write(100, [{"max": 0}, {"max": 5, "reasons": ["rollout"]}]),
        ],
        ("worker", "w1"): [taken(30, version=2)],
        ("worker", "w2"): [taken(50, version=2)],
        ("worker", "w3"): [taken(130, version=3)],
    }
    workers = {wid: {"id": wid, "pool": "p", "status": "DRAINING"} for wid in ("w1", "w2", "w3")}
    pools = {"p": {"name": "p", "version": 3}}

    judged, problems = sc.judge_budgets(sc.Trail(shot(audit, workers=workers, pools=pools)), default="10%")

    assert problems == []
    verdicts = {j.place.worker_id: (j.in_use, j.allowed, j.beyond) for j in judged}
    assert verdicts == {"w1": (1, 2, False), "w2": (2, 2, False), "w3": (3, 0, True)}


def test_given_an_admission_decided_on_a_version_the_trail_lacks_then_it_is_not_judged_but_reported() -> None:
    audit = {("pool", "p"): [pool_write(0, None, "PoolCreated")], ("worker", "w1"): [taken(30, version=2)]}
    workers = {"w1": {"id": "w1", "pool": "p", "status": "DRAINING"}}

    judged, problems = sc.judge_budgets(
        sc.Trail(shot(audit, workers=workers, pools={"p": {"name": "p", "version": 1}})), default="10%"
    )

    assert judged == []
    assert problems == ["w1: decided on version 2 of p"]
