"""Moving a running drain's deadline and forcing it now, on the local stack running the real ASL.

The API refuses timeouts under a minute (a typo, not a policy), so moves that must take effect within a
test's seconds go through the service the route calls, as the drain tests start short drains.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from datetime import datetime, timedelta
from typing import Any

import boto3
import pytest

from fleetkeeper.domain.drain_policy import MAX_DEADLINE_MOVES, MAX_RECHECKS_PER_DRAIN
from fleetkeeper.domain.errors import DrainDeadlineMoved
from fleetkeeper.domain.lifecycle import InstanceState, WorkerStatus
from fleetkeeper.domain.models import DrainOutcome, utcnow
from fleetkeeper.services import drains
from fleetkeeper.services.drains import commands as drain_commands
from fleetkeeper.services.drains.contract import DrainInput
from fleetkeeper_local import faults
from tests.integration.conftest import ControlPlane, WorkerFactory, eventually
from tests.integration.faults.support import alert_feed, complete, drain, place
from tests.integration.functions import run_watchdog
from tests.integration.operations.test_before_stop_cancel import just_before

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ALICE = "arn:aws:iam::123456789012:user/alice"
# History events of one heartbeat re-check cycle, and of one move (the re-armed wait ending, Finish
# finding the worker busy, Recheck, the next wait), as docs/drains.md counts them.
EVENTS_PER_RECHECK_CYCLE = 13
EVENTS_PER_MOVE = 18


def token_stored(plane: ControlPlane, worker_id: str) -> Any:
    record = plane.ctx.store.get_worker(worker_id).drain
    return record is not None and record.task_token


def waiting(plane: ControlPlane, worker_id: str) -> None:
    """Until the drain's execution waits on its callback token."""
    eventually(lambda: token_stored(plane, worker_id), 20)


def move(plane: ControlPlane, worker_id: str, seconds: int, **body: Any) -> tuple[int, Any]:
    return plane.api(
        "PATCH", f"/api/v1/workers/{worker_id}/drain", {"timeout_seconds": seconds, **body}, caller=ALICE
    )


def move_now(plane: ControlPlane, worker_id: str, seconds: int) -> drains.DrainStatus:
    return drains.move_worker_drain_deadline(plane.ctx, worker_id, timeout_seconds=seconds, actor=ALICE)


def at(text: str) -> datetime:
    return datetime.fromisoformat(text)


def sleep_past(deadline: datetime) -> None:
    """Until a couple of seconds after `deadline`: a wait armed for it would have ended by then."""
    time.sleep(max((deadline - utcnow()).total_seconds() + 2, 0))


def audit(plane: ControlPlane, worker_id: str, action: str) -> list[Any]:
    return [e for e in plane.ctx.store.audit_trail("worker", worker_id) if e.action == action]


def stuck_drain(
    plane: ControlPlane, worker: WorkerFactory, seconds: int, *, instances: int = 1
) -> tuple[str, str, dict[str, Any]]:
    """A worker with instances that never end by themselves, draining with a deadline `seconds` away;
    the first instance's id."""
    worker_id = worker().id
    placed = [place(plane, worker_id=worker_id)["id"] for _ in range(instances)]
    started = drain(plane, worker_id, timeout_seconds=seconds, reschedule=False)
    waiting(plane, worker_id)
    return worker_id, placed[0], started


def unserved_drain(plane: ControlPlane, worker: WorkerFactory, seconds: int) -> tuple[str, str]:
    """A drain whose request died between recording it and StartExecution: no execution serves it yet."""
    worker_id = worker().id
    instance_id = place(plane, worker_id=worker_id)["id"]
    never = faults.FaultPlan(seed=4, faults=[faults.sfn_execution_never_starts()])
    with never.installed(), pytest.raises(faults.InvocationCrashed):
        drain(plane, worker_id, timeout_seconds=seconds, reschedule=False)
    return worker_id, instance_id


# ---- moving the deadline --------------------------------------------------------------------------


def test_given_a_drain_when_its_deadline_moves_later_then_the_old_deadline_no_longer_forces(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    # Long enough for the move to land first on a loaded machine, short enough to wait past.
    worker_id, instance_id, started = stuck_drain(control_plane, ec2_worker, 12)

    status, body = move(control_plane, worker_id, 600, reason="the exam runs late")

    assert status == 200, body
    assert at(body["deadline"]) == at(started["started_at"]) + timedelta(seconds=600)
    assert (body["timeout_seconds"], body["deadline_moves"], body["status"]) == (600, 1, "RUNNING")
    # Past the old deadline, the execution still waits and the instance still runs.
    sleep_past(at(started["deadline"]))
    assert control_plane.execution(started["execution_arn"])["status"] == "RUNNING"
    store = control_plane.ctx.store
    assert store.get_instance(instance_id).state is not InstanceState.TERMINATED
    waiting(control_plane, worker_id)  # the same execution waits again, for the new deadline
    entered = control_plane.states_entered(started["execution_arn"])
    assert "Force" not in entered
    assert entered.count("AwaitEmpty") >= 2
    (moved,) = audit(control_plane, worker_id, "WorkerDrainDeadlineMoved")
    assert (moved.actor, moved.reason) == (ALICE, "the exam runs late")
    assert at(str(moved.details["from"])) == at(started["deadline"])
    assert at(str(moved.details["to"])) == at(body["deadline"])

    complete(control_plane, instance_id)
    assert control_plane.wait_for_execution(started["execution_arn"])["status"] == "SUCCEEDED"
    assert store.get_worker(worker_id).drain.outcome is DrainOutcome.SUCCESS  # type: ignore[union-attr]


def test_given_a_drain_when_its_deadline_moves_earlier_then_it_is_forced_at_the_new_deadline(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, instance_id, started = stuck_drain(control_plane, ec2_worker, 600)

    # A few seconds from now, however long the drain took to start waiting.
    timeout = math.ceil((utcnow() - at(started["started_at"])).total_seconds()) + 4

    moved = move_now(control_plane, worker_id, timeout)

    assert moved.deadline == at(started["started_at"]) + timedelta(seconds=timeout)
    assert control_plane.wait_for_execution(started["execution_arn"], timeout=30)["status"] == "SUCCEEDED"
    instance = control_plane.ctx.store.get_instance(instance_id)
    assert (instance.state, instance.reason) == (InstanceState.TERMINATED, "drain_timeout")
    _, body = control_plane.api("GET", f"/api/v1/workers/{worker_id}/drain")
    assert (body["status"], body["forced_instances"], body["worker_status"]) == ("TIMED_OUT", 1, "STOPPING")
    assert "Force" in control_plane.states_entered(started["execution_arn"])


def test_given_a_timeout_that_ended_in_the_past_then_the_deadline_is_now_and_the_drain_is_forced(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, instance_id, started = stuck_drain(control_plane, ec2_worker, 600)
    time.sleep(2)
    before = utcnow()

    moved = move_now(control_plane, worker_id, 1)

    # Never a deadline in the past: it is the moment of the move, and the timeout says how long that was.
    assert moved.deadline is not None
    assert before <= moved.deadline <= utcnow()
    assert moved.timeout_seconds == int((moved.deadline - at(started["started_at"])).total_seconds()) + 1
    assert control_plane.wait_for_execution(started["execution_arn"], timeout=30)["status"] == "SUCCEEDED"
    assert control_plane.ctx.store.get_instance(instance_id).state is InstanceState.TERMINATED
    assert control_plane.ctx.store.get_worker(worker_id).drain.outcome is DrainOutcome.TIMED_OUT  # type: ignore[union-attr]


def test_given_the_same_move_again_then_it_answers_the_same_drain_and_audits_once(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, _, _ = stuck_drain(control_plane, ec2_worker, 600)
    key = {"Idempotency-Key": "move-1"}
    path = f"/api/v1/workers/{worker_id}/drain"

    first = control_plane.api("PATCH", path, {"timeout_seconds": 900}, headers=key)
    replayed = control_plane.api("PATCH", path, {"timeout_seconds": 900}, headers=key)
    repeated = move(control_plane, worker_id, 900)

    assert first[0] == replayed[0] == repeated[0] == 200
    assert first[1]["deadline"] == replayed[1]["deadline"] == repeated[1]["deadline"]
    assert repeated[1]["deadline_moves"] == 1
    assert len(audit(control_plane, worker_id, "WorkerDrainDeadlineMoved")) == 1
    reused = control_plane.api("PATCH", path, {"timeout_seconds": 1200}, headers=key)
    assert (reused[0], reused[1]["error"]) == (422, "IDEMPOTENCY_KEY_REUSED")


def test_given_a_move_then_a_cancel_then_the_worker_runs_again(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, _, started = stuck_drain(control_plane, ec2_worker, 600)

    assert move(control_plane, worker_id, 1200)[0] == 200
    status, body = control_plane.api("POST", f"/api/v1/workers/{worker_id}/cancel-drain")

    assert (status, body["status"]) == (200, "RUNNING")
    assert control_plane.wait_for_execution(started["execution_arn"])["status"] == "SUCCEEDED"
    assert control_plane.states_entered(started["execution_arn"])[-1] == "Cancelled"
    final = control_plane.ctx.store.get_worker(worker_id)
    assert final.status is WorkerStatus.RUNNING
    assert final.drain is not None
    assert final.drain.outcome is DrainOutcome.CANCELLED
    status, body = move(control_plane, worker_id, 1800)
    assert (status, body["error"]) == (409, "CONFLICT")
    assert body["details"]["current_status"] == "RUNNING"


def test_given_a_moved_deadline_when_the_watchdog_restarts_a_vanished_execution_then_it_keeps_the_move(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, instance_id = unserved_drain(control_plane, ec2_worker, 12)
    first_deadline = control_plane.ctx.store.get_worker(worker_id).drain.deadline  # type: ignore[union-attr]
    status, moved = move(control_plane, worker_id, 600)
    assert (status, moved["deadline_moves"]) == (200, 1), moved

    verdicts = run_watchdog(control_plane.ctx, now=utcnow() + timedelta(minutes=10))

    assert verdicts["restarted"] == 1, verdicts
    record = control_plane.ctx.store.get_worker(worker_id).drain
    assert record is not None
    assert (record.restarts, record.deadline, record.deadline_moves) == (1, at(moved["deadline"]), 1)
    assert record.execution_arn is not None
    restarted = json.loads(
        boto3.client("stepfunctions").describe_execution(executionArn=record.execution_arn)["input"]
    )
    assert at(restarted["deadline"]) == at(moved["deadline"])
    # Past the first deadline, the restarted execution waits for the moved one: it does not force.
    sleep_past(first_deadline)
    waiting(control_plane, worker_id)
    assert control_plane.execution(record.execution_arn)["status"] == "RUNNING"
    assert "Force" not in control_plane.states_entered(record.execution_arn)
    complete(control_plane, instance_id)
    assert control_plane.wait_for_execution(record.execution_arn)["status"] == "SUCCEEDED"
    assert control_plane.ctx.store.get_worker(worker_id).drain.outcome is DrainOutcome.SUCCESS  # type: ignore[union-attr]


def test_given_a_move_when_the_last_instance_completes_before_the_rearm_is_sent_then_the_drain_finishes(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, instance_id, started = stuck_drain(control_plane, ec2_worker, 600)

    # The move has cleared the stored token: the completion finds none to send, the re-arm ends the wait.
    # (The move goes through the service: an API call cannot run inside another one in this process.)
    with just_before(
        "stepfunctions",
        "SendTaskSuccess",
        lambda: complete(control_plane, instance_id),
        when="rearm",
        region=None,
    ) as completions:
        moved = move_now(control_plane, worker_id, 900)

    assert moved.deadline_moves == 1
    assert [c["state"] for c in completions] == ["COMPLETED"]
    assert control_plane.wait_for_execution(started["execution_arn"])["status"] == "SUCCEEDED"
    final = control_plane.ctx.store.get_worker(worker_id)
    assert final.status is WorkerStatus.STOPPING
    assert final.drain is not None
    assert (final.drain.outcome, final.drain.forced_instances) == (DrainOutcome.SUCCESS, 0)


def test_given_the_last_instance_completing_when_a_move_lands_before_its_signal_then_the_drain_finishes(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, instance_id, started = stuck_drain(control_plane, ec2_worker, 600)

    # The move answers the token first (a re-arm); the completion's own signal then finds it answered.
    with just_before(
        "stepfunctions",
        "SendTaskSuccess",
        lambda: move_now(control_plane, worker_id, 900),
        when="empty",
        region=None,
    ) as moves:
        complete(control_plane, instance_id)

    assert [m.deadline_moves for m in moves] == [1]
    assert control_plane.wait_for_execution(started["execution_arn"])["status"] == "SUCCEEDED"
    final = control_plane.ctx.store.get_worker(worker_id)
    assert final.status is WorkerStatus.STOPPING
    assert final.drain is not None
    assert final.drain.outcome is DrainOutcome.SUCCESS


def test_given_bad_moves_then_each_answer_names_the_field_or_the_state(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, running_worker: WorkerFactory
) -> None:
    worker_id, _, _ = stuck_drain(control_plane, ec2_worker, 600)
    path = f"/api/v1/workers/{worker_id}/drain"

    for body in (
        {},
        {"timeout_seconds": 59},
        {"timeout_seconds": "600"},
        {"timeout_seconds": 600, "then": "x"},
    ):
        status, answer = control_plane.api("PATCH", path, body)
        assert (status, answer["error"]) == (422, "VALIDATION_FAILED"), (body, answer)
        fields = [d["field"] for d in answer["details"]]
        assert fields == ["body.then" if "then" in body else "body.timeout_seconds"], answer
    status, answer = control_plane.api("PATCH", path, {"timeout_seconds": 900, "generation": 7})
    assert (status, answer["error"]) == (409, "CONFLICT")
    assert "drain 7" in answer["message"]

    status, answer = move(control_plane, "w-nope", 600)
    assert (status, answer["error"]) == (404, "NOT_FOUND")
    idle = running_worker()
    status, answer = move(control_plane, idle.id, 600)
    assert (status, answer["error"], answer["details"]["current_status"]) == (409, "CONFLICT", "RUNNING")
    assert "only a DRAINING worker" in answer["message"]


def test_given_moves_then_each_costs_a_fixed_number_of_history_events_within_the_drain_bound(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    """The history bound of docs/drains.md with moves: every re-check and every allowed move together
    stay under half of a Standard execution's 25,000 events."""
    worker_id, _, started = stuck_drain(control_plane, ec2_worker, 600)
    for seconds in (700, 800, 900):
        token = token_stored(control_plane, worker_id)
        move_now(control_plane, worker_id, seconds)
        eventually(lambda: token_stored(control_plane, worker_id) not in (token, None), 20)  # noqa: B023

    events = boto3.client("stepfunctions").get_execution_history(
        executionArn=started["execution_arn"], maxResults=1000
    )["events"]
    finishes = [
        i for i, e in enumerate(events) if e.get("stateEnteredEventDetails", {}).get("name") == "Finish"
    ]
    assert len(finishes) == 3
    per_move = {b - a for a, b in itertools.pairwise(finishes)}
    assert len(per_move) == 1
    (cycle,) = per_move
    assert cycle <= EVENTS_PER_MOVE, [e["type"] for e in events[finishes[0] : finishes[1]]]
    worst = len(events) + EVENTS_PER_RECHECK_CYCLE * MAX_RECHECKS_PER_DRAIN + cycle * (MAX_DEADLINE_MOVES + 1)
    assert worst < 25_000 // 2


def test_given_a_deadline_that_passed_then_a_later_move_is_409_and_a_repeated_forcing_move_is_harmless(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, _ = unserved_drain(control_plane, ec2_worker, 600)
    time.sleep(2)
    forced = move_now(control_plane, worker_id, 1)

    again = move_now(control_plane, worker_id, 1)
    status, body = move(control_plane, worker_id, 7200)

    assert (again.deadline, again.deadline_moves) == (forced.deadline, 1)
    assert (status, body["error"]) == (409, "DEADLINE_PASSED"), body
    assert body["details"]["deadline"] == forced.deadline.isoformat()  # type: ignore[union-attr]
    assert len(audit(control_plane, worker_id, "WorkerDrainDeadlineMoved")) == 1


# ---- forcing now ------------------------------------------------------------------------------------


def force(plane: ControlPlane, worker_id: str, body: Any = None) -> tuple[int, Any]:
    return plane.api("POST", f"/api/v1/workers/{worker_id}/drain/force", body, caller=ALICE)


def test_given_a_waiting_drain_when_forced_then_what_runs_ends_forced_and_the_drain_times_out(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    alerts = alert_feed(control_plane)
    worker_id, _, started = stuck_drain(control_plane, ec2_worker, 3600, instances=2)
    placed = control_plane.ctx.store.active_instances_of(worker_id)
    assert len(placed) == 2
    before = utcnow()

    status, body = force(control_plane, worker_id, {"reason": "security patch"})

    assert status == 202, body
    assert (body["status"], body["forced_by"], body["force_reason"]) == ("RUNNING", ALICE, "security patch")
    assert before <= at(body["forced_at"]) == at(body["deadline"]) <= utcnow()
    assert control_plane.wait_for_execution(started["execution_arn"], timeout=30)["status"] == "SUCCEEDED"
    store = control_plane.ctx.store
    for instance_id in (i.id for i in placed):
        instance = store.get_instance(instance_id)
        assert (instance.state, instance.reason) == (InstanceState.TERMINATED, "forced")
    _, final = control_plane.api("GET", f"/api/v1/workers/{worker_id}/drain")
    assert (final["status"], final["forced_instances"], final["worker_status"]) == (
        "TIMED_OUT",
        2,
        "STOPPING",
    )
    (forced,) = audit(control_plane, worker_id, "WorkerDrainForced")
    assert (forced.actor, forced.reason) == (ALICE, "security patch")
    assert at(str(forced.details["from"])) == at(started["deadline"])
    assert at(str(forced.details["to"])) == at(body["deadline"])
    (timed_out,) = audit(control_plane, worker_id, "WorkerDrainTimedOut")
    assert timed_out.reason == f"drain forced by {ALICE}"
    [alert] = alerts()
    assert f"forced by {ALICE}" in alert["Subject"]
    assert "security patch" in alert["Message"]


def test_given_a_forced_drain_then_forcing_again_changes_nothing_and_its_deadline_no_longer_moves(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    worker_id, _ = unserved_drain(control_plane, ec2_worker, 600)
    key = {"Idempotency-Key": "force-1"}
    path = f"/api/v1/workers/{worker_id}/drain/force"

    first = control_plane.api("POST", path, None, headers=key)
    replayed = control_plane.api("POST", path, None, headers=key)
    repeated = force(control_plane, worker_id, {"reason": "again"})

    assert first[0] == replayed[0] == repeated[0] == 202
    assert first[1]["forced_at"] == replayed[1]["forced_at"] == repeated[1]["forced_at"]
    assert (repeated[1]["force_reason"], repeated[1]["forced_by"]) == (None, first[1]["forced_by"])
    assert len(audit(control_plane, worker_id, "WorkerDrainForced")) == 1
    status, body = move(control_plane, worker_id, 7200)
    assert (status, body["error"]) == (409, "DEADLINE_PASSED"), body


def test_given_no_drain_to_force_then_404_or_409_naming_the_state(
    control_plane: ControlPlane, running_worker: WorkerFactory
) -> None:
    status, body = force(control_plane, "w-nope")
    assert (status, body["error"]) == (404, "NOT_FOUND")
    idle = running_worker()
    status, body = force(control_plane, idle.id, {"reason": "x"})
    assert (status, body["error"], body["details"]["current_status"]) == (409, "CONFLICT", "RUNNING")
    status, body = force(control_plane, idle.id, {"reason": ""})
    assert (status, [d["field"] for d in body["details"]]) == (422, ["body.reason"])
    assert control_plane.ctx.store.get_worker(idle.id).drain is None


def test_given_a_deadline_moved_as_often_as_a_drain_allows_then_the_next_move_is_409_and_a_force_still_works(
    control_plane: ControlPlane, ec2_worker: WorkerFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The refusal after the last allowed move is the point, not the bound's size: three moves show it
    # as the hundred allowed would, each an API call.
    allowed = 3
    monkeypatch.setattr(drain_commands, "MAX_DEADLINE_MOVES", allowed)
    # No execution waits (its start was lost), so each move is one write: the bound is the record's.
    worker_id, _ = unserved_drain(control_plane, ec2_worker, 600)
    for n in range(allowed):
        move_now(control_plane, worker_id, 700 + n)

    status, body = move(control_plane, worker_id, 7200)

    assert (status, body["error"], body["details"]["max_moves"]) == (
        409,
        "TOO_MANY_DEADLINE_MOVES",
        allowed,
    ), body
    record = control_plane.ctx.store.get_worker(worker_id).drain
    assert record is not None
    assert (record.deadline_moves, record.timeout_seconds) == (allowed, 700 + allowed - 1)
    status, body = force(control_plane, worker_id)
    assert (status, body["forced_by"]) == (202, ALICE)


def test_given_a_force_step_that_finds_the_deadline_ahead_then_it_ends_nothing_and_waits_again(
    control_plane: ControlPlane, ec2_worker: WorkerFactory
) -> None:
    """The deadline moved later between the re-check that chose Force and Force itself (or a replayed
    step): nothing is ended before the record's deadline."""
    worker_id, instance_id = unserved_drain(control_plane, ec2_worker, 600)
    record = control_plane.ctx.store.get_worker(worker_id).drain
    assert record is not None

    with pytest.raises(DrainDeadlineMoved):
        drains.force(control_plane.ctx, DrainInput.of_worker(control_plane.ctx, worker_id, record))

    assert control_plane.ctx.store.get_instance(instance_id).state is not InstanceState.TERMINATED
    after = control_plane.ctx.store.get_worker(worker_id).drain
    assert after is not None
    assert (after.timed_out_at, after.forced_instances, after.outcome) == (None, 0, DrainOutcome.RUNNING)
