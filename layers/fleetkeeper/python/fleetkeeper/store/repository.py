"""DynamoDB access for every entity, behind one facade. All writes are conditional; every transition
carries its audit item.

Where each part lives:
- store/table.py: consistent get/find by key and model, queries, and `_transact`, the one place a
  cancelled transaction is mapped to a typed error (or retried, then `Unavailable`);
- store/catalog.py: templates and pools; store/workers.py: workers; store/instances.py: instances
  while they stay active; store/audit.py: the audit trail; store/operations.py: worker operations;
- store/slots.py: the slot-counter transactions (placement, ending an instance) and the exact list of a
  worker's active instances;
- store/counters.py: the exact worker counts per scope and status, kept by the worker writes;
- store/layout.py and store/migration.py: which index layout the table is in, and the steps that
  migrate a table written by an earlier release;
- store/drain_marks.py: the drain sweep's marks (when it last called Step Functions for a drain);
- store/lead_times.py: each template's lead-time samples.

Concurrency rules: docs/data-model.md.
"""

from __future__ import annotations

from fleetkeeper.store.audit import AuditRepository
from fleetkeeper.store.catalog import CatalogRepository
from fleetkeeper.store.drain_marks import DrainMarkRepository
from fleetkeeper.store.lead_times import LeadTimeRepository
from fleetkeeper.store.migration import MigrationRepository
from fleetkeeper.store.operations import OperationRepository
from fleetkeeper.store.slots import SlotTransactions
from fleetkeeper.store.table import MAX_QUERY_PAGE, Page
from fleetkeeper.store.workers import WorkerRepository

__all__ = ["MAX_QUERY_PAGE", "FleetStore", "Page"]


class FleetStore(
    SlotTransactions,
    WorkerRepository,
    CatalogRepository,
    AuditRepository,
    OperationRepository,
    MigrationRepository,
    DrainMarkRepository,
    LeadTimeRepository,
):
    """Repository over the single fleetkeeper table; services reach every entity through `ctx.store`."""
