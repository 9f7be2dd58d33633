"""Entropy after a SnapStart restore: every environment restored from one snapshot starts with the memory
the snapshot holds, including the state of Python's module-level `random` generator, seeded once at init.

Without a new seed each restored environment draws the same numbers: botocore's retry jitter (standard
mode draws from `random.random`) would send the retries of a whole scale-out at the same instants, and
Powertools' log sampling would pick the same invocations. `reseed` draws a new seed from the OS, and is
registered with the Lambda runtime's after-restore hooks when the runtime has them (the
`snapshot_restore_py` library it ships). Elsewhere nothing is ever restored from a snapshot, so there is
nothing to register. The audit of every use of randomness is in docs/performance.md (SnapStart).
"""

from __future__ import annotations

import random


def reseed() -> None:
    """Seed the module-level generator from the OS again (what `random` does at import)."""
    random.seed()


try:
    from snapshot_restore_py import register_after_restore
except ImportError:  # not the Lambda runtime: no snapshot, no restore
    pass
else:
    register_after_restore(reseed)
