"""What the tests run is what deploys: the locks, the virtualenv, the dependency layer and the runtime agree.

The layer checks read the assets of the synthesized stack, i.e. what `cdk deploy` uploads.
"""

from __future__ import annotations

import ast
import importlib.metadata
import marshal
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import Marker

from infra.dependencies import (
    DEV_LOCK,
    LAMBDA_LAYER_PYTHON_PATH,
    LAMBDA_PYTHON,
    LAMBDA_UNZIPPED_LIMIT_BYTES,
    ROOT,
    Pin,
    canonical_name,
    lambda_pins,
    layer_distributions,
    read_pins,
    stale_locks,
    tree_size,
)
from infra.deps_report import REPORT, expected_report
from tests.infra.conftest import Synthesized
from tests.infra.helpers import properties, resources

# Installed in the virtualenv but not from the lock: the project itself, and what `python -m venv` seeds
# (pip, which only bootstraps uv; setuptools on Python 3.11), which `uv pip sync` leaves alone.
NOT_LOCKED = {"fleetkeeper", "pip", "setuptools"}
# The environment markers of the Lambda platform the layer is resolved for.
LAMBDA_ENVIRONMENT = {
    "python_version": LAMBDA_PYTHON,
    "python_full_version": f"{LAMBDA_PYTHON}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "aarch64",
    "os_name": "posix",
}
SHIPPED_CODE = (ROOT / "layers" / "fleetkeeper" / "python", ROOT / "functions")


def applies(pin: Pin, environment: dict[str, str] | None = None) -> bool:
    return pin.marker is None or Marker(pin.marker).evaluate(environment)


def layer_assets(synthesized: Synthesized, template: Any) -> dict[str, Path]:
    """Each layer's asset directory in the cloud assembly, by the layer's description."""
    return {
        layer["Description"]: synthesized.outdir / ("asset." + layer["Content"]["S3Key"].removesuffix(".zip"))
        for layer in properties(template, "AWS::Lambda::LayerVersion")
    }


@pytest.fixture(scope="module")
def dependency_layer(synthesized: Synthesized, dev: Any) -> Path:
    (asset,) = [
        path
        for description, path in layer_assets(synthesized, dev).items()
        if description.startswith("fleetkeeper third-party dependencies")
    ]
    return asset


@pytest.mark.slow
def test_given_pyproject_when_the_locks_are_resolved_again_then_they_are_unchanged():
    assert stale_locks() == [], "pyproject.toml and the lock disagree: run `make lock` and commit the result"


def test_given_the_lambda_lock_then_the_dev_lock_pins_each_of_its_packages_at_the_same_version():
    dev = read_pins(DEV_LOCK)
    for name, version in lambda_pins().items():
        for_lambda = [pin.version for pin in dev.get(name, []) if applies(pin, LAMBDA_ENVIRONMENT)]
        assert for_lambda == [version], f"{name}: the layer ships {version}, the tests run {for_lambda}"


def test_given_the_virtualenv_then_it_holds_exactly_the_dev_lock():
    locked = {name: pin.version for name, pins in read_pins(DEV_LOCK).items() for pin in pins if applies(pin)}
    installed = {
        canonical_name(distribution.metadata["Name"]): distribution.version
        for distribution in importlib.metadata.distributions()
    }
    unlocked = NOT_LOCKED - set(locked)
    assert {name: version for name, version in installed.items() if name not in unlocked} == locked, (
        "the virtualenv is not the lock: run `make install`"
    )


def test_given_the_dependency_layer_then_it_ships_exactly_the_lambda_lock_and_the_versions_the_tests_run(
    dependency_layer,
):
    shipped = {name: dist.version for name, dist in layer_distributions(dependency_layer).items()}
    assert shipped == lambda_pins()
    tested = {name: importlib.metadata.version(name) for name in shipped}
    assert shipped == tested


def test_given_the_dependency_layer_then_every_wheel_is_pure_python_or_built_for_the_runtime_on_arm64(
    dependency_layer,
):
    runtime_abi = "cp" + LAMBDA_PYTHON.replace(".", "")
    for distribution in layer_distributions(dependency_layer).values():
        for tag in distribution.wheel_tags:
            python, abi, platform = tag.split("-")
            pure = platform == "any" and abi == "none"
            native = python == runtime_abi and abi in (runtime_abi, "abi3") and platform.endswith("aarch64")
            assert pure or native, f"{distribution.name} ships a {tag} wheel"


def test_given_the_dependency_layer_then_it_holds_only_importable_code_and_no_scripts(dependency_layer):
    assert sorted(path.name for path in dependency_layer.iterdir()) == ["python"]
    assert not (dependency_layer / "python" / "bin").exists()


# The flags word of a .pyc header (PEP 552): bit 0 set = hash-based, bit 1 set = checked against the source.
HASH_BASED, CHECK_SOURCE = 0b01, 0b10


@pytest.mark.parametrize(
    ("layer", "module"),
    [
        ("fleetkeeper third-party dependencies", "aws_lambda_powertools/__init__.py"),
        ("fleetkeeper package", "fleetkeeper/services/drains/commands.py"),
    ],
)
def test_given_each_layer_then_every_module_ships_unchecked_bytecode_for_the_runtime(
    synthesized: Synthesized, dev: Any, layer: str, module: str
) -> None:
    """Lambda's /opt is read-only: a module without bytecode is compiled again on every cold start."""
    (asset,) = [
        path for description, path in layer_assets(synthesized, dev).items() if description.startswith(layer)
    ]
    tag = f"cpython-{LAMBDA_PYTHON.replace('.', '')}"
    sources = list((asset / "python").rglob("*.py"))
    missing = [
        str(source.relative_to(asset))
        for source in sources
        if not (source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc").exists()
    ]
    assert sources
    assert not missing, f"{len(missing)} of {len(sources)} modules ship no {tag} bytecode, e.g. {missing[:5]}"
    for pyc in (asset / "python").rglob(f"*.{tag}.pyc"):
        flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
        assert (flags & HASH_BASED, flags & CHECK_SOURCE) == (HASH_BASED, 0), pyc
    # Modules are named by their deployed path, never by the building machine's (which would also make
    # the layer's bytes differ from one checkout to the next).
    source = asset / "python" / module
    compiled = source.parent / "__pycache__" / f"{source.stem}.{tag}.pyc"
    code = marshal.loads(compiled.read_bytes()[16:])  # noqa: S302 - bytes this build just wrote
    assert code.co_filename == f"{LAMBDA_LAYER_PYTHON_PATH}/{module}"


def test_given_the_shared_layer_then_it_ships_exactly_the_package_sources(
    synthesized: Synthesized, dev: Any
) -> None:
    (asset,) = [
        path
        for description, path in layer_assets(synthesized, dev).items()
        if description.startswith("fleetkeeper package")
    ]
    package = ROOT / "layers" / "fleetkeeper" / "python"
    shipped = {
        p.relative_to(asset / "python")
        for p in (asset / "python").rglob("*")
        if p.is_file() and p.suffix != ".pyc"
    }
    sources = {p.relative_to(package) for p in package.rglob("*") if p.is_file() and p.suffix != ".pyc"}
    assert shipped == sources
    for relative in sources:
        assert (asset / "python" / relative).read_bytes() == (package / relative).read_bytes(), relative


def _third_party_imports(path: Path) -> set[str]:
    """Top-level modules imported at run time (imports under `if TYPE_CHECKING:` never run)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_checking_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and ast.unparse(block.test).endswith("TYPE_CHECKING")
        for statement in block.body
        for node in ast.walk(statement)
    }
    modules = set()
    for node in ast.walk(tree):
        if id(node) in type_checking_only:
            continue
        if isinstance(node, ast.Import):
            modules |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"fleetkeeper", "__future__"}


# Modules the Lambda Python runtime itself provides (its SnapStart restore hooks), so no layer ships them.
RUNTIME_PROVIDED = frozenset({"snapshot_restore_py"})


def test_given_the_shipped_code_then_every_module_it_imports_is_in_the_dependency_layer(dependency_layer):
    site = dependency_layer / "python"
    shipped = {path.name.removesuffix(".py") for path in site.iterdir() if not path.name.endswith("-info")}
    shipped |= RUNTIME_PROVIDED
    for root in SHIPPED_CODE:
        for source in root.rglob("*.py"):
            missing = _third_party_imports(source) - shipped
            assert not missing, f"{source.relative_to(ROOT)} imports {missing}, which no layer ships"


def test_given_each_function_then_its_code_and_layers_fit_the_unzipped_limit(synthesized, dev):
    layers = list(layer_assets(synthesized, dev).values())
    for function in properties(dev, "AWS::Lambda::Function"):
        code = synthesized.outdir / ("asset." + function["Code"]["S3Key"].removesuffix(".zip"))
        assert len(function["Layers"]) == len(layers)
        assert tree_size([code, *layers]) < LAMBDA_UNZIPPED_LIMIT_BYTES


def test_given_the_runtime_then_the_functions_and_layers_run_the_locked_python(dev):
    runtime = f"python{LAMBDA_PYTHON}"
    assert {props["Runtime"] for props in properties(dev, "AWS::Lambda::Function")} == {runtime}
    for layer in resources(dev, "AWS::Lambda::LayerVersion").values():
        assert layer["Properties"]["CompatibleRuntimes"] == [runtime]
        assert layer["Properties"]["CompatibleArchitectures"] == ["arm64"]


def test_given_the_runtime_then_the_tests_run_on_its_python_minor_version():
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    if running != LAMBDA_PYTHON and not os.environ.get("CI"):
        pytest.skip(f"this machine tests on Python {running}, Lambda runs {LAMBDA_PYTHON}; CI enforces it")
    assert running == LAMBDA_PYTHON


def test_given_the_locks_and_the_layer_then_the_dependency_report_is_current():
    assert REPORT.read_text(encoding="utf-8") == expected_report(), "run `make deps-report`"
