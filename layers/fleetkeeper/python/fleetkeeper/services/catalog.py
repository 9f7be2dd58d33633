"""Templates and pools."""

from __future__ import annotations

import re

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.capacity import CapacityPolicy
from fleetkeeper.domain.capacity import problems as capacity_problems
from fleetkeeper.domain.disruption import DisruptionPolicy
from fleetkeeper.domain.errors import Conflict, InvalidInput
from fleetkeeper.domain.lifecycle import PoolStatus
from fleetkeeper.domain.models import NAME_PATTERN, Pool, WorkerTemplate
from fleetkeeper.domain.repair import RepairPolicy
from fleetkeeper.store.repository import FleetStore

_NAME = re.compile(NAME_PATTERN)


def is_valid_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


def put_template(store: FleetStore, template: WorkerTemplate, *, actor: str) -> WorkerTemplate:
    """Create or replace a template (last writer wins only if nobody wrote in between)."""
    current = store.find_template(template.name)
    expected_version = current.version if current else 0
    return store.put_template(template.model_copy(update={"version": expected_version}), actor=actor)


def ensure_pool(store: FleetStore, name: str, *, actor: str, description: str | None = None) -> Pool:
    """The pool, created active if it does not exist yet."""
    existing = store.find_pool(name)
    if existing is not None:
        return existing
    return store.create_pool(Pool(name=name, description=description), actor=actor)


def put_pool(
    store: FleetStore,
    name: str,
    *,
    actor: str,
    description: str | None = None,
    status: PoolStatus | None = None,
    disruption: DisruptionPolicy | None = None,
    repair: RepairPolicy | None = None,
    capacity: CapacityPolicy | None = None,
) -> tuple[Pool, bool]:
    """Create the pool or update it; returns (pool, created). Draining goes through the drain API only.
    None leaves a field as it is; `disruption` replaces the budgets whole, `repair` and `capacity` their
    settings whole."""
    if capacity is not None:
        check_capacity(store, capacity)
    existing = store.find_pool(name)
    if existing is None:
        pool = Pool(
            name=name,
            description=description,
            status=status or PoolStatus.ACTIVE,
            disruption=disruption or DisruptionPolicy(),
            repair=repair or RepairPolicy(),
            capacity=capacity or CapacityPolicy(),
        )
        return store.create_pool(pool, actor=actor), True

    def update() -> Pool:
        current = store.get_pool(name)
        changes: dict[str, object] = {}
        if description is not None:
            changes["description"] = description
        if status is not None and status != current.status:
            if current.status == PoolStatus.DRAINING:
                raise Conflict(
                    "pool",
                    name,
                    current.status,
                    f"pool {name} is draining; cancel the drain to change its status",
                )
            changes["status"] = status
        if disruption is not None and disruption != current.disruption:
            changes["disruption"] = disruption
        if repair is not None and repair != current.repair:
            changes["repair"] = repair
        if capacity is not None and capacity != current.capacity:
            changes["capacity"] = capacity
        if not changes:
            return current
        return store.save_pool(current, changes, actor=actor, action="PoolUpdated")

    return retry_conflicts(update), False


def check_capacity(store: FleetStore, policy: CapacityPolicy) -> None:
    """A capacity policy names a known template whose workers can hold what it asks (InvalidInput)."""
    if policy.template is None:
        return
    template = store.find_template(policy.template)
    if template is None:
        raise InvalidInput("capacity.template", f"unknown template '{policy.template}'")
    for field, reason in capacity_problems(policy, template.capacity):
        raise InvalidInput(field, reason)
