"""A template's lead-time samples (domain/lead_time.py): one small item beside the template.

PK `TEMPLATE#<name>`, SK `LEADTIME`: the last SAMPLES_KEPT seconds of each kind, oldest first, and a
version. A sample is added by a read and a put conditioned on the version read, run again from a fresh
read when another writer got there first, so concurrent samples are all kept and the lists never grow
past their bound (two lists of 50 numbers: well under a kilobyte, store/item_size.py).
"""

from __future__ import annotations

from typing import Any

from fleetkeeper.cloud.retry import retry_conflicts
from fleetkeeper.domain.errors import StaleWrite
from fleetkeeper.domain.lead_time import LeadKind, kept
from fleetkeeper.store.codec import deserialize
from fleetkeeper.store.table import TableAccess, put_next_version

LEAD_TIME_SORT_KEY = "LEADTIME"


def lead_time_key(template: str) -> dict[str, str]:
    return {"PK": f"TEMPLATE#{template}", "SK": LEAD_TIME_SORT_KEY}


class LeadTimeRepository(TableAccess):
    def lead_samples(self, template: str) -> dict[LeadKind, list[float]]:
        """The template's kept samples of each kind, oldest first (none yet: empty lists)."""
        return _samples(self._lead_item(template))

    def add_lead_sample(self, template: str, kind: LeadKind, seconds: float) -> None:
        """Keep one more sample of `kind`, dropping the oldest beyond the bound."""
        retry_conflicts(lambda: self._add_lead_sample(template, kind, seconds))

    def _lead_item(self, template: str) -> dict[str, Any]:
        item = self._get(lead_time_key(template))
        return deserialize(item) if item else {}

    def _add_lead_sample(self, template: str, kind: LeadKind, seconds: float) -> None:
        current = self._lead_item(template)
        version = int(current.get("version", 0))
        samples = _samples(current)
        samples[kind] = kept(samples[kind], round(seconds, 1))
        item = {
            **lead_time_key(template),
            **{str(k): v for k, v in samples.items()},
            "version": version + 1,
        }
        put_next_version(
            self._client,
            self.table_name,
            item,
            expected_version=version,
            stale=lambda: StaleWrite("lead time", template, None),
        )


def _samples(item: dict[str, Any]) -> dict[LeadKind, list[float]]:
    return {kind: [float(s) for s in item.get(str(kind), [])] for kind in LeadKind}
