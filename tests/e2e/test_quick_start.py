"""The quick start as a reader follows it: every command the banner of `make run` prints (and the README's
tour, the same commands), pasted into a new shell: no virtualenv on PATH, only what a login shell has."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetkeeper_local.stack import free_port
from tests.e2e.conftest import ROOT, control_plane_environment

pytestmark = [pytest.mark.slow]

# What a new login shell has: the system's folders, no virtualenv, no project variables.
NEW_SHELL = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": os.environ.get("HOME", "/root"),
    "LANG": "C.UTF-8",
}
TOUR = re.compile(r"^  (export \S+|bin/fleetkeeper .+?|curl .+?)\s*(?:#.*)?$")


@dataclass
class Banner:
    text: str
    worker: str
    instance: str

    def commands(self) -> list[str]:
        """The banner's commands, in order, as a reader copies them (comments dropped)."""
        tour = self.text.split("Try it", 1)[1]
        return [m.group(1) for m in map(TOUR.match, tour.splitlines()) if m]


@pytest.fixture(scope="module")
def banner() -> Iterator[Banner]:
    """A control plane of its own, started as `make run` starts it: the tour changes its seeded fleet."""
    env = control_plane_environment(free_port(), free_port())
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetkeeper_local", "run"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                raise AssertionError("the control plane exited:\n" + "".join(lines))
            lines.append(line)
            if "Press Ctrl-C" in line:
                break
        else:
            raise AssertionError("the control plane did not come up:\n" + "".join(lines))
        text = "".join(lines)
        found = re.search(r"\((w-\w+) runs the started instance (i-\w+),", text)
        assert found, text
        yield Banner(text, found.group(1), found.group(2))
    finally:
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=120)


def pasted(command: str, exports: list[str]) -> subprocess.Popen[str]:
    """`command` in a new shell at the clone's root, after the banner's `export` lines."""
    exported = dict(line.removeprefix("export ").split("=", 1) for line in exports)
    return subprocess.Popen(  # noqa: S603 - the banner's own commands
        ["/bin/sh", "-c", command],
        cwd=ROOT,
        env={**NEW_SHELL, **exported},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # Ctrl-C must reach it as in a terminal, whatever the test runner's own signals are.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )


def interrupt(shell: subprocess.Popen[str]) -> None:
    """Ctrl-C as a terminal sends it: to the command's processes, not to the shell that runs them."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != shell.pid:
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == shell.pid:  # its session: the command and what it started
                os.kill(int(entry.name), signal.SIGINT)


def run(command: str, exports: list[str]) -> str:
    shell = pasted(command, exports)
    output, _ = shell.communicate(timeout=60)
    assert shell.returncode == 0, f"{command}\n{output}"
    return output


def test_given_a_new_shell_then_every_command_of_the_banner_and_of_the_readme_tour_works(banner: Banner):
    commands = banner.commands()
    exports = [c for c in commands if c.startswith("export ")]
    w, i = banner.worker, banner.instance
    fk = "bin/fleetkeeper"
    assert [c for c in commands if c.startswith(fk)] == [
        f"{fk} workers",
        f"{fk} drain {w} --reason maintenance",
        f"{fk} drain-status {w} --watch",
        f"{fk} cancel-drain {w}",
        f"{fk} drain {w} --wait",
        f"{fk} instance state {i} COMPLETED",
        f"{fk} audit {w}",
    ]
    # The README's tour is the banner's, with W and I for the seeded ids.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = readme.split("The banner ends with this tour", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    for line in filter(None, (line.split("#", 1)[0].strip() for line in tour.splitlines())):
        command = re.sub(r"\bI\b", i, re.sub(r"\bW\b", w, line))
        assert f"  {command}" in banner.text, line

    assert w in run(f"{fk} workers", exports)
    assert "DRAINING" in run(f"{fk} drain {w} --reason maintenance", exports)
    watching = pasted(f"{fk} drain-status {w} --watch", exports)
    time.sleep(8)  # it is watching (the CLI starts in a second or two, slower on a busy machine)
    interrupt(watching)
    output, _ = watching.communicate(timeout=30)
    assert watching.returncode == 0, output
    assert f"\ndetached: the drain of {w} goes on" in output
    assert "cancelled" in run(f"{fk} cancel-drain {w}", exports)
    waiting = pasted(f"{fk} drain {w} --wait", exports)
    time.sleep(3)
    assert "COMPLETED" in run(f"{fk} instance state {i} COMPLETED", exports)
    output, _ = waiting.communicate(timeout=120)
    assert (waiting.returncode, f"drain of {w}: SUCCESS" in output) == (0, True), output
    assert "WorkerDrainCompleted" in run(f"{fk} audit {w}", exports)
    for curl in (c for c in commands if c.startswith("curl ")):
        answer = run(curl, exports)
        body = json.loads(answer[answer.index("{") :]) if "{" in answer else None
        assert isinstance(body, dict), f"{curl}\n{answer}"
        assert "error" not in body, f"{curl}\n{answer}"


def test_given_no_virtualenv_yet_then_the_shim_says_what_to_run(tmp_path: Path):
    clone = tmp_path / "clone"
    (clone / "bin").mkdir(parents=True)
    shim = clone / "bin" / "fleetkeeper"
    shim.write_bytes((ROOT / "bin" / "fleetkeeper").read_bytes())
    shim.chmod(0o755)

    done = subprocess.run(  # noqa: S603 - the shim as the clone holds it
        [str(shim), "workers"], env=NEW_SHELL, capture_output=True, text=True, check=False
    )

    assert done.returncode == 127
    assert done.stderr.strip() == (
        f"fleetkeeper: not installed in {clone}/.venv yet; run `make cli` in {clone} first"
    )
