"""The newest image of each (name filter, region), read once per reconcile cycle.

Drift and launches both ask which image a template's filter selects now. Asked per worker, a wave of a
rollout (a hundred launches) would spend a hundred DescribeImages of the region's request budget, which
reconcile and discovery share; asked once per cycle, it costs one per filter and region, and a cycle's
launches and drift agree on the image.
"""

from __future__ import annotations

import threading

from fleetkeeper.services.context import Context

# A template's image is looked for by its name filter in a region: templates sharing a filter share it.
ImageKey = tuple[str, str]  # (ami_name_filter, region)


class NewestImages:
    """One cycle's answers. A read that fails is not kept: the next asker reads again."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self._found: dict[ImageKey, str | None] = {}
        self._locks: dict[ImageKey, threading.Lock] = {}
        self._guard = threading.Lock()

    def newest(self, name_filter: str, region: str) -> str | None:
        key = (name_filter, region)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        # One reader per key: the cycle's threads launching workers of one template wait for its answer.
        with lock:
            if key not in self._found:
                self._found[key] = self._ctx.ec2(region).newest_image(
                    name_filter, owners=self._ctx.settings.ami_owners
                )
            return self._found[key]
