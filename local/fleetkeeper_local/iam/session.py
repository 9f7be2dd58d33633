"""The recorder of one process (a test process, `make run`, an API instance), and its record.

FLEETKEEPER_LOCAL_IAM chooses what happens to a request its function's policies do not allow:
`enforce` (the default) fails it as AWS would and records it, `record` only records it, `off` turns
the evaluation off. FLEETKEEPER_LOCAL_IAM_RECORD names a file the process writes its record to when it
stops, so the process that started it (the e2e tests) can merge it into its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Final

from fleetkeeper_local.iam.policies import load_model
from fleetkeeper_local.iam.record import Summary

if TYPE_CHECKING:
    from fleetkeeper_local.iam.recorder import Recorder

MODE_ENVIRONMENT: Final = "FLEETKEEPER_LOCAL_IAM"
RECORD_ENVIRONMENT: Final = "FLEETKEEPER_LOCAL_IAM_RECORD"
MODES: Final = ("enforce", "record", "off")

# Everything this process recorded, plus what it merged from the processes it started.
RUN: Final = Summary()
_active: list[Recorder] = []  # the recorder `recording()` installed, while it is installed


def mode() -> str:
    value = os.environ.get(MODE_ENVIRONMENT, "enforce").strip().lower() or "enforce"
    if value not in MODES:
        raise ValueError(f"{MODE_ENVIRONMENT} must be one of {', '.join(MODES)}, not {value!r}")
    return value


@contextmanager
def recording() -> Iterator[bool]:
    """Evaluate every function's requests in the block (unless the mode is off); yields whether on."""
    if mode() == "off":
        yield False
        return
    # The recorder loads fleetkeeper and botocore: `make run` reads the mode before it imports them.
    from fleetkeeper_local.iam.recorder import Recorder  # noqa: PLC0415

    recorder = Recorder(load_model(), summary=RUN, enforce=mode() == "enforce")
    with recorder.installed():
        _active.append(recorder)
        try:
            yield True
        finally:
            _active.remove(recorder)


@contextmanager
def paused() -> Iterator[None]:
    """The process's recorder looks away inside the block (a test of the recorder installs its own)."""
    recorders = list(_active)
    for recorder in recorders:
        recorder.enabled = False
    try:
        yield
    finally:
        for recorder in recorders:
            recorder.enabled = True


def record_path(suffix: str = "") -> Path | None:
    """Where this process writes its record (FLEETKEEPER_LOCAL_IAM_RECORD, plus a suffix), if anywhere."""
    base = os.environ.get(RECORD_ENVIRONMENT)
    return Path(base + suffix) if base else None


def write_record(suffix: str = "") -> None:
    path = record_path(suffix)
    if path is not None:
        RUN.write(path)


def merge_records(base: Path, *, pattern: str = "") -> Summary:
    """Merge into RUN the record written at `base` and those at `base` + a suffix matching `pattern`."""
    paths = [base] if base.exists() else []
    if pattern:
        paths += sorted(base.parent.glob(base.name + pattern))
    for path in paths:
        RUN.merge(Summary.read(path))
    return RUN
