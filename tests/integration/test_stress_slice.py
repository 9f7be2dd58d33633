"""A small slice of `make stress` inside `make test`: the same harness, fewer operations, faults on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).parents[2]
# The quiesce limit is a ceiling, not a cost: the run stops settling as soon as the fleet is settled. On a
# machine busy with the rest of the suite, the last drains' Finish steps need more than 30 s of ticks.
# Half the seeded fleet and 100 operations: every client still races the others through two API
# instances with faults on, and each reconcile cycle reads half as many workers. Seed 45 makes a client's
# first operation a rollout, so one is asked for whatever the interleaving.
SLICE = [
    *("--seed", "45", "--ops", "100", "--threads", "8", "--workers", "6", "--expiring", "3"),
    *("--quiesce-seconds", "90", "--no-report"),
]
FAILED_CHECK = re.compile(r"^  FAIL (.+): \d+$", re.MULTILINE)


def test_given_100_random_operations_with_faults_on_when_the_fleet_settles_then_no_invariant_breaks() -> None:
    # The harness starts its own stack and API instance processes; a subprocess keeps its environment,
    # fault plan and clients out of this test process.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TABLE_NAME", "DRAIN_", "MOTO_"))}
    run = subprocess.run(  # noqa: S603 - our own module, fixed argv
        [sys.executable, "-m", "bench.stress", *SLICE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        # The stack's start-up alone takes minutes on a busy machine, and each tick runs three shards.
        timeout=600,
        check=False,
    )
    summary = run.stdout[run.stdout.find("ops ") :]
    assert "violations = " in run.stdout, summary + run.stderr[-3000:]
    failed = set(FAILED_CHECK.findall(run.stdout))
    assert not failed, summary + run.stderr[-3000:]
    assert "violations = 0" in run.stdout, summary
    # Rollouts are in the mix: at least one was asked for.
    assert re.search(r"start_rollout \d+", run.stdout), summary
    assert run.returncode == 0, summary
