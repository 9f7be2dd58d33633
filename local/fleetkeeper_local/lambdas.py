"""In-process Lambda: moto's Step Functions invokes our real handlers.

moto's Step Functions interpreter calls Lambda over HTTP on the moto server. With `use_docker` off, moto
answers with its simple backend, which only echoes the payload. This module replaces that answer with a
call to the handler registered for the function name, in the moto server's own thread, with a Lambda
context object and the Lambda error contract (`x-amz-function-error` plus `errorType`/`errorMessage`).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import boto3
from moto.awslambda_simple.models import LambdaSimpleBackend
from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils
from moto.stepfunctions.parser.asl.component.state.exec.state_task.service import state_task_service_callback
from moto.stepfunctions.parser.asl.utils.boto_client import boto_client_for

from fleetkeeper.observability import logger
from fleetkeeper_local.faults import InvocationCrashed
from fleetkeeper_local.iam.attribution import acting_as

Handler = Callable[[dict[str, Any], Any], Any]


@dataclass
class LocalLambdaContext:
    """The attributes of the Lambda context object that handlers and Powertools read."""

    function_name: str
    memory_limit_in_mb: int = 512
    function_version: str = "$LATEST"
    timeout_seconds: int = 60
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    started: float = field(default_factory=time.monotonic)

    @property
    def invoked_function_arn(self) -> str:
        return f"arn:aws:lambda:us-east-1:123456789012:function:{self.function_name}"

    @property
    def log_group_name(self) -> str:
        return f"/aws/lambda/{self.function_name}"

    @property
    def log_stream_name(self) -> str:
        return self.aws_request_id

    def get_remaining_time_in_millis(self) -> int:
        return max(int((self.timeout_seconds - (time.monotonic() - self.started)) * 1000), 0)


class InjectedFault(RuntimeError):
    """A crash injected by a test, to prove that Step Functions retries recover from it."""


# Which invocations a fault targets: the decoded payload -> crash this one?
PayloadFilter = Callable[[dict[str, Any]], bool]


@dataclass
class _Fault:
    step: str | None
    remaining: int
    after: bool = False
    when: PayloadFilter | None = None

    def applies(self, step: str | None, payload: dict[str, Any], *, after: bool) -> bool:
        return (
            self.remaining > 0
            and self.after == after
            and self.step in (None, step)
            and (self.when is None or self.when(payload))
        )


def _target(payload: dict[str, Any]) -> str | None:
    drain = payload.get("drain")
    if not isinstance(drain, dict):
        return None
    found = drain.get("worker_id") or drain.get("pool")
    return str(found) if found else None


def for_target(target: str) -> PayloadFilter:
    """Only the drain steps of this worker id or pool name."""
    return lambda payload: _target(payload) == target


class LambdaDispatcher:
    """Registry of function name -> handler, answering moto's Lambda invocations."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._faults: dict[str, list[_Fault]] = {}
        self._lock = threading.Lock()
        self.invocations: list[tuple[str, str | None]] = []
        # (function, step, target) of every invocation: which worker or pool each step served.
        self.calls: list[tuple[str, str | None, str | None]] = []
        # (step, target) of every invocation whose handler returned: the step's work is all done.
        self.returned: list[tuple[str | None, str | None]] = []
        # (function, step, "before" | "after", target) of every injected crash, for the tests' counts.
        self.crashes: list[tuple[str, str | None, str, str | None]] = []
        self._running = 0  # invocations under way
        self._idle = threading.Condition()

    def register(self, function_name: str, handler: Handler) -> None:
        self._handlers[function_name] = handler

    def unregister(self, function_name: str) -> None:
        """Stop answering for a function; later invocations fail as if it had been deleted."""
        self._handlers.pop(function_name, None)
        with self._lock:
            self._faults.pop(function_name, None)

    def inject_failure(
        self,
        function_name: str,
        *,
        step: str | None = None,
        times: int = 1,
        after: bool = False,
        when: PayloadFilter | None = None,
    ) -> None:
        """Make the next `times` invocations (of one step, if given; matching `when`, if given) crash.

        Before (the default): the function dies before its handler runs, nothing is written. After: the
        handler runs to the end, its writes and calls land, then the invocation fails anyway (a timeout
        or a crash on the way out), so Step Functions retries a step whose work is already done.
        """
        with self._lock:
            self._faults.setdefault(function_name, []).append(_Fault(step, times, after, when))

    def _take_fault(
        self, function_name: str, step: str | None, payload: dict[str, Any], *, after: bool
    ) -> bool:
        with self._lock:
            for fault in self._faults.get(function_name, []):
                if fault.applies(step, payload, after=after):
                    fault.remaining -= 1
                    position = "after" if after else "before"
                    self.crashes.append((function_name, step, position, _target(payload)))
                    return True
        return False

    def runs(self, step: str, target: str) -> int:
        """How many times one step was invoked for one worker id or pool name (crashed runs included)."""
        return sum(1 for _, s, t in self.calls if (s, t) == (step, target))

    def has_returned(self, step: str, target: str) -> bool:
        """Whether a run of this step for this worker id or pool name has finished its handler."""
        return (step, target) in self.returned

    def crash_count(self, *, step: str | None = None, when: str | None = None) -> int:
        """Crashes injected so far, of one step and/or one position ("before", "after")."""
        return sum(1 for _, s, w, _ in self.crashes if step in (None, s) and when in (None, w))

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no invocation is under way; whether none is. A test's teardown waits so, before
        the emulators forget the machines a step still under way is about to stop."""
        with self._idle:
            return self._idle.wait_for(lambda: self._running == 0, timeout)

    def forget(self) -> None:
        """Drop the record of invocations and crashes, so the next test counts only its own."""
        with self._lock:
            self.invocations.clear()
            self.calls.clear()
            self.returned.clear()
            self.crashes.clear()

    def invoke(self, function_name: str, body: Any, response_headers: dict[str, Any]) -> bytes:
        with self._idle:
            self._running += 1
        try:
            return self._invoke(function_name, body, response_headers)
        finally:
            with self._idle:
                self._running -= 1
                self._idle.notify_all()

    def _invoke(self, function_name: str, body: Any, response_headers: dict[str, Any]) -> bytes:
        name = function_name.split(":")[6] if function_name.startswith("arn:") else function_name
        handler = self._handlers.get(name)
        payload = json.loads(body) if body else {}
        fields = payload if isinstance(payload, dict) else {}
        step = fields.get("step")
        self.invocations.append((name, step))
        self.calls.append((name, step, _target(fields)))
        if handler is None:
            return self._error(response_headers, "ResourceNotFoundException", f"no local handler for {name}")
        try:
            if self._take_fault(name, step, fields, after=False):
                raise InjectedFault(f"injected crash of {name} ({step}) before its handler ran")
            with acting_as(name):
                result = handler(payload, LocalLambdaContext(function_name=name))
            self.returned.append((step, _target(fields)))
            if self._take_fault(name, step, fields, after=True):
                raise InjectedFault(f"injected crash of {name} ({step}) after its handler ran")
        except InvocationCrashed as crashed:
            # The fault layer killed the invocation mid-flight: Lambda reports a runtime exit.
            return self._error(response_headers, "Runtime.ExitError", str(crashed))
        except Exception as exc:
            if not type(exc).__name__.startswith("Drain"):
                logger.warning(
                    "local lambda failed", extra={"function": name, "step": step, "error": repr(exc)}
                )
            return self._error(response_headers, type(exc).__name__, str(exc))
        return json.dumps(result if result is not None else {}, default=str).encode()

    @staticmethod
    def _error(response_headers: dict[str, Any], error_type: str, message: str) -> bytes:
        response_headers["x-amz-function-error"] = "Unhandled"
        return json.dumps({"errorType": error_type, "errorMessage": message}).encode()


dispatcher = LambdaDispatcher()
_installed = False


def install() -> LambdaDispatcher:
    """Route moto's simple Lambda backend to the dispatcher (once per process)."""
    global _installed  # noqa: PLW0603 - one patch per process, by design
    if not _installed:

        def invoke(  # noqa: PLR0917 - moto's signature
            self: LambdaSimpleBackend,
            function_name: str,
            qualifier: str | None,
            body: Any,
            headers: Any,
            response_headers: Any,
        ) -> bytes:
            return dispatcher.invoke(function_name, body, response_headers)

        LambdaSimpleBackend.invoke = invoke  # type: ignore[method-assign]
        _answer_early_callbacks()
        _reuse_lambda_clients()
        _installed = True
    return dispatcher


def _answer_early_callbacks() -> None:
    """Make moto honour a task token answered while the task's own Lambda call is still running.

    On AWS the token is live from the moment the task starts, so a function that finds the work already
    done may answer its own token. moto sets up the heartbeat wait only after the invocation returns and
    then waits for the next heartbeat before it looks at the answer; with no heartbeat coming, the drain
    would sit until the heartbeat timeout. Checking for an answer first restores AWS's behaviour.
    """
    callback_state = state_task_service_callback.StateTaskServiceCallback
    original = callback_state._wait_for_task_token_heartbeat

    def wait(self: Any, env: Any, callback_endpoint: Any, heartbeat_endpoint: Any) -> Any:
        early = callback_endpoint.get_outcome()
        if early is not None:
            return early
        return original(self, env, callback_endpoint, heartbeat_endpoint)

    callback_state._wait_for_task_token_heartbeat = wait  # type: ignore[method-assign]


def _reuse_lambda_clients() -> None:
    """Give moto's Step Functions one Lambda client per region instead of a new one for every task.

    moto builds a boto3 client for each Lambda task it runs, which costs more CPU than the step's own
    work. Its clients differ only by region (the state's credentials are not used) and by the default
    session they come from, which carries the local layers' hooks (aws_rules makes a new one), so one is
    kept per region and made again when the default session changes."""
    clients: dict[tuple[str, str], tuple[Any, Any]] = {}
    lock = threading.Lock()

    def client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        with lock:
            made = clients.get((region, service))
            if made is None or made[0] is not boto3.DEFAULT_SESSION:
                client = boto_client_for(region=region, service=service)
                made = clients[region, service] = (boto3.DEFAULT_SESSION, client)
            return made[1]

    lambda_eval_utils.boto_client_for = client_for  # type: ignore[attr-defined]
