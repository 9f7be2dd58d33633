"""The request record: what the functions asked AWS for, and what the evaluator decided.

A `Summary` is plain data, so test processes, `make run` and its API instance processes can each keep
one, write it as JSON and merge them: the verdict and docs/security.md come from the merged record.

Every request the recorder sees ends in one `Outcome`: set-up (no function's, not evaluated), allowed or
denied, or one the evaluation could not decide, each of which fails the run: unattributed (fleetkeeper's
code on a thread that lost its invocation), unmodelled (no translation into what AWS authorizes), missing
(a resource the emulator does not know, so the conditions on it cannot be decided) or an evaluator error.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from fleetkeeper_local.iam.attribution import FUNCTIONS, SETUP, UNATTRIBUTED
from fleetkeeper_local.iam.evaluator import Decision
from fleetkeeper_local.iam.requests import Authorization

ALLOWED: Final = "allowed"
DENIED: Final = "denied"
UNMODELLED: Final = "unmodelled"
MISSING: Final = "missing"
ERROR: Final = "evaluator error"
# What the report says of each outcome that fails the run without a decision.
_UNDECIDED: Final = {
    UNATTRIBUTED: "UNATTRIBUTED",
    UNMODELLED: "UNMODELLED",
    MISSING: "MISSING RESOURCE",
    ERROR: "EVALUATOR ERROR",
}


@dataclass(frozen=True)
class Outcome:
    """What became of one request: its kind, the evaluator's decisions, or why there are none."""

    kind: str
    decisions: tuple[tuple[Authorization, Decision], ...] = ()
    error: str = ""

    @property
    def denied(self) -> list[tuple[Authorization, Decision]]:
        return [(one, decision) for one, decision in self.decisions if not decision.allowed]


@dataclass
class Summary:
    """Counts, denials and the grant each allowed call used, by function."""

    requests: int = 0  # requests evaluated
    denied_requests: int = 0
    by_function: Counter[str] = field(default_factory=Counter)
    # function|action|resource -> {function, action, resource, operation, why, path, count}
    denials: dict[str, dict[str, Any]] = field(default_factory=dict)
    # kind|function|service:operation -> {kind, function, operation, error, path, during, count}: the
    # requests no decision was reached for (every kind in _UNDECIDED)
    undecided: dict[str, dict[str, Any]] = field(default_factory=dict)
    setup: int = 0  # requests of the tests' and the local stack's own, not evaluated
    recorders: int = 0  # recorders that were on (one a process), so a silent one is told from none
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
    def silent(self) -> bool:
        """A recorder was on and evaluated nothing: it proves no grant, and may be broken."""
        return bool(self.recorders) and not self.requests

    @property
    def failed(self) -> bool:
        return bool(self.denied_requests or self.undecided or self.silent)

    def record(self, function: str, operation: str, outcome: Outcome, *, path: str, during: str) -> None:
        """Count one request's outcome (the one place each kind is counted)."""
        if outcome.kind == SETUP:
            self.setup += 1
            return
        if outcome.kind in _UNDECIDED:
            found = self.undecided.setdefault(
                f"{outcome.kind}|{function}|{operation}",
                {
                    "kind": outcome.kind,
                    "function": function,
                    "operation": operation,
                    "error": outcome.error,
                    "path": path,
                    "during": during,
                    "count": 0,
                },
            )
            found["count"] += 1
            return
        self.requests += 1
        self.by_function[function] += 1
        for one, decision in outcome.decisions:
            for statement in decision.grants or ("?",):
                if decision.allowed:
                    self.usage.setdefault(f"{function}|{one.action}|{statement}", set()).add(path)
        for one, decision in outcome.denied:
            self.deny(
                function,
                one.action,
                one.resource,
                operation=operation,
                why="; ".join(decision.denials),
                path=path,
                context=json.dumps(dict(one.context), sort_keys=True, default=list),
                during=during,
            )
        if outcome.kind == DENIED:
            self.denied_requests += 1

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

    def add_cost(self, key: str, value: float) -> None:
        self.cost[key] = self.cost.get(key, 0.0) + value

    def merge(self, other: Summary) -> None:
        self.requests += other.requests
        self.denied_requests += other.denied_requests
        self.by_function.update(other.by_function)
        for key, denial in other.denials.items():
            mine = self.denials.setdefault(key, {**denial, "count": 0})
            mine["count"] += denial["count"]
        for key, entry in other.undecided.items():
            mine = self.undecided.setdefault(key, {**entry, "count": 0})
            mine["count"] += entry["count"]
        self.setup += other.setup
        self.recorders += other.recorders
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
            "undecided": self.undecided,
            "setup": self.setup,
            "recorders": self.recorders,
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
            undecided=dict(data.get("undecided", {})),
            setup=int(data.get("setup", 0)),
            recorders=int(data.get("recorders", 0)),
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
        """The headline, then each denial and each request no decision was reached for."""
        lines = [self.headline()]
        if self.cost or self.setup:
            lines.append(
                f"  cost: {self.cost.get('hook_cpu_seconds', 0):.1f} s CPU in the recorder, "
                f"{self.cost.get('evaluator_cpu_seconds', 0):.1f} s in the evaluator, "
                f"{int(self.cost.get('evaluations', 0))} evaluations for {self.requests} requests; "
                f"{self.setup} set-up requests of the tests and the local stack not evaluated"
            )
        if self.silent:
            lines.append(
                f"  NOTHING EVALUATED: {self.recorders} recorder(s) were on and evaluated no function's "
                "request, which proves no grant (FLEETKEEPER_LOCAL_IAM=off runs tests without the recorder)"
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
        for entry in sorted(
            self.undecided.values(), key=lambda e: (e["kind"], e["function"], e["operation"])
        ):
            lines.append(
                f"  {_UNDECIDED[entry['kind']]} {entry['function']}: {entry['operation']} "
                f"(from {entry['path']}, {entry['count']}x): {entry['error']}"
                + (f"; first during {entry['during']}" if entry.get("during") else "")
            )
        return lines
