"""Which Lambda function is making the current AWS request.

The local invocation paths (invocation.invoke, the in-process Lambda dispatcher, the API adapter) run
each handler inside `acting_as(function)`; `as_function` does the same for a direct call. The value is a
context variable, so it follows the call into threads that copy the context (fleetkeeper.pool) and
never leaks into the emulators' own threads.

A request made outside any of them is attributed by its call stack (`attribute`): to the function whose
own code its caller entered fleetkeeper through. Entered through the code the functions share, or not
through fleetkeeper at all, it is set-up when the project's code that does not ship (tests/, local/,
bench/, cli/) made it, or a context-copying pool's task; fleetkeeper's code alone, on a thread that lost
its invocation's context, is unattributed.

A function's own code is derived from functions/<name>/handler.py (`own_code`): each module defining a
name its handler imports that no other handler does, widened to the largest package nothing outside it
imports. services/reconcile/ is the reconciler's; of the drains package, which the api and the reconciler
import too, only steps.py is the drain tasks'.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Final, ParamSpec, TypeVar

import fleetkeeper
from fleetkeeper_local.stack import project_root

# The stage's five functions, as their names end: fleetkeeper-<stage>-<function>.
FUNCTIONS: Final = ("api", "drain-tasks", "reconcile", "discover", "ec2-events")

P = ParamSpec("P")
T = TypeVar("T")

ROOT: Final = project_root()
PACKAGE: Final = Path(fleetkeeper.__file__).resolve().parent
# The project's code that is not shipped to Lambda: what it asks AWS for itself is set-up.
NOT_SHIPPED: Final = tuple(f"{ROOT / part}/" for part in ("tests", "local", "bench", "cli"))

_current: ContextVar[str | None] = ContextVar("fleetkeeper_function", default=None)


def function_of(name: str) -> str:
    """`ec2_events`, `fleetkeeper-drain-tasks-1a2b3c4d` or `reconcile` -> the function it names."""
    short = name.replace("_", "-").removeprefix("fleetkeeper-")
    for function in sorted(FUNCTIONS, key=len, reverse=True):
        if short == function or short.startswith(f"{function}-"):
            return function
    raise ValueError(f"{name!r} names none of fleetkeeper's functions {FUNCTIONS}")


@contextmanager
def acting_as(function: str | None) -> Iterator[None]:
    """Attribute the AWS requests made inside the block to `function` (None: by their call stack)."""
    token = _current.set(function_of(function) if function is not None else None)
    try:
        yield
    finally:
        _current.reset(token)


def as_function(function: str, call: Callable[P, T]) -> Callable[P, T]:
    """`call`, attributing its AWS requests to `function`, as the function's handler would run it."""
    name = function_of(function)

    @functools.wraps(call)
    def attributed(*args: P.args, **kwargs: P.kwargs) -> T:
        with acting_as(name):
            return call(*args, **kwargs)

    return attributed


# ---- attribution by the call stack ------------------------------------------------------------------


@functools.cache
def _module_path(module: str) -> Path | None:
    """Where a fleetkeeper module or package lives (its directory for a package), if it exists."""
    path = PACKAGE.parent.joinpath(*module.split("."))
    if path.is_dir():
        return path
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


@functools.cache
def _source(module: str) -> ast.Module:
    path = _module_path(module)
    if path is None:
        return ast.Module(body=[], type_ignores=[])
    return ast.parse((path / "__init__.py" if path.is_dir() else path).read_text(encoding="utf-8"))


@functools.cache
def defining_module(module: str, name: str) -> str:
    """The fleetkeeper module that defines `name` as `module` exports it (through re-exports), or the
    module `module.name` when that is one."""
    if _module_path(f"{module}.{name}") is not None:
        return f"{module}.{name}"
    for node in _source(module).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("fleetkeeper."):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return defining_module(str(node.module), alias.name)
    return module


def _import_statements(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth (a function may import lazily), without walking expressions."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            pending.extend(getattr(node, field, ()))


def imported(tree: ast.Module) -> set[str]:
    """The fleetkeeper modules a module's source imports, each name to the module defining it."""
    found: set[str] = set()
    for node in _import_statements(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("fleetkeeper."))
        elif (node.module or "").startswith("fleetkeeper."):
            found.update(defining_module(str(node.module), alias.name) for alias in node.names)
    return found


def own_code(handlers: Mapping[str, set[str]], layer: Mapping[str, set[str]]) -> dict[str, str]:
    """Module or package -> the function whose own code it is.

    `handlers` holds what each function's handler imports, `layer` what each module of the layer does.
    A function owns each module its handler imports that no other handler does, widened to the largest
    package that holds no other handler's import and that no module outside it imports.
    """
    owned: dict[str, str] = {}
    for function, modules in handlers.items():
        others = {m for other, found in handlers.items() if other != function for m in found}
        for module in modules - others:
            unit = module
            parts = module.split(".")
            for size in range(len(parts) - 1, 1, -1):
                package = ".".join(parts[:size])

                def inside(name: str, package: str = package) -> bool:
                    return name == package or name.startswith(f"{package}.")

                outside = (found for importer, found in layer.items() if not inside(importer))
                if any(inside(m) for m in others) or any(inside(m) for found in outside for m in found):
                    break
                unit = package
            owned[unit] = function
    return owned


@dataclass(frozen=True)
class Owners:
    """Source path prefixes -> the function whose own code lives there."""

    prefixes: tuple[tuple[str, str], ...]

    def of(self, filename: str) -> str | None:
        for prefix, function in self.prefixes:
            if filename.startswith(prefix):
                return function
        return None


@functools.cache
def owners(root: Path = ROOT) -> Owners:
    """Each function's own code: its handler's directory, and what own_code finds from the imports."""
    handlers: dict[str, set[str]] = {}
    prefixes: list[tuple[str, str]] = []
    for handler in sorted(root.glob("functions/*/handler.py")):
        function = function_of(handler.parent.name)
        handlers[function] = imported(ast.parse(handler.read_text(encoding="utf-8")))
        prefixes.append((f"{handler.parent.resolve()}/", function))
    modules = (".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts) for p in PACKAGE.rglob("*.py"))
    layer = {module: imported(_source(module)) for module in (m.removesuffix(".__init__") for m in modules)}
    for module, function in own_code(handlers, layer).items():
        path = _module_path(module)
        if path is not None:
            prefixes.append((f"{path}/" if path.is_dir() else str(path), function))
    return Owners(tuple(prefixes))


# What `attribute` answers for a request that is no function's.
SETUP: Final = "set-up"
UNATTRIBUTED: Final = "unattributed"
_SHARED: Final = "shared"
_POOL: Final = str(PACKAGE / "pool.py")


@functools.cache
def _kind(filename: str) -> str | None:
    """A frame's file: a function's own code (the function), the rest of fleetkeeper (_SHARED), the
    project's code that does not ship (SETUP), or none of them (the pool's trampoline is none: the
    task it runs is what entered fleetkeeper)."""
    function = owners().of(filename)
    if function is not None:
        return function
    if filename == _POOL:
        return None
    if filename.startswith(f"{PACKAGE}/"):
        return _SHARED
    return SETUP if filename.startswith(NOT_SHIPPED) else None


def attribute(frame: FrameType | None = None) -> str:
    """The function making the current request, or SETUP, or UNATTRIBUTED.

    The function acting (acting_as) if any; else the function whose own code the request entered
    fleetkeeper through (the outermost fleetkeeper frame of the stack). Entered through the code the
    functions share, or not through fleetkeeper at all, it is set-up when code that does not ship made
    it, or a context-copying pool's task (whose submitter acted as no function); fleetkeeper's code
    alone, on a thread that did not copy its invocation's context, is UNATTRIBUTED.
    """
    acting = _current.get()
    if acting is not None:
        return acting
    frame = frame or sys._getframe(1)
    entry: str | None = None
    setup = pooled = False
    while frame is not None:  # from the request outwards
        filename = frame.f_code.co_filename
        kind = _kind(filename)
        if kind == SETUP:
            setup = True
        elif kind is not None:
            entry, setup = kind, False  # only a caller of the entry makes the request set-up
        pooled = pooled or filename == _POOL
        frame = frame.f_back
    if entry not in {None, _SHARED}:
        return str(entry)
    return SETUP if entry is None or setup or pooled else UNATTRIBUTED
