"""Random operation sequences through the real store never store an illegal transition."""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from fleetkeeper.domain.errors import Conflict, IllegalTransition
from fleetkeeper.domain.lifecycle import (
    ACCEPTS_INSTANCES,
    Cause,
    InstanceState,
    WorkerStatus,
    can_transition,
)
from fleetkeeper.domain.models import Instance, Worker, WorkerTemplate
from fleetkeeper.services import catalog
from fleetkeeper.store.repository import FleetStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = int(os.environ.get("FLEETKEEPER_PROPERTY_EXAMPLES", "8"))  # `make stress` runs 60


def test_given_random_operations_then_the_store_only_ever_holds_legal_transitions(store: FleetStore):
    catalog.put_template(
        store,
        WorkerTemplate(name="lab", instance_type="m5.large", ami_name_filter="lab-*", capacity=3),
        actor="test",
    )

    class WorkerLifecycle(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.worker = store.create_worker(
                Worker(id=f"w-{uuid.uuid4().hex[:12]}", template="lab", region="us-east-1", capacity=3),
                actor="property",
            )
            self.stale: Worker = self.worker
            self.active: list[Instance] = []

        @rule(
            to_status=st.sampled_from(list(WorkerStatus)),
            cause=st.sampled_from(list(Cause)),
            use_stale=st.booleans(),
        )
        def transition(self, to_status, cause, use_stale):
            read = self.stale if use_stale else store.get_worker(self.worker.id)
            current = store.get_worker(self.worker.id)
            try:
                self.worker = store.transition_worker(read, to_status, cause=cause, actor="property")
            except IllegalTransition:
                assert not can_transition(read.status, to_status, cause)
            except Conflict as conflict:
                assert read.version != current.version
                assert conflict.current_status == current.status
            else:
                assert read.version == current.version
                assert can_transition(read.status, to_status, cause)
            self.stale = read

        @rule()
        def place(self):
            current = store.get_worker(self.worker.id)
            try:
                placed = store.place_instance(
                    Instance(id=f"i-{uuid.uuid4().hex[:12]}", worker_id=""), current, actor="property"
                )
            except Conflict:
                assert current.status != ACCEPTS_INSTANCES or current.active_instances >= current.capacity
            else:
                assert current.status == ACCEPTS_INSTANCES
                self.active.append(placed)

        @rule(
            state=st.sampled_from([InstanceState.COMPLETED, InstanceState.FAILED, InstanceState.TERMINATED])
        )
        def end(self, state):
            if self.active:
                store.end_instance(self.active.pop(0), state, actor="property")

        @invariant()
        def stored_history_is_legal(self):
            stored = store.get_worker(self.worker.id)
            trail = [e for e in store.audit_trail("worker", self.worker.id) if e.from_status != e.to_status]
            for event in trail[1:]:
                assert can_transition(
                    WorkerStatus(str(event.from_status)),
                    WorkerStatus(str(event.to_status)),
                    Cause(str(event.details["cause"])),
                ), event
            assert trail[-1].to_status == stored.status
            assert stored.active_instances == len(self.active) <= stored.capacity

    run_state_machine_as_test(
        WorkerLifecycle,
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
