"""Key and index attributes for each entity (layout in store/schema.py)."""

from __future__ import annotations

import uuid
from typing import Any

from fleetkeeper.domain.models import AuditEvent, Instance, Pool, Worker, WorkerTemplate


def worker_key(worker_id: str) -> dict[str, str]:
    return {"PK": f"WORKER#{worker_id}", "SK": "WORKER"}


def template_key(name: str) -> dict[str, str]:
    return {"PK": f"TEMPLATE#{name}", "SK": "TEMPLATE"}


def pool_key(name: str) -> dict[str, str]:
    return {"PK": f"POOL#{name}", "SK": "POOL"}


def instance_key(instance_id: str) -> dict[str, str]:
    return {"PK": f"INSTANCE#{instance_id}", "SK": "INSTANCE"}


def audit_partition(entity: str, entity_id: str) -> str:
    return f"AUDIT#{entity}#{entity_id}"


def worker_status_partition(status: str) -> str:
    return f"WORKER#{status}"


def worker_status_sort(region: str | None = None, template: str | None = None) -> str:
    """Prefix of the by_status sort key, to narrow a status query by region and template."""
    if region is None:
        return ""
    if template is None:
        return f"{region}#"
    return f"{region}#{template}#"


def instance_state_partition(state: str) -> str:
    return f"INSTANCE#{state}"


def kind_partition(kind: str) -> str:
    return f"KIND#{kind}"


def worker_index_attributes(worker: Worker) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "GSI1PK": worker_status_partition(worker.status),
        "GSI1SK": f"{worker.region}#{worker.template}#{worker.id}",
        "GSI3PK": kind_partition("WORKER"),
        "GSI3SK": worker.id,
    }
    if worker.pool:
        attributes["GSI2PK"] = f"POOL#{worker.pool}"
        attributes["GSI2SK"] = f"WORKER#{worker.id}"
    return attributes


def instance_index_attributes(instance: Instance) -> dict[str, Any]:
    return {
        "GSI1PK": instance_state_partition(instance.state),
        "GSI1SK": f"{instance.worker_id}#{instance.id}",
        "GSI2PK": f"WORKER#{instance.worker_id}",
        "GSI2SK": f"INSTANCE#{instance.id}",
        "GSI3PK": kind_partition("INSTANCE"),
        "GSI3SK": instance.id,
    }


def template_index_attributes(template: WorkerTemplate) -> dict[str, Any]:
    return {"GSI3PK": kind_partition("TEMPLATE"), "GSI3SK": template.name}


def pool_index_attributes(pool: Pool) -> dict[str, Any]:
    return {"GSI3PK": kind_partition("POOL"), "GSI3SK": pool.name}


def audit_key(event: AuditEvent) -> dict[str, str]:
    # The random suffix keeps two events of the same microsecond apart; the time prefix keeps order.
    return {
        "PK": audit_partition(event.entity, event.entity_id),
        "SK": f"{event.at.isoformat()}#{uuid.uuid4().hex[:8]}",
    }
