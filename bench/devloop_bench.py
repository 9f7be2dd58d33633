"""The developer's and the operator's everyday loop, each timed as a whole process on this machine.

- `make run` on a fresh clone (`git clone` of the checkout's HEAD), until the API answers and until the
  banner says the control plane is up: with the package caches as they are (warm) and, with --cold,
  with empty uv, pip and npm caches (as on a new machine);
- `make run` again in the checkout (a restart: `.venv`, `node_modules` and `build/` in place), the same
  two instants, the CPU its processes used until it was up, and how long Ctrl-C takes to end it;
- `fleetkeeper --help`, `fleetkeeper workers` against that running local API, and `fleetkeeper workers`
  with no API listening, each in alternating pairs with `python -c pass` of the same interpreter.

The machine is shared, so every figure is a median, and each has a yardstick measured in the same run:
the CLI's per-pair ratio to `python -c pass`, a start's CPU seconds and the load average when it began.
With `--vs DIR` a second checkout (the code before a change) is measured in turn with this one, start
for start, so both meet the same load.

`python -m bench devloop [--root DIR] [--vs DIR] [--starts N] [--runs N] [--fresh N] [--cold N]` keeps
the figures in bench/results/devloop.json (this checkout as `after`, --vs as `before`) and writes the
section from them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
FIGURES = RESULTS / "devloop.json"
SECTION = RESULTS / "devloop.md"
UP_LINE = "The local control plane is up"
# The slowest start worth waiting for: a cold first start on this machine under load.
START_TIMEOUT_SECONDS = 1200.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ports() -> dict[str, str]:
    return {
        "FLEETKEEPER_API_PORT": str(_free_port()),
        "FLEETKEEPER_DYNAMODB_PORT": str(_free_port()),
        "FLEETKEEPER_MOTO_PORT": str(_free_port()),
    }


def _tree_cpu(root_pid: int) -> float:
    """CPU seconds of a process and all its descendants, the reaped ones included (Linux /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = sum(int(v) for v in fields[11:15]) / CLOCK_TICKS
    tree, frontier = {root_pid}, [root_pid]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(times.get(pid, 0.0) for pid in tree)


def clean_environment(root: Path) -> dict[str, str]:
    """The caller's environment without any virtualenv on PATH, as a new shell has it."""
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    venvs = tuple(str(p) for p in (root / ".venv", os.environ.get("VIRTUAL_ENV") or "/nonexistent"))
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(venvs))
    return env


@dataclass
class Start:
    """One `make run`: seconds from the command's start until the API answered and until it was up."""

    api_seconds: float
    up_seconds: float
    cpu_seconds: float  # the processes' CPU until up
    load: float
    stop_seconds: float = 0.0
    lines: list[tuple[float, str]] = field(default_factory=list)


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback only
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def _tail(lines: list[tuple[float, str]], count: int = 30) -> str:
    return "\n".join(f"{at:7.1f}  {line}" for at, line in lines[-count:])


@contextlib.contextmanager
def running(root: Path, env: dict[str, str]) -> Iterator[Start]:
    """`make run` in `root` until it is up; stopped with Ctrl-C (SIGINT to its group) on leaving."""
    env = {**env, "PYTHONUNBUFFERED": "1"}
    api = f"http://127.0.0.1:{env['FLEETKEEPER_API_PORT']}/api/v1/workers?limit=1"
    load = os.getloadavg()[0]
    started = time.monotonic()
    process = subprocess.Popen(
        ["make", "--no-print-directory", "run"],  # noqa: S607 - make from PATH, as a developer runs it
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # Ctrl-C must reach it, whatever this process inherited (a background job ignores SIGINT).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
    )
    lines: list[tuple[float, str]] = []
    up = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.monotonic() - started, line.rstrip("\n")))
            if UP_LINE in line:
                up.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    api_seconds: float | None = None
    try:
        while True:
            if time.monotonic() - started > START_TIMEOUT_SECONDS:
                raise RuntimeError(f"make run was not up in {START_TIMEOUT_SECONDS:.0f} s:\n{_tail(lines)}")
            if process.poll() is not None:
                raise RuntimeError(f"make run exited with {process.returncode}:\n{_tail(lines)}")
            if api_seconds is None and _answers(api):
                api_seconds = time.monotonic() - started
            if api_seconds is not None and up.wait(0.1):
                break
            time.sleep(0.1)
        cpu = _tree_cpu(process.pid)
        up_seconds = next(at for at, line in lines if UP_LINE in line)
        start = Start(api_seconds, up_seconds, cpu, load, lines=lines)
        yield start
        stopping = time.monotonic()
        os.killpg(process.pid, signal.SIGINT)
        process.wait(timeout=180)
        start.stop_seconds = time.monotonic() - stopping
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        reader.join(timeout=5)


def _times(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one whole process."""
    began = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # noqa: S603
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0
    return time.perf_counter() - began, usage.ru_utime + usage.ru_stime


@dataclass
class Pairs:
    """A command and `python -c pass` in turn: medians, and the median of the per-pair ratios."""

    seconds: float
    floor_seconds: float
    ratio: float
    cpu_seconds: float
    cpu_ratio: float
    runs: int


def pairs(argv: list[str], python: str, env: dict[str, str], cwd: Path, runs: int) -> Pairs:
    floor = [python, "-c", "pass"]
    _times(argv, env, cwd), _times(floor, env, cwd)  # page cache and bytecode
    measured = [(_times(argv, env, cwd), _times(floor, env, cwd)) for _ in range(runs)]
    return Pairs(
        seconds=statistics.median(a[0] for a, _ in measured),
        floor_seconds=statistics.median(b[0] for _, b in measured),
        ratio=statistics.median(a[0] / b[0] for a, b in measured),
        cpu_seconds=statistics.median(a[1] for a, _ in measured),
        cpu_ratio=statistics.median(a[1] / max(b[1], 0.001) for a, b in measured),
        runs=runs,
    )


def fresh_start(root: Path, *, cold: bool) -> Start:
    """`make run` on a new clone of `root`'s HEAD, its package caches warm or (cold) empty."""
    with tempfile.TemporaryDirectory(prefix="fleetkeeper-devloop-") as scratch:
        clone = Path(scratch) / "clone"
        subprocess.run(["git", "clone", "--quiet", str(root), str(clone)], check=True)  # noqa: S603, S607
        env = {**clean_environment(root), **_ports()}
        if cold:
            caches = Path(scratch) / "caches"
            env |= {
                "UV_CACHE_DIR": str(caches / "uv"),
                "PIP_CACHE_DIR": str(caches / "pip"),
                "npm_config_cache": str(caches / "npm"),
            }
        with running(clone, env) as start:
            pass
        return start


def cli_figures(root: Path, env: dict[str, str], runs: int) -> dict[str, Pairs]:
    """The CLI against the running local API at env's port, and against a port nothing listens on."""
    python = str(root / ".venv" / "bin" / "python")
    fleetkeeper = str(root / ".venv" / "bin" / "fleetkeeper")
    silent = {**env, "FLEETKEEPER_API_PORT": str(_free_port())}
    # What `fleetkeeper workers` asks, from curl: the API's own share of the command's time.
    listing = f"http://127.0.0.1:{env['FLEETKEEPER_API_PORT']}/api/v1/workers?limit=1000"
    return {
        "help": pairs([fleetkeeper, "--help"], python, env, root, runs),
        "workers": pairs([fleetkeeper, "workers"], python, env, root, runs),
        "curl_workers": pairs(["curl", "-s", "-o", "/dev/null", listing], python, env, root, runs),
        "workers_no_api": pairs([fleetkeeper, "workers"], python, silent, root, runs),
    }


def _summary(group: list[Start]) -> dict[str, Any] | None:
    if not group:
        return None
    return {
        "runs": len(group),
        **{
            name: round(statistics.median(float(getattr(s, name)) for s in group), 2)
            for name in ("api_seconds", "up_seconds", "cpu_seconds", "stop_seconds", "load")
        },
    }


def _commit(root: Path) -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
    )
    return done.stdout.strip()


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


# The loop's goals, in seconds: a start until the banner says it is up, a CLI command's wall time.
START_GOALS: dict[str, float] = {"warm": 90.0, "restart": 10.0}
CLI_GOALS: dict[str, float] = {"help": 0.3, "workers": 0.5}


def _goal(limit: float | None, found: float | None) -> str:
    """The goal's cell, judged on the last checkout measured."""
    if limit is None:
        return "-"
    shown = f"{limit:.0f} s" if limit >= 1 else _ms(limit)
    if found is None:
        return f"<= {shown}: not measured"
    return f"<= {shown}: {'met' if found <= limit else 'not met'}"


def render(recorded: dict[str, Any]) -> str:
    labels = [label for label in ("before", "after") if label in recorded]
    last = labels[-1]
    header = (
        "| figure | "
        + " | ".join(f"{label} ({recorded[label]['commit']})" for label in labels)
        + f" | goal ({last}) |"
    )
    rows: list[tuple[str, list[str]]] = []

    def starts(title: str, kind: str) -> None:
        found = [recorded[label]["starts"].get(kind) for label in labels]
        if not any(found):
            return
        cells = [
            f"API {f['api_seconds']:.0f} s, up {f['up_seconds']:.0f} s; {f['cpu_seconds']:.0f} s CPU; "
            f"load {f['load']:.0f}; n={f['runs']}"
            if f
            else "-"
            for f in found
        ]
        mine = recorded[last]["starts"].get(kind)
        rows.append((title, [*cells, _goal(START_GOALS.get(kind), mine["up_seconds"] if mine else None)]))

    starts("`make run`, first on a fresh clone, warm caches", "warm")
    starts("`make run`, first on a fresh clone, cold caches", "cold")
    starts("`make run`, a restart", "restart")
    rows.append(
        (
            "`make run`, Ctrl-C until it has exited",
            [
                f"{recorded[label]['starts']['restart']['stop_seconds']:.1f} s"
                if recorded[label]["starts"].get("restart")
                else "-"
                for label in labels
            ]
            + ["-"],
        )
    )
    for name, title in (
        ("help", "`fleetkeeper --help`"),
        ("workers", "`fleetkeeper workers`, local API"),
        ("curl_workers", "the same request with curl (the API's share)"),
        ("workers_no_api", "`fleetkeeper workers`, no API listening"),
    ):
        cells = []
        for label in labels:
            found = recorded[label]["cli"].get(name)
            cells.append(
                f"{_ms(found['seconds'])} ({found['ratio']:.1f}x); CPU {_ms(found['cpu_seconds'])} "
                f"({found['cpu_ratio']:.1f}x)"
                if found
                else "-"
            )
        mine = recorded[last]["cli"].get(name)
        rows.append((title, [*cells, _goal(CLI_GOALS.get(name), mine["seconds"] if mine else None)]))
    floors = [recorded[label]["cli"].get("help") for label in labels]
    rows.append(
        (
            "`python -c pass` (the CLI's yardstick)",
            [f"{_ms(f['floor_seconds'])}" if f else "-" for f in floors] + ["-"],
        )
    )
    table = [header, "|---|" + "---|" * (len(labels) + 1)]
    table += [f"| {title} | " + " | ".join(cells) + " |" for title, cells in rows]
    dates = "; ".join(f"{label}: {recorded[label]['measured']}" for label in labels)
    return "\n".join(
        [
            "## Developer loop (bench/devloop_bench.py)",
            "",
            "Whole processes, medians, on a 2-core machine shared with other work. A start is timed from",
            "`make run` until the API answers `GET /api/v1/workers` and until the banner says it is up, with",
            "the CPU its processes used until then and the load average when it began; `before` and `after`",
            "were started in turn, so they met the same load. The CLI is timed in alternating pairs with",
            "`python -c pass` of the same `.venv`: wall and CPU medians, and the medians of the per-pair",
            f"ratios in brackets. Measured {dates}.",
            "",
            *table,
        ]
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench devloop", description=__doc__)
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to measure (`after`)")
    parser.add_argument("--vs", type=Path, default=None, help="a checkout measured in turn (`before`)")
    parser.add_argument("--starts", type=int, default=3, help="restarts of each checkout (default 3)")
    parser.add_argument("--runs", type=int, default=9, help="pairs per CLI figure (default 9)")
    parser.add_argument("--fresh", type=int, default=1, help="first starts on fresh clones, warm caches")
    parser.add_argument("--cold", type=int, default=0, help="first starts on fresh clones, cold caches")
    args = parser.parse_args(argv)
    checkouts = {"after": args.root.resolve()}
    if args.vs is not None:
        checkouts = {"before": args.vs.resolve(), **checkouts}
    measured: dict[str, dict[str, list[Start]]] = {label: {} for label in checkouts}
    cli: dict[str, dict[str, Pairs]] = {}
    plan = [("warm", args.fresh), ("cold", args.cold), ("restart", args.starts)]
    for kind, count in plan:
        for index in range(count):
            for label, root in checkouts.items():
                if kind == "restart":
                    env = {**clean_environment(root), **_ports()}
                    with running(root, env) as start:
                        if index == count - 1:
                            cli[label] = cli_figures(root, env, args.runs)
                else:
                    start = fresh_start(root, cold=kind == "cold")
                measured[label].setdefault(kind, []).append(start)
                print(
                    f"{label} {kind}: API {start.api_seconds:.1f} s, up {start.up_seconds:.1f} s, "
                    f"{start.cpu_seconds:.1f} s CPU, load {start.load:.1f}, stop {start.stop_seconds:.1f} s",
                    flush=True,
                )
                print(_tail(start.lines, 12), flush=True)
    recorded: dict[str, Any] = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    for label, root in checkouts.items():
        previous = recorded.get(label, {})
        summaries = {kind: _summary(group) for kind, group in measured[label].items()}
        recorded[label] = {
            "commit": _commit(root),
            "measured": datetime.now(UTC).strftime("%Y-%m-%d"),
            # What this run did not measure stays as the last run measured it.
            "starts": {**previous.get("starts", {}), **{k: v for k, v in summaries.items() if v}},
            "cli": {**previous.get("cli", {}), **{k: vars(v) for k, v in cli.get(label, {}).items()}},
        }
    RESULTS.mkdir(exist_ok=True)
    FIGURES.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    SECTION.write_text(render(recorded) + "\n")
    print(render(recorded))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
