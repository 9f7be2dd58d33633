"""A real IAM evaluator: @cloud-copilot/iam-simulate in one long-lived node process, decisions cached.

The process speaks JSON lines (simulate.mjs). A policy set is sent once and then named by each request,
and every decision is cached by (policy set, principal, action, resource, context, resource policy), so
the thousands of identical requests a test run makes cost one evaluation each.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

SCRIPT = Path(__file__).with_name("simulate.mjs")

ContextValue = str | tuple[str, ...]
Context = tuple[tuple[str, ContextValue], ...]


class EvaluatorError(RuntimeError):
    """The evaluator cannot run, or could not evaluate a request (the message says why)."""


@dataclass(frozen=True)
class Decision:
    """The evaluator's answer for one action on one resource."""

    result: str  # Allowed | ImplicitlyDenied | ExplicitlyDenied
    grants: tuple[str, ...] = ()  # "policy#statement" of each statement that allowed it
    denials: tuple[str, ...] = ()  # why it was denied, in words

    @property
    def allowed(self) -> bool:
        return self.result == "Allowed"


def frozen_context(context: Mapping[str, str | Sequence[str]]) -> Context:
    """A context as a hashable, ordered key for the cache."""
    return tuple(
        sorted((key, value if isinstance(value, str) else tuple(value)) for key, value in context.items())
    )


def _statement(grant: Mapping[str, Any]) -> str:
    where = grant.get("policyIdentifier") or grant.get("policyType", "policy")
    statement = grant.get("statementId") or f"statement {grant.get('statementIndex', '?')}"
    return f"{where}#{statement}"


def _denial(denial: Mapping[str, Any]) -> str:
    kind = {"identity": "identity-based", "resource": "resource-based"}.get(
        str(denial.get("policyType")), str(denial.get("policyType"))
    )
    if denial.get("denialType") == "Explicit":
        return f"an explicit deny in a {kind} policy ({_statement(denial)})"
    return f"no {kind} policy allows it"


def _cpu_seconds(pid: int) -> float:
    """User and system CPU time of a running process (Linux); 0 where /proc cannot tell."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _pipes(process: subprocess.Popen[str]) -> tuple[IO[str], IO[str]]:
    if process.stdin is None or process.stdout is None:
        raise EvaluatorError("the evaluator process has no pipes")
    return process.stdin, process.stdout


class Evaluator:
    """One node process running simulate.mjs; thread-safe, one request at a time."""

    def __init__(self, script: Path = SCRIPT) -> None:
        self._script = script
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._sets: dict[str, str] = {}  # policy set id -> its `policies` line, replayed after a restart
        self._cache: dict[tuple[Any, ...], Decision] = {}
        self._seq = 0
        self.evaluations = 0  # requests that reached the process (cache misses)
        self.cpu_seconds = 0.0  # CPU the evaluator processes used, counted when each one ends

    def _start(self) -> subprocess.Popen[str]:
        node = shutil.which("node")
        if node is None:
            raise EvaluatorError("Node.js is required to evaluate IAM policies locally (make install)")
        # Its own session: a Ctrl-C in the terminal must not end it under the requests still in flight
        # while the control plane stops; it ends when its input closes.
        process = subprocess.Popen(  # noqa: S603 - our own script, fixed argv
            [node, str(self._script)],
            cwd=self._script.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            start_new_session=True,
        )
        stdin, _ = _pipes(process)
        for line in self._sets.values():
            stdin.write(line)
        stdin.flush()
        atexit.register(self.close)
        return process

    def define(self, set_id: str, identity: Sequence[Mapping[str, Any]], resource: Mapping[str, Any]) -> None:
        """Make a policy set known under `set_id` (once; later calls with the same id are free)."""
        with self._lock:
            if set_id in self._sets:
                return
            line = json.dumps(
                {"op": "policies", "id": set_id, "identity": list(identity), "resource": dict(resource)}
            )
            self._sets[set_id] = line + "\n"
            if self._process is not None:
                stdin, _ = _pipes(self._process)
                stdin.write(line + "\n")
                stdin.flush()

    def evaluate(
        self,
        set_id: str,
        *,
        principal: str,
        action: str,
        resource: str,
        account: str,
        context: Mapping[str, str | Sequence[str]],
        identity: Sequence[str] | None = None,
        resource_policy: str | None = None,
    ) -> Decision:
        """Allowed or denied, from the policy set's identity policies (all, or those named) and the
        named resource policy."""
        frozen = frozen_context(context)
        key = (set_id, principal, action, resource, account, frozen, tuple(identity or ()), resource_policy)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                return cached
            if set_id not in self._sets:
                raise EvaluatorError(f"policy set {set_id!r} was never defined")
            self._seq += 1
            message = {
                "op": "evaluate",
                "seq": self._seq,
                "policies": set_id,
                "identity": list(identity) if identity is not None else None,
                "resourcePolicy": resource_policy,
                "principal": principal,
                "action": action,
                "resource": resource,
                "account": account,
                "context": {k: v if isinstance(v, str) else list(v) for k, v in frozen},
            }
            answer = self._ask(message)
            self.evaluations += 1
            if answer.get("result") == "Error":
                raise EvaluatorError(f"{action} on {resource}: {answer.get('error')}")
            decision = Decision(
                result=str(answer["result"]),
                grants=tuple(_statement(g) for g in answer.get("grants") or ()),
                denials=tuple(_denial(d) for d in answer.get("denials") or ()),
            )
            self._cache[key] = decision
            return decision

    def _ask(self, message: Mapping[str, Any]) -> dict[str, Any]:
        if self._process is None or self._process.poll() is not None:
            self._process = self._start()
        stdin, stdout = _pipes(self._process)
        stdin.write(json.dumps(message) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise EvaluatorError(f"the evaluator process exited with code {self._process.poll()}")
        answer: dict[str, Any] = json.loads(line)
        if answer.get("seq") != message["seq"]:
            raise EvaluatorError(f"the evaluator answered request {answer.get('seq')}, not {message['seq']}")
        return answer

    def close(self) -> None:
        with self._lock:
            process, self._process = self._process, None
        if process is None:
            return
        self.cpu_seconds += _cpu_seconds(process.pid)
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stdout is not None:
            process.stdout.close()
