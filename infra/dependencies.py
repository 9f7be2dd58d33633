"""Locked dependencies and the Lambda dependency layer built from them: what the tests run is what deploys.

`make lock` resolves pyproject.toml with uv into three hash-pinned requirement files:

- `requirements/lambda.txt`: the runtime dependencies (`[project].dependencies`) for the Lambda platform,
  Python `.python-version` on arm64 Linux, wheels only. The dependency layer is exactly this file.
- `requirements/dev.txt`: everything a developer and CI install (all extras), for every platform, with
  the versions of lambda.txt for the packages both hold. `make install` installs exactly this file.
- `requirements/tools.txt`: the installer (uv, at dev.txt's version) and the build backend of
  `[build-system].requires`, so that bootstrapping and the editable install are hash-checked too.
- `requirements/tool-<name>.txt`: one per entry of `[tool.fleetkeeper.isolated-tools]`, a command-line
  tool that cannot share `.venv` with the runtime pins (checkov, for one, pins boto3 exactly). `make
  install` gives each its own virtualenv under `.tools/<name>`; `tool_executable(name)` finds it.

Re-resolving keeps every pin the files already hold unless `--upgrade` is given, so `make lock` after an
edit of pyproject.toml changes only what the edit needs. The files name no index: installs use the
installer's configured index, and the hashes make every file byte-for-byte the locked one.

`python -m infra.dependencies lock|check|layer`. Standard library only: it runs in a virtualenv that holds
nothing but uv yet.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parents[1]
PYPROJECT: Final = ROOT / "pyproject.toml"
PYTHON_VERSION_FILE: Final = ROOT / ".python-version"
REQUIREMENTS_DIR: Final = "requirements"
LAMBDA_LOCK: Final = ROOT / REQUIREMENTS_DIR / "lambda.txt"
DEV_LOCK: Final = ROOT / REQUIREMENTS_DIR / "dev.txt"
TOOLS_LOCK: Final = ROOT / REQUIREMENTS_DIR / "tools.txt"
LOCKS: Final = (LAMBDA_LOCK, DEV_LOCK, TOOLS_LOCK)
ISOLATED_LOCK_PREFIX: Final = "tool-"
ISOLATED_TOOLS_DIR: Final = ROOT / ".tools"
# What the lock files' headers name as the way to regenerate them.
LOCK_COMMAND: Final = "make lock"

# The Lambda runtime's Python minor version; .python-version is also what uv and pyenv read.
LAMBDA_PYTHON: Final = PYTHON_VERSION_FILE.read_text(encoding="utf-8").strip()
# Lambda's arm64 Python runtimes run on Amazon Linux 2023 (glibc 2.34), which runs manylinux2014 (glibc
# 2.17) wheels; AWS's own layer-packaging guide names this platform tag.
LAMBDA_PLATFORM: Final = "aarch64-manylinux2014"
# Lambda's limit on a function's unzipped code plus all its layers.
LAMBDA_UNZIPPED_LIMIT_BYTES: Final = 250 * 1024 * 1024

LAYER_BUILD_DIR: Final = ROOT / "build" / "dependency-layer"
# Where Lambda extracts a Python layer's `python/` directory.
LAMBDA_LAYER_PYTHON_PATH: Final = "/opt/python"
# Bump when the way the layer is built changes, so a build by the old recipe is not reused.
LAYER_RECIPE: Final = "3"

_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)\s*(?:;\s*(?P<marker>[^\\]+?))?\s*\\?$"
)


class DependencyError(RuntimeError):
    """The locks or the layer cannot be produced; the message says what to run."""


@dataclass(frozen=True)
class Pin:
    """One `name==version` line of a lock file, with its environment marker if it has one."""

    name: str
    version: str
    marker: str | None


@dataclass(frozen=True)
class Distribution:
    """One distribution installed in the layer, read from its .dist-info."""

    name: str
    version: str
    wheel_tags: tuple[str, ...]
    size_bytes: int


def canonical_name(name: str) -> str:
    """PEP 503 normalisation, so `Typing_Extensions` and `typing-extensions` are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(path: Path) -> dict[str, list[Pin]]:
    """The pins of a lock file by canonical name; a universal lock may pin one name per marker."""
    pins: dict[str, list[Pin]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _PIN.match(line)
        if match:
            pin = Pin(canonical_name(match["name"]), match["version"], match["marker"])
            pins.setdefault(pin.name, []).append(pin)
    return pins


def lambda_pins() -> dict[str, str]:
    """The layer's distributions and versions; the Lambda lock is resolved for one platform, so no markers."""
    return {name: pins[0].version for name, pins in read_pins(LAMBDA_LOCK).items()}


def uv_executable() -> str:
    """The uv that `make install` put beside this interpreter, else one on PATH."""
    beside = Path(sys.executable).parent / "uv"
    if beside.is_file():
        return str(beside)
    found = shutil.which("uv")
    if found is None:
        raise DependencyError("uv is not installed: run `make install`, which installs it into .venv")
    return found


def _run(command: Sequence[str], cwd: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        raise DependencyError(f"`{' '.join(command)}` failed:\n{result.stderr.strip()}")


def _pyproject(root: Path) -> dict[str, Any]:
    parsed: dict[str, Any] = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return parsed


def _oldest_python(root: Path) -> str:
    """The lowest Python that `requires-python` admits: a universal lock covers it and every newer one.

    Named explicitly because uv otherwise starts from whatever interpreter it finds first."""
    requires = _pyproject(root)["project"]["requires-python"]
    match = re.fullmatch(r"\s*>=\s*(\d+\.\d+)\s*", requires)
    if match is None:
        raise DependencyError(f"requires-python must read '>=X.Y' for the lock, not {requires!r}")
    return match[1]


def compile_locks(root: Path = ROOT, *, upgrade: bool = False) -> None:
    """Resolve pyproject.toml under `root` into the three lock files there (relative paths: they are
    written into the files' annotations, which must not depend on where the repository lies)."""
    uv = uv_executable()
    common = ["pip", "compile", "--quiet", "--generate-hashes", "--custom-compile-command", LOCK_COMMAND]
    if upgrade:
        common.append("--upgrade")
    universal = ["--universal", "--python-version", _oldest_python(root)]
    lambda_lock, dev_lock, tools_lock = (f"{REQUIREMENTS_DIR}/{lock.name}" for lock in LOCKS)
    (root / REQUIREMENTS_DIR).mkdir(exist_ok=True)
    _run(
        [
            uv,
            *common,
            "pyproject.toml",
            "--python-version",
            LAMBDA_PYTHON,
            "--python-platform",
            LAMBDA_PLATFORM,
            # The layer is installed from wheels for another CPU: nothing may need building.
            "--only-binary",
            ":all:",
            "--output-file",
            lambda_lock,
        ],
        root,
    )
    _run(
        [
            uv,
            *common,
            "pyproject.toml",
            "--all-extras",
            *universal,
            "--constraints",
            lambda_lock,
            "--output-file",
            dev_lock,
        ],
        root,
    )
    uv_pins = read_pins(root / dev_lock).get("uv")
    if not uv_pins:
        raise DependencyError("the dev extra must name uv: `make install` installs with it")
    tools = [*_pyproject(root)["build-system"]["requires"], f"uv=={uv_pins[0].version}"]
    inputs = {tools_lock: tools}
    isolated = _pyproject(root).get("tool", {}).get("fleetkeeper", {}).get("isolated-tools", {})
    for name, requirements in isolated.items():
        inputs[f"{REQUIREMENTS_DIR}/{ISOLATED_LOCK_PREFIX}{name}.txt"] = list(requirements)
    for old in (root / REQUIREMENTS_DIR).glob(f"{ISOLATED_LOCK_PREFIX}*.txt"):
        if f"{REQUIREMENTS_DIR}/{old.name}" not in inputs:
            old.unlink()
    with tempfile.TemporaryDirectory() as scratch:
        for output, requirements in inputs.items():
            source = Path(scratch) / "requirements.in"
            source.write_text("\n".join(requirements) + "\n", encoding="utf-8")
            _run([uv, *common, *universal, "--no-annotate", str(source), "--output-file", output], root)


def isolated_locks(root: Path = ROOT) -> list[Path]:
    return sorted((root / REQUIREMENTS_DIR).glob(f"{ISOLATED_LOCK_PREFIX}*.txt"))


def install_isolated_tools() -> None:
    """Each isolated tool's lock, exactly, into its own virtualenv on this interpreter."""
    uv = uv_executable()
    for lock in isolated_locks():
        target = ISOLATED_TOOLS_DIR / lock.stem.removeprefix(ISOLATED_LOCK_PREFIX)
        if not (target / "bin" / "python").exists():
            _run([uv, "venv", "--quiet", "--python", sys.executable, str(target)], ROOT)
        _run(
            [
                uv,
                "pip",
                "sync",
                "--quiet",
                "--require-hashes",
                "--compile-bytecode",
                "--python",
                str(target / "bin" / "python"),
                str(lock),
            ],
            ROOT,
        )


def tool_executable(name: str) -> Path:
    """The command of an isolated tool, installed by `make install`."""
    path = ISOLATED_TOOLS_DIR / name / "bin" / name
    if not path.exists():
        raise DependencyError(f"{name} is not installed: run `make install`")
    return path


def stale_locks() -> list[str]:
    """The lock files that `make lock` would change: the lock disagrees with pyproject.toml."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch)
        shutil.copy2(PYPROJECT, copy / PYPROJECT.name)
        shutil.copy2(PYTHON_VERSION_FILE, copy / PYTHON_VERSION_FILE.name)
        (copy / REQUIREMENTS_DIR).mkdir()
        committed = [lock for lock in (*LOCKS, *isolated_locks()) if lock.exists()]
        for lock in committed:
            shutil.copy2(lock, copy / REQUIREMENTS_DIR / lock.name)
        compile_locks(copy)
        resolved = {lock.name: lock.read_bytes() for lock in (copy / REQUIREMENTS_DIR).glob("*.txt")}
        current = {lock.name: lock.read_bytes() for lock in committed}
        return sorted(
            f"{REQUIREMENTS_DIR}/{name}"
            for name in resolved.keys() | current.keys()
            if resolved.get(name) != current.get(name)
        )


def layer_key() -> str:
    """Names one build of the layer: the Lambda lock, the target and the recipe decide its contents."""
    digest = hashlib.sha256()
    for part in (
        LAMBDA_LOCK.read_bytes(),
        LAMBDA_PYTHON.encode(),
        LAMBDA_PLATFORM.encode(),
        LAYER_RECIPE.encode(),
    ):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()[:16]


def layer_dir() -> Path:
    """The dependency layer's asset directory (it holds `python/`), built from the Lambda lock if missing."""
    target = LAYER_BUILD_DIR / layer_key()
    if not target.is_dir():
        build_layer(target)
    return target


def build_layer(target: Path) -> None:
    """Install requirements/lambda.txt for the Lambda platform into `target`/python, from wheels only."""

    def install(site: Path) -> None:
        _run(
            [
                uv_executable(),
                "pip",
                "install",
                "--quiet",
                "--require-hashes",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--python-version",
                LAMBDA_PYTHON,
                "--python-platform",
                LAMBDA_PLATFORM,
                # Copies, not links into uv's cache: the asset must not change when the cache does.
                "--link-mode",
                "copy",
                "--target",
                str(site),
                "--requirement",
                str(LAMBDA_LOCK),
            ],
            ROOT,
        )
        _drop_scripts(site)

    publish_build(target, install)


def publish_build(target: Path, fill: Callable[[Path], object]) -> None:
    """Build an asset directory (`target`/python, with its bytecode) so that nobody ever sees half of it.

    `fill` writes the site into a staging directory beside `target`, which is then renamed into place:
    a build killed halfway leaves only its staging directory, never a `target` that looks complete.
    Builds of other keys in the same directory are removed once this one is in place.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        fill(staging / "python")
        compile_bytecode(staging / "python")
        try:
            staging.rename(target)
        except OSError:
            # Another process (a parallel synth) built the same key first; its build is the same bytes.
            if not target.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for old in target.parent.iterdir():
        if old.is_dir() and old != target and not old.name.startswith("."):
            shutil.rmtree(old, ignore_errors=True)


def compile_bytecode(site: Path) -> None:
    """Ship the layer's bytecode. /opt is read-only on Lambda, so without it every cold start compiles
    each module it imports, again. Hash-based and unchecked: the zip does not keep the sources' mtimes,
    which a timestamp-based .pyc would be checked against, need not survive the upload."""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running != LAMBDA_PYTHON:
        # Bytecode is per minor version: Python 3.x's would be dead weight on the runtime's.
        print(
            f"WARNING: the layer ships no bytecode: it is built by Python {running}, not {LAMBDA_PYTHON}",
            file=sys.stderr,
        )
        return
    _run(
        [
            sys.executable,
            "-m",
            "compileall",
            "-q",
            "-j",
            "0",
            "--invalidation-mode",
            "unchecked-hash",
            # Name each module by where Lambda extracts the layer, not by this build's directory: the
            # bytes then depend on the lock alone, and tracebacks show the deployed path.
            "-s",
            str(site),
            "-p",
            LAMBDA_LAYER_PYTHON_PATH,
            str(site),
        ],
        ROOT,
    )


def _drop_scripts(site: Path) -> None:
    """Console scripts carry the building machine's interpreter path and are never run on Lambda: drop
    them and their RECORD lines, so the layer's bytes depend on the lock alone."""
    shutil.rmtree(site / "bin", ignore_errors=True)
    for record in site.glob("*.dist-info/RECORD"):
        lines = record.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if not line.startswith("bin/")]
        if kept != lines:
            record.write_text("".join(kept), encoding="utf-8")


def _metadata_fields(path: Path, field: str) -> list[str]:
    prefix = f"{field}: "
    values = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line:  # the headers end at the first blank line; the long description follows
            break
        if line.startswith(prefix):
            values.append(line[len(prefix) :].strip())
    return values


def layer_distributions(layer: Path) -> dict[str, Distribution]:
    """The distributions installed under `layer`/python, by canonical name, with their unzipped sizes."""
    site = layer / "python"
    distributions: dict[str, Distribution] = {}
    for info in sorted(site.glob("*.dist-info")):
        size = 0
        for line in (info / "RECORD").read_text(encoding="utf-8").splitlines():
            relative = line.rsplit(",", 2)[0]
            installed = site / relative
            if relative and installed.is_file():
                size += installed.stat().st_size
        name = canonical_name(_metadata_fields(info / "METADATA", "Name")[0])
        distributions[name] = Distribution(
            name=name,
            version=_metadata_fields(info / "METADATA", "Version")[0],
            wheel_tags=tuple(_metadata_fields(info / "WHEEL", "Tag")),
            size_bytes=size,
        )
    return distributions


def tree_size(paths: Iterable[Path]) -> int:
    """Unzipped bytes of every file under the given directories, as Lambda counts them."""
    return sum(file.stat().st_size for path in paths for file in path.rglob("*") if file.is_file())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.dependencies", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lock = commands.add_parser("lock", help="resolve pyproject.toml into requirements/*.txt")
    lock.add_argument("--upgrade", action="store_true", help="move every pin to the newest allowed version")
    commands.add_parser("check", help="fail when the lock files disagree with pyproject.toml")
    commands.add_parser("layer", help="build the Lambda dependency layer from requirements/lambda.txt")
    commands.add_parser("isolated-tools", help="install each requirements/tool-<name>.txt into .tools/<name>")
    args = parser.parse_args(argv)
    try:
        if args.command == "lock":
            compile_locks(upgrade=args.upgrade)
        elif args.command == "check":
            stale = stale_locks()
            if stale:
                print(
                    f"{', '.join(stale)} disagree with pyproject.toml: "
                    f"run `{LOCK_COMMAND}` and commit the result",
                    file=sys.stderr,
                )
                return 1
        elif args.command == "isolated-tools":
            install_isolated_tools()
        else:
            print(os.path.relpath(layer_dir(), ROOT))
    except DependencyError as exc:
        print(exc, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
