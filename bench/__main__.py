"""`python -m bench [name ...]`: run the benchmarks, print their figures and write bench/results.md.

Each benchmark is a module bench/<name>_bench.py that leaves its Markdown section in
bench/results/<name>.md: either `run() -> str` returns the section and this runner writes it, or
`main(argv) -> int` writes it itself. bench/results.md is all sections in name order, so benchmarks
run separately (`python -m bench reconcile`) still end up in one report.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SECTIONS = HERE / "results"
REPORT = HERE / "results.md"
HEADER = (
    "# fleetkeeper benchmarks\n\n"
    "Measured on the local stack (DynamoDB Local + moto server) on a 2-core machine with `make bench`.\n"
    "Each section is written by its benchmark module (bench/<name>_bench.py).\n"
)


def available() -> list[str]:
    return sorted(p.stem.removesuffix("_bench") for p in HERE.glob("*_bench.py"))


def compose() -> None:
    """bench/results.md from the sections as they are (`python -m bench --compose`): after a section was
    written by a run elsewhere (`make stress` writes its own)."""
    parts = [HEADER] + [p.read_text() for p in sorted(SECTIONS.glob("*.md"))]
    REPORT.write_text("\n".join(parts))
    print(f"wrote {REPORT.relative_to(HERE.parent)}")


def main(argv: list[str]) -> int:
    if argv == ["--compose"]:
        compose()
        return 0
    names = argv or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        print(f"unknown benchmark(s): {', '.join(unknown)}; available: {', '.join(available())}")
        return 2
    SECTIONS.mkdir(exist_ok=True)
    for name in names:
        print(f"== {name}", flush=True)
        module = importlib.import_module(f"bench.{name}_bench")
        if hasattr(module, "run"):
            section: str = module.run()
            (SECTIONS / f"{name}.md").write_text(section.rstrip() + "\n")
            print(section, flush=True)
        elif int(module.main([])) != 0:
            print(f"benchmark {name} failed")
            return 1
    compose()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
