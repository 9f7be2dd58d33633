"""What admission costs: a rollout step that asks the door for five drains reads its pool's state once and
shares it among them, and reads no index per candidate. Every DynamoDB request of the step is counted
by a botocore hook on the real client, by operation, with the items index queries return."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from fleetkeeper.domain.disruption import Budget, DisruptionPolicy
from fleetkeeper.domain.models import utcnow
from fleetkeeper.domain.rollouts import RolloutRequest, RolloutStrategy
from fleetkeeper.services import catalog
from fleetkeeper.services.context import Context
from fleetkeeper.services.rollouts import commands as rollouts
from fleetkeeper.services.rollouts.engine import advance_rollouts
from fleetkeeper.store.keys import COUNTER_PARTITIONS
from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local import faults
from tests.integration.conftest import WorkerFactory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DRAINS = 5


@dataclass
class Requests:
    """The DynamoDB requests seen while the hooks are installed."""

    by_operation: Counter[str] = field(default_factory=Counter)
    index_items: int = 0
    reads_of: Counter[str] = field(default_factory=Counter)  # partition key -> requests that read it
    # (index or "table", the queried partition's kind: its key up to "#") -> queries
    queries: Counter[tuple[str, str]] = field(default_factory=Counter)

    def note(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        context["door_costs_params"] = params

    def count(self, event_name: str, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        params = context.get("door_costs_params", {})
        self.by_operation[operation] += 1
        if operation == "Query":
            placeholder = str(params["KeyConditionExpression"]).split("=")[1].split()[0]
            partition = next(iter(params["ExpressionAttributeValues"][placeholder].values()))
            self.queries[(params.get("IndexName", "table"), str(partition).split("#")[0])] += 1
        if operation == "Query" and params.get("IndexName"):
            self.index_items += len(parsed.get("Items", []))
        keys: list[dict[str, Any]] = []
        if operation == "GetItem":
            keys = [params["Key"]]
        elif operation == "BatchGetItem":
            keys = [k for request in params["RequestItems"].values() for k in request["Keys"]]
        for key in keys:
            self.reads_of[str(key["PK"]["S"])] += 1

    def hooks(self) -> list[faults.HookSpec]:
        return [("before-parameter-build.dynamodb", self.note), ("after-call.dynamodb", self.count)]


def without_rollout_listing(queries: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    return Counter({query: n for query, n in queries.items() if query != ("by_status", "ROLLOUT")})


def one_step(
    make_ctx: Callable[..., Context], store: FleetStore, make: WorkerFactory, pool: str, size: int
) -> Requests:
    """The requests of the first cycle step of a rollout over a pool of `size` workers whose wave and
    budget are five drains; the rollout is cancelled afterwards, so the next cycle steps another alone."""
    catalog.put_pool(store, pool, actor="test", disruption=DisruptionPolicy(budgets=[Budget(max=DRAINS)]))
    for _ in range(size):
        make(pool=pool)
    ctx = make_ctx()
    started = rollouts.start(
        ctx,
        RolloutRequest(
            template="lab", pool=pool, max_unavailable=DRAINS, strategy=RolloutStrategy.DRAIN_FIRST
        ),
        actor="test",
        claim=size,  # the whole scope at the start: what the step reads is its wave's alone
    )
    seen = Requests()
    with faults.installed_hooks(seen.hooks()):
        counters: Counter[str] = Counter()
        advance_rollouts(make_ctx(), counters, time_left=lambda: 60.0, margin_seconds=1.0, now=utcnow())
    assert counters["rollout_steps"] == 1, counters
    rollouts.cancel(ctx, started.id, actor="test")
    return seen


def test_given_rollout_steps_over_pools_of_10_and_40_then_each_reads_its_pool_once_and_no_index_per_candidate(
    make_ctx: Callable[..., Context],
    store: FleetStore,
    running_worker: WorkerFactory,
    drains_started: list[dict[str, Any]],
) -> None:
    small = one_step(make_ctx, store, running_worker, "small", 10)
    assert len(drains_started) == DRAINS
    big = one_step(make_ctx, store, running_worker, "big", 40)
    assert len(drains_started) == 2 * DRAINS

    for pool, size, seen in (("small", 10, small), ("big", 40, big)):
        # The pool item and its counts, once for the five admissions.
        assert (seen.reads_of[f"POOL#{pool}"], seen.reads_of[f"DISRUPTING#{pool}"]) == (1, 1), seen
        assert seen.index_items <= 2 * size, seen
    # However large the pool, the same queries: none per candidate. The listing of running rollouts
    # resumes after the rollout stepped last, so it may wrap around in one more page: not a candidate's.
    assert without_rollout_listing(small.queries) == without_rollout_listing(big.queries), (small, big)
    # Beyond that listing a step queries only the fleet's counts, one page per counter partition.
    assert without_rollout_listing(big.queries) == {("table", "COUNTS"): COUNTER_PARTITIONS}, big
    assert small.by_operation["TransactWriteItems"] == big.by_operation["TransactWriteItems"], (small, big)
