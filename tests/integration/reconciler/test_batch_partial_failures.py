"""What one worker's trouble does to the others of its batched EC2 call (docs/capacity.md, "One launch
call per batch"): a machine EC2 refuses to start holds back only its own worker."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.tags import MANAGED_BY_TAG
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.iam.policies import load_model
from fleetkeeper_local.iam.record import Summary
from fleetkeeper_local.iam.recorder import Recorder
from tests.integration.functions import reconcile_fleet
from tests.integration.reconciler.conftest import ContextFactory, LiveWorkerFactory
from tests.integration.reconciler.test_launch_batches import policy_pool

pytestmark = pytest.mark.integration

S = WorkerStatus


def test_given_one_warm_worker_whose_machine_iam_will_not_start_then_the_others_of_its_type_still_start(
    store: FleetStore,
    make_ctx: ContextFactory,
    live_worker: LiveWorkerFactory,
    ec2: Any,
) -> None:
    warm = [live_worker(pool="labs") for _ in range(4)]
    ec2.stop_instances(InstanceIds=[w.ec2_instance_id for w in warm])
    for worker in warm:
        store.transition_worker(worker, S.STOPPED, cause=Cause.EC2, actor="test")
    # One machine lost its managed tag (an import whose tagging failed, a hand edit): IAM denies
    # starting it, and EC2 refuses a StartInstances naming it as a whole (UnauthorizedOperation).
    bad, good = warm[0], warm[1:]
    ec2.delete_tags(Resources=[bad.ec2_instance_id], Tags=[{"Key": MANAGED_BY_TAG}])
    policy_pool(store, 4)
    now = utcnow()

    reconcile_fleet(make_ctx(), now=now)  # asks the four to start
    # A recorder of the test's own enforces IAM on the starts, so the denials provoked here are not the
    # run's.
    with iam_session.paused(), Recorder(load_model(), summary=Summary()).installed():
        for minute in range(4):
            reconcile_fleet(make_ctx(), now=now + timedelta(minutes=minute, seconds=1))

    assert [w.status for w in store.get_workers([w.id for w in good])] == [S.RUNNING] * 3
    assert store.get_worker(bad.id).status != S.RUNNING
