"""Re-reading and retrying when an optimistic write loses a race."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fleetkeeper.domain.errors import StaleWrite

T = TypeVar("T")

# A lost race means somebody else just wrote; a few fresh attempts settle it. More than this means
# a hot item under sustained contention, which the caller should hear about.
DEFAULT_ATTEMPTS = 8


def retry_conflicts(operation: Callable[[], T], attempts: int = DEFAULT_ATTEMPTS) -> T:
    """Run `operation` (which must read what it writes) until it stops losing races."""
    for _ in range(attempts - 1):
        try:
            return operation()
        except StaleWrite:
            continue
    return operation()
