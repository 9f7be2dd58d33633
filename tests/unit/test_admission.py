"""The door for disruption (domain/admission.py): the one rule every disruption passes, and what a
status change does to a worker's owner."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetkeeper.domain.admission import (
    ADMISSION_LEASE,
    Admitted,
    Ask,
    Claim,
    Held,
    Imposed,
    PoolState,
    WaitReason,
    judge,
    settled,
    unsettled,
)
from fleetkeeper.domain.disruption import Budget, DisruptionPolicy, DisruptionReason
from fleetkeeper.domain.lifecycle import Cause, PoolStatus, WorkerStatus
from fleetkeeper.domain.models import Owner, Pool, Worker
from fleetkeeper.domain.scale_down import DisruptionBudget

NOW = datetime(2026, 2, 1, 12, 0, tzinfo=UTC)
ROLLOUT = Ask(DisruptionReason.ROLLOUT, "rollout:ro-1", rollout_id="ro-1")
SCALE_DOWN = Ask(DisruptionReason.SCALE_DOWN, "scale-down")


def worker(worker_id: str = "w-1", **changes: object) -> Worker:
    base = Worker(
        id=worker_id, template="lab", pool="labs", region="us-east-1", capacity=4, status=WorkerStatus.RUNNING
    )
    return base.model_copy(update=changes)


def pool(*budgets: Budget, status: PoolStatus = PoolStatus.ACTIVE) -> Pool:
    return Pool(name="labs", status=status, disruption=DisruptionPolicy(budgets=list(budgets)), version=3)


def state(
    the_pool: Pool | None = None,
    *,
    in_use: int = 0,
    members: int = 10,
    fleet_in_use: int = 0,
    default: int = 5,
) -> PoolState:
    return PoolState(
        at=NOW,
        pool=the_pool if the_pool is not None else pool(),
        in_use=in_use,
        owned_by_template={"lab": in_use},
        members=members,
        members_by_template={"lab": members},
        fleet_in_use=fleet_in_use,
        fleet_size=100,
        default=DisruptionBudget(count=default),
    )


def never_active(_: str) -> bool:
    return False


def always_active(_: str) -> bool:
    return True


def held(verdict: Admitted | Held) -> WaitReason:
    assert isinstance(verdict, Held), verdict
    return verdict.why


def test_given_room_in_the_pools_budget_then_admitted_with_its_bound_and_the_pools_version_as_the_claim():
    verdict = judge(SCALE_DOWN, worker(), state(pool(Budget(max=2)), in_use=1), NOW, active=never_active)

    assert isinstance(verdict, Admitted)
    assert (verdict.owner.reason, verdict.owner.actor, verdict.owner.counted) == (
        "scale_down",
        "scale-down",
        True,
    )
    assert verdict.claim is not None
    assert (verdict.claim.pool, verdict.claim.pool_version, verdict.claim.pool_below) == ("labs", 3, 2)
    assert verdict.claim.fleet_below is None


def test_given_the_budget_full_then_held_naming_the_budget_what_it_allows_and_what_is_in_use():
    verdict = judge(SCALE_DOWN, worker(), state(pool(Budget(max=2)), in_use=2), NOW, active=never_active)

    assert isinstance(verdict, Held)
    assert (verdict.why, verdict.budget, verdict.allowed, verdict.in_use) == (WaitReason.BUDGET, 0, 2, 2)
    assert verdict.detail == "pool labs budget 0 allows 2, 2 in use"
    assert "None" not in verdict.detail


def test_given_a_freeze_window_then_held_as_window_until_it_ends():
    freeze = Budget(max=0, schedule="0 11 * * *", duration="2h")

    verdict = judge(ROLLOUT, worker(), state(pool(freeze)), NOW, active=never_active)

    assert isinstance(verdict, Held)
    assert verdict.why == WaitReason.WINDOW
    assert verdict.until == datetime(2026, 2, 1, 13, 0, tzinfo=UTC)


def test_given_no_pool_budget_applies_then_the_stage_default_bounds_it_fleet_wide():
    other_reason = Budget(max=0, reasons=[DisruptionReason.EXPIRED])

    full = judge(SCALE_DOWN, worker(), state(pool(other_reason), fleet_in_use=5), NOW, active=never_active)
    room = judge(SCALE_DOWN, worker(), state(pool(other_reason), fleet_in_use=4), NOW, active=never_active)

    assert held(full) == WaitReason.BUDGET
    assert isinstance(full, Held)
    assert full.detail == "the stage default MAX_CONCURRENT_DRAINS allows 5, 5 in use fleet-wide"
    assert isinstance(room, Admitted)
    assert room.claim is not None
    assert (room.claim.pool_below, room.claim.fleet_below) == (None, 5)


def test_given_a_pool_that_is_not_active_then_every_voluntary_reason_is_held():
    draining = pool(status=PoolStatus.DRAINING)
    for reason in DisruptionReason:
        ask = Ask(reason, "someone")
        assert (
            held(judge(ask, worker(), state(draining), NOW, active=never_active))
            == WaitReason.POOL_NOT_ACTIVE
        )


def test_given_a_protected_worker_then_held_until_its_protection_lapses():
    pinned = worker(do_not_disrupt_until=NOW + timedelta(minutes=5))

    assert held(judge(SCALE_DOWN, worker(do_not_disrupt=True), state(), NOW, active=never_active)) == (
        WaitReason.PROTECTED
    )
    assert held(judge(SCALE_DOWN, pinned, state(), NOW, active=never_active)) == WaitReason.PROTECTED
    later = NOW + timedelta(minutes=5)
    assert isinstance(judge(SCALE_DOWN, pinned, state(), later, active=never_active), Admitted)


def test_given_a_worker_that_is_not_running_then_a_voluntary_disruption_is_held():
    assert held(judge(ROLLOUT, worker(status=WorkerStatus.STARTING), state(), NOW, active=never_active)) == (
        WaitReason.NOT_RUNNING
    )


def test_given_a_stopped_worker_then_only_scale_in_may_take_it_and_without_a_budgets_room():
    warm = worker(status=WorkerStatus.STOPPED)
    trim = Ask(DisruptionReason.UNDERUTILIZED, "scale-in", floor=5)
    frozen = state(pool(Budget(max=0)), in_use=3, default=0)

    verdict = judge(trim, warm, frozen, NOW, active=never_active)

    # It holds no session: the freeze and the floor do not hold it back; the pool as read still must.
    assert isinstance(verdict, Admitted)
    assert verdict.claim == Claim("labs", pool_version=3)
    assert verdict.owner.counted
    assert held(judge(SCALE_DOWN, warm, frozen, NOW, active=never_active)) == WaitReason.NOT_RUNNING
    waking = warm.model_copy(update={"desired_status": WorkerStatus.RUNNING})
    assert held(judge(trim, waking, frozen, NOW, active=never_active)) == WaitReason.NOT_RUNNING
    draining = state(pool(status=PoolStatus.DRAINING))
    assert held(judge(trim, warm, draining, NOW, active=never_active)) == WaitReason.POOL_NOT_ACTIVE
    pinned = warm.model_copy(update={"do_not_disrupt": True})
    assert held(judge(trim, pinned, frozen, NOW, active=never_active)) == WaitReason.PROTECTED
    held_by_rollout = warm.model_copy(
        update={"owner": Owner(reason="rollout", actor="r", since=NOW, counted=False, rollout_id="ro-2")}
    )
    assert held(judge(trim, held_by_rollout, frozen, NOW, active=always_active)) == WaitReason.OWNED


def test_given_another_rollouts_hold_then_held_as_owned_while_that_rollout_is_active():
    replacement = worker(
        owner=Owner(reason="rollout", actor="rollout:ro-9", since=NOW, counted=False, rollout_id="ro-9")
    )

    assert held(judge(SCALE_DOWN, replacement, state(), NOW, active=always_active)) == WaitReason.OWNED
    assert isinstance(judge(SCALE_DOWN, replacement, state(), NOW, active=never_active), Admitted)


def test_given_its_own_hold_then_a_rollout_is_admitted_and_counted_within_the_budget():
    own = worker(
        owner=Owner(reason="rollout", actor="rollout:ro-1", since=NOW, counted=False, rollout_id="ro-1")
    )

    room = judge(ROLLOUT, own, state(pool(Budget(max=1))), NOW, active=always_active)
    full = judge(ROLLOUT, own, state(pool(Budget(max=1)), in_use=1), NOW, active=always_active)

    assert isinstance(room, Admitted)
    assert room.owner.counted
    assert room.claim is not None
    assert held(full) == WaitReason.BUDGET


def test_given_its_own_counted_admission_then_the_drain_that_follows_is_admitted_without_a_second_count():
    own = worker(owner=Owner(reason="rollout", actor="rollout:ro-1", since=NOW, rollout_id="ro-1"))

    verdict = judge(ROLLOUT, own, state(pool(Budget(max=1)), in_use=1), NOW, active=always_active)

    assert isinstance(verdict, Admitted)
    # No budget bound (its place is taken already), only the pool as read: still ACTIVE, same version.
    assert verdict.claim == Claim("labs", pool_version=3)
    assert verdict.owner == own.owner


def test_given_its_own_counted_admission_of_a_worker_ec2_stopped_since_then_the_drain_waits():
    # EC2's stop keeps the owner it found (settled): the admission ahead must not start a drain on it.
    own = worker(
        status=WorkerStatus.STOPPING,
        owner=Owner(reason="rollout", actor="rollout:ro-1", since=NOW, rollout_id="ro-1"),
    )

    assert held(judge(ROLLOUT, own, state(pool(Budget(max=1)), in_use=1), NOW, active=always_active)) == (
        WaitReason.NOT_RUNNING
    )
    assert isinstance(judge(Ask(Imposed.OPERATOR, "op"), own, state(), NOW, active=always_active), Admitted)


def test_given_an_admission_ahead_then_it_has_a_lease_and_lapses_with_it():
    expiry = Ask(DisruptionReason.EXPIRED, "expiry", ahead=True)

    verdict = judge(expiry, worker(), state(), NOW, active=never_active)

    assert isinstance(verdict, Admitted)
    assert verdict.owner.until == NOW + ADMISSION_LEASE
    lapsed = worker(owner=verdict.owner)
    assert unsettled(lapsed, NOW + ADMISSION_LEASE, never_active) == (True, None)
    assert unsettled(lapsed, NOW + ADMISSION_LEASE - timedelta(seconds=1), never_active) == (
        False,
        verdict.owner,
    )


def test_given_a_lapsed_counted_owner_then_a_new_admission_moves_its_place_without_counting_twice():
    lapsed = worker(
        owner=Owner(reason="expired", actor="expiry", since=NOW, until=NOW - timedelta(seconds=1))
    )

    verdict = judge(SCALE_DOWN, lapsed, state(pool(Budget(max=1)), in_use=1), NOW, active=never_active)

    assert isinstance(verdict, Admitted)


def test_given_a_floor_then_the_scopes_last_serving_workers_are_held():
    floor = Ask(DisruptionReason.SCALE_DOWN, "scale-down", floor=8)

    at_floor = judge(floor, worker(), state(in_use=2, members=10), NOW, active=never_active)
    above = judge(floor, worker(), state(in_use=1, members=10), NOW, active=never_active)

    assert held(at_floor) == WaitReason.MIN_WORKERS
    assert isinstance(above, Admitted)
    assert above.claim is not None
    assert (above.claim.template, above.claim.template_owned) == ("lab", 1)


def test_given_an_imposed_disruption_then_it_takes_any_voluntary_owner_over_and_skips_the_budgets():
    owned = worker(
        do_not_disrupt=True, owner=Owner(reason="rollout", actor="rollout:ro-9", since=NOW, rollout_id="ro-9")
    )
    closed = pool(Budget(max=0), status=PoolStatus.DRAINING)

    verdict = judge(Ask(Imposed.SPOT, "ec2-events"), owned, state(closed), NOW, active=always_active)

    assert isinstance(verdict, Admitted)
    assert (verdict.owner.reason, verdict.owner.counted) == ("spot", True)
    assert verdict.claim is not None
    assert (verdict.claim.pool_below, verdict.claim.fleet_below) == (None, None)


def test_given_a_hold_then_only_another_live_owner_refuses_it_and_it_counts_nowhere():
    hold = Ask(DisruptionReason.ROLLOUT, "rollout:ro-1", rollout_id="ro-1", hold=True)
    other = worker(
        owner=Owner(reason="rollout", actor="rollout:ro-9", since=NOW, counted=False, rollout_id="ro-9")
    )

    free = judge(hold, worker(do_not_disrupt=True), state(pool(Budget(max=0))), NOW, active=always_active)

    assert isinstance(free, Admitted)
    assert (free.owner.counted, free.claim) == (False, None)
    assert held(judge(hold, other, state(), NOW, active=always_active)) == WaitReason.OWNED


def test_given_status_changes_then_the_owner_follows_them():
    running = worker()
    ours = Owner(reason="scale_down", actor="scale-down", since=NOW)

    def after(before: Worker, target: WorkerStatus, wanted: Owner | None, cause: Cause = Cause.CONTROL):
        return settled(before, target, wanted, cause=cause, actor="x", now=NOW)

    # The admitting write names its owner.
    assert after(running, WorkerStatus.DRAINING, ours) == ours
    # EC2 stopping the machine behind our back is counted as imposed.
    imposed = after(running, WorkerStatus.STOPPING, None, Cause.EC2)
    assert imposed is not None
    assert (imposed.reason, imposed.counted) == ("ec2", True)
    # A cancelled drain serves again, owned by nobody; a stopped or gone worker is owned by nobody.
    draining = worker(status=WorkerStatus.DRAINING, owner=ours)
    assert after(draining, WorkerStatus.RUNNING, ours) is None
    assert after(draining, WorkerStatus.STOPPED, ours, Cause.EC2) is None
    assert after(draining, WorkerStatus.TERMINATED, ours, Cause.EC2) is None
    # A replacement keeps its rollout's hold while it launches.
    hold = Owner(reason="rollout", actor="rollout:ro-1", since=NOW, counted=False, rollout_id="ro-1")
    assert after(worker(status=WorkerStatus.PENDING), WorkerStatus.PROVISIONING, hold) == hold


def test_given_a_disrupting_worker_no_owner_counts_then_it_is_adopted():
    wrong, owner = unsettled(worker(status=WorkerStatus.DRAINING), NOW, never_active)

    assert wrong
    assert owner is not None
    assert owner.counted


# ---- the rule against an independent oracle, under interleavings ------------------------------------


@dataclass
class Store:
    """What DynamoDB holds, applying a claim as the transaction's conditions do: all or nothing."""

    owners: dict[str, str | None]
    in_use: int = 0
    pool_version: int = 1
    admitted_over: list[tuple[int, int]] = field(default_factory=list)

    def state(self, budget: Budget) -> PoolState:
        return PoolState(
            at=NOW,
            pool=Pool(name="labs", disruption=DisruptionPolicy(budgets=[budget]), version=self.pool_version),
            in_use=self.in_use,
            owned_by_template={"lab": self.in_use},
            members=len(self.owners),
            members_by_template={"lab": len(self.owners)},
            fleet_in_use=self.in_use,
            fleet_size=len(self.owners),
            default=DisruptionBudget(count=len(self.owners)),
        )

    def write(self, worker_id: str, version_read: dict[str, str | None], verdict: Admitted) -> bool:
        if self.owners[worker_id] != version_read[worker_id]:
            return False  # the worker changed since it was read
        claim = verdict.claim
        if claim is not None and claim.pool_below is not None and not self.in_use < claim.pool_below:
            return False
        if claim is not None and claim.pool_version is not None and claim.pool_version != self.pool_version:
            return False
        self.owners[worker_id] = verdict.owner.actor
        self.in_use += 1
        return True


@settings(max_examples=150, deadline=None)
@given(
    size=st.integers(1, 10),
    allowed=st.integers(0, 4),
    plan=st.lists(
        st.one_of(
            st.tuples(st.just("read"), st.integers(0, 2)),
            st.tuples(st.just("admit"), st.integers(0, 2), st.integers(0, 9)),
            st.tuples(st.just("finish"), st.integers(0, 9)),
        ),
        max_size=50,
    ),
)
def test_given_deciders_on_stale_reads_then_the_conditions_keep_the_pool_within_its_budget(
    size, allowed, plan
):
    """Three deciders read the pool at different moments and decide on what they read; the store applies
    each admission's claim. The oracle, independent of the rule: a count of owned workers never above
    what the budget allows, whatever the interleaving."""
    budget = Budget(max=allowed)
    store = Store({f"w-{n}": None for n in range(size)})
    reads = {d: (store.state(budget), dict(store.owners)) for d in range(3)}
    for step in plan:
        if step[0] == "read":
            reads[step[1]] = (store.state(budget), dict(store.owners))
        elif step[0] == "finish":
            owned = sorted(w for w, o in store.owners.items() if o is not None)
            if owned:
                store.owners[owned[step[1] % len(owned)]] = None
                store.in_use -= 1
        else:
            _, decider, pick = step
            seen, owners = reads[decider]
            free = sorted(w for w, o in owners.items() if o is None)
            if not free:
                continue
            chosen = free[pick % len(free)]
            verdict = judge(
                Ask(DisruptionReason.SCALE_DOWN, f"decider-{decider}-{chosen}"),
                worker(chosen),
                seen,
                NOW,
                active=never_active,
            )
            if isinstance(verdict, Admitted):
                store.write(chosen, owners, verdict)
        assert sum(1 for o in store.owners.values() if o is not None) <= allowed


# An admission made ahead (a surge's old worker, an expiry's lease) starts its disruption only where the
# rule still allows one: the worker protected or its pool closed since waits.
SURGE_OWNER = Owner(reason="rollout", actor="rollout:ro-1", since=NOW, counted=True, rollout_id="ro-1")


def test_given_a_surge_admission_and_then_do_not_disrupt_then_the_drain_waits_protected() -> None:
    verdict = judge(
        ROLLOUT, worker(owner=SURGE_OWNER, do_not_disrupt=True), state(), NOW, active=always_active
    )
    assert held(verdict) == "protected"


def test_given_a_surge_admission_and_then_a_pool_drain_then_the_voluntary_drain_waits() -> None:
    verdict = judge(
        ROLLOUT,
        worker(owner=SURGE_OWNER),
        state(pool(status=PoolStatus.INACTIVE)),
        NOW,
        active=always_active,
    )
    assert held(verdict) == "pool_not_active"


def test_given_an_expiry_admission_and_then_do_not_disrupt_then_the_drain_waits_protected() -> None:
    ask = Ask(DisruptionReason.EXPIRED, "reconciler", ahead=True)
    lease = Owner(reason="expired", actor="reconciler", since=NOW, counted=True, until=NOW.replace(hour=13))
    verdict = judge(ask, worker(owner=lease, do_not_disrupt=True), state(), NOW, active=always_active)
    assert held(verdict) == "protected"
