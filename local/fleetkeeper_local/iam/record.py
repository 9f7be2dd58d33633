"""The request record: what the functions asked AWS for, and what the evaluator decided.

A `Summary` is plain data, so test processes, `make run` and its API instance processes can each keep
one, write it as JSON and merge them: the verdict and docs/security.md come from the merged record.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetkeeper_local.iam.attribution import FUNCTIONS


@dataclass
class Summary:
    """Counts, denials and the grant each allowed call used, by function."""

    requests: int = 0  # requests evaluated
    denied_requests: int = 0
    by_function: Counter[str] = field(default_factory=Counter)
    # function|action|resource -> {function, action, resource, operation, why, path, count}
    denials: dict[str, dict[str, Any]] = field(default_factory=dict)
    # function|service:operation -> {function, operation, error, count}: requests no model covers
    unmodelled: dict[str, dict[str, Any]] = field(default_factory=dict)
    # function|service:operation -> count: requests on resources the emulator does not know
    missing: Counter[str] = field(default_factory=Counter)
    # function|action|statement -> the code paths that needed that grant
    usage: dict[str, set[str]] = field(default_factory=dict)
    # What the evaluation cost: CPU seconds in the recorder's hooks and in the evaluator process, and
    # how many evaluations reached the evaluator (the rest were answered from its cache).
    cost: dict[str, float] = field(default_factory=dict)

    @property
    def functions(self) -> list[str]:
        return sorted(self.by_function)

    @property
    def uncovered(self) -> list[str]:
        return [function for function in FUNCTIONS if function not in self.by_function]

    @property
    def failed(self) -> bool:
        return bool(self.denied_requests or self.unmodelled)

    def allowed(self, function: str, action: str, statement: str, path: str) -> None:
        self.usage.setdefault(f"{function}|{action}|{statement}", set()).add(path)

    def deny(
        self,
        function: str,
        action: str,
        resource: str,
        *,
        operation: str,
        why: str,
        path: str,
        context: str,
        during: str = "",
    ) -> None:
        key = f"{function}|{action}|{resource}"
        found = self.denials.setdefault(
            key,
            {
                "function": function,
                "action": action,
                "resource": resource,
                "operation": operation,
                "why": why,
                "path": path,
                "context": context,
                "during": during,
                "count": 0,
            },
        )
        found["count"] += 1

    def not_modelled(self, function: str, operation: str, error: str) -> None:
        found = self.unmodelled.setdefault(
            f"{function}|{operation}",
            {"function": function, "operation": operation, "error": error, "count": 0},
        )
        found["count"] += 1

    def add_cost(self, key: str, value: float) -> None:
        self.cost[key] = self.cost.get(key, 0.0) + value

    def merge(self, other: Summary) -> None:
        self.requests += other.requests
        self.denied_requests += other.denied_requests
        self.by_function.update(other.by_function)
        for key, denial in other.denials.items():
            mine = self.denials.setdefault(key, {**denial, "count": 0})
            mine["count"] += denial["count"]
        for key, entry in other.unmodelled.items():
            mine = self.unmodelled.setdefault(key, {**entry, "count": 0})
            mine["count"] += entry["count"]
        self.missing.update(other.missing)
        for key, paths in other.usage.items():
            self.usage.setdefault(key, set()).update(paths)
        for key, value in other.cost.items():
            self.add_cost(key, value)

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "denied_requests": self.denied_requests,
            "by_function": dict(self.by_function),
            "denials": self.denials,
            "unmodelled": self.unmodelled,
            "missing": dict(self.missing),
            "usage": {key: sorted(paths) for key, paths in self.usage.items()},
            "cost": dict(self.cost),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Summary:
        return cls(
            requests=int(data.get("requests", 0)),
            denied_requests=int(data.get("denied_requests", 0)),
            by_function=Counter(data.get("by_function", {})),
            denials=dict(data.get("denials", {})),
            unmodelled=dict(data.get("unmodelled", {})),
            missing=Counter(data.get("missing", {})),
            usage={key: set(paths) for key, paths in data.get("usage", {}).items()},
            cost={key: float(value) for key, value in data.get("cost", {}).items()},
        )

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), sort_keys=True), encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> Summary:
        return cls.from_json(json.loads(path.read_text(encoding="utf-8")))

    def headline(self) -> str:
        return (
            f"IAM: {self.requests} recorded requests evaluated for {len(self.by_function)} functions, "
            f"{self.denied_requests} denied"
        )

    def report(self) -> list[str]:
        """The headline, then each denial and each request no model covers."""
        lines = [self.headline()]
        if self.cost:
            lines.append(
                f"  cost: {self.cost.get('hook_cpu_seconds', 0):.1f} s CPU in the recorder, "
                f"{self.cost.get('evaluator_cpu_seconds', 0):.1f} s in the evaluator, "
                f"{int(self.cost.get('evaluations', 0))} evaluations for {self.requests} requests"
            )
        for denial in sorted(
            self.denials.values(), key=lambda d: (d["function"], d["action"], d["resource"])
        ):
            lines.append(
                f"  DENIED {denial['function']}: {denial['action']} on {denial['resource']} "
                f"({denial['operation']} from {denial['path']}, {denial['count']}x): {denial['why']}; "
                f"context {denial.get('context') or '{}'}"
                + (f"; first during {denial['during']}" if denial.get("during") else "")
            )
        for entry in sorted(self.unmodelled.values(), key=lambda e: (e["function"], e["operation"])):
            where = f"{entry['function']}: {entry['operation']} ({entry['count']}x)"
            lines.append(f"  UNMODELLED {where}: {entry['error']}")
        if self.missing:
            skipped = ", ".join(
                f"{key.replace('|', ' ')} {count}x" for key, count in sorted(self.missing.items())
            )
            lines.append(f"  not evaluated, the resource does not exist (AWS answers NotFound): {skipped}")
        return lines
