"""Environments restored from one SnapStart snapshot draw different retry jitter once the runtime has run
the after-restore hooks fleetkeeper registers (snapshot_restore_py, as the Lambda runtime ships it)."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from botocore.retries.standard import ExponentialBackoff, RetryContext
from snapshot_restore_py import get_after_restore

import fleetkeeper.uniqueness

# One retry's worth of context: the 4th attempt of a call, as botocore's standard mode sees it.
_RETRY = RetryContext(attempt_number=4, http_response=None)
_DRAWS = 8


@pytest.fixture
def snapshot() -> Iterator[object]:
    """The module-level generator's state as init left it in the snapshot; put back afterwards."""
    state = random.getstate()
    yield state
    random.setstate(state)


def restore(state: object, *, run_hooks: bool) -> list[float]:
    """A new environment resumed from the snapshot: the same generator state, then (as the runtime does)
    every registered after-restore hook; returns the jitter of its next retries."""
    random.setstate(state)  # type: ignore[arg-type]
    if run_hooks:
        for hook, args, kwargs in get_after_restore():
            hook(*args, **kwargs)
    backoff = ExponentialBackoff()  # botocore's standard-mode backoff, on the module-level random
    return [backoff.delay_amount(_RETRY) for _ in range(_DRAWS)]


def test_given_the_package_imported_then_its_reseed_is_an_after_restore_hook() -> None:
    assert (fleetkeeper.uniqueness.reseed, (), {}) in get_after_restore()


def test_given_two_restores_of_one_snapshot_then_the_hooks_make_their_retry_jitter_differ(
    snapshot: object,
) -> None:
    first = restore(snapshot, run_hooks=True)
    second = restore(snapshot, run_hooks=True)

    assert first != second
    assert all(0 <= delay <= 0.4 for delay in first + second)  # 50 ms x 2**3: still botocore's bounds


def test_given_two_restores_without_the_hooks_then_their_jitter_is_the_same_sequence(
    snapshot: object,
) -> None:
    # What the hook is for: the snapshot's generator state alone repeats itself in every environment.
    assert restore(snapshot, run_hooks=False) == restore(snapshot, run_hooks=False)
