"""The shared layer's asset: our own package, staged with its bytecode.

Lambda extracts layers under the read-only /opt, so a module that ships without bytecode is compiled
again on every cold start: about 80 ms of CPU for the api handler's share of this package. The asset is
a copy of layers/fleetkeeper/python with each module's bytecode beside it, built once per content of
the sources (build/shared-layer/<key>), so a stale build can never be picked up.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Final

from infra.dependencies import LAMBDA_PYTHON, ROOT, publish_build

SOURCE: Final = ROOT / "layers" / "fleetkeeper" / "python"
SHARED_LAYER_BUILD_DIR: Final = ROOT / "build" / "shared-layer"
# Bump when the way the asset is built changes, so a build by the old recipe is not reused.
SHARED_LAYER_RECIPE: Final = "1"
# Local caches and build leftovers never ship.
_LEFTOVERS: Final = ("__pycache__", "*.pyc", "*.egg-info", ".mypy_cache", ".pytest_cache")


def _sources() -> list[Path]:
    return sorted(
        path
        for path in SOURCE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    )


def shared_layer_key() -> str:
    """Names one build: the package's files (names and bytes), the runtime and the recipe."""
    digest = hashlib.sha256()
    for part in (LAMBDA_PYTHON.encode(), SHARED_LAYER_RECIPE.encode()):
        digest.update(hashlib.sha256(part).digest())
    for path in _sources():
        digest.update(hashlib.sha256(path.relative_to(SOURCE).as_posix().encode()).digest())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def shared_layer_dir() -> Path:
    """The shared layer's asset directory (it holds `python/`), staged from the sources if missing."""
    target = SHARED_LAYER_BUILD_DIR / shared_layer_key()
    if target.is_dir():
        return target
    publish_build(
        target,
        lambda site: shutil.copytree(SOURCE, site, ignore=shutil.ignore_patterns(*_LEFTOVERS)),
    )
    return target
