"""Swagger UI at /docs, in a real browser: "Try it out" reaches the API the page was served from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.conftest import ROOT

pytestmark = [pytest.mark.slow]

SCRIPT = Path(__file__).with_name("docs_page.mjs")
# Debian's package (`make test` installs it); FLEETKEEPER_CHROMIUM names another Chromium or Chrome.
CHROMIUM = os.environ.get("FLEETKEEPER_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
PLAYWRIGHT = ROOT / "node_modules" / "playwright-core"


def test_given_the_docs_page_then_try_it_out_runs_a_get_and_a_post_against_this_api(control_plane_url):
    missing = [str(p) for p in (Path(CHROMIUM), PLAYWRIGHT) if not p.exists()]
    if missing:
        # CI installs both (`make test`); a developer's machine without them is told what is missing.
        assert not os.environ.get("CI"), f"missing {missing}: run make test"
        pytest.skip(f"missing {missing}: `make test` installs them (apt-get install chromium as root)")
    body = json.dumps({"template": "lab-small"})

    run = subprocess.run(  # noqa: S603 - our own script, arguments from the test
        ["node", str(SCRIPT), control_plane_url, CHROMIUM, body],  # noqa: S607 - node from PATH, as make
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

    assert run.returncode == 0, run.stderr
    calls = json.loads(run.stdout.strip().splitlines()[-1])
    get, post = calls["get"], calls["post"]
    assert (get["method"], get["url"].split("?")[0], get["status"], get["shown"]) == (
        "GET",
        f"{control_plane_url}/api/v1/workers",
        200,
        "200",
    )
    assert (post["method"], post["url"], post["status"], post["shown"]) == (
        "POST",
        f"{control_plane_url}/api/v1/workers",
        201,
        "201",
    )
