"""Seeded faults in the real boto3 clients, through botocore's event hooks.

AWS does things the local emulators never do: DynamoDB cancels transactions with `TransactionConflict`
and throttles, its indexes lag the table, EC2 and Step Functions throttle and fail with 5xx, a task
token may no longer exist. A `FaultPlan` makes the real clients see exactly those answers, so the tests
and `make stress` exercise the production error paths rather than mocks of our own code.

How it hooks in: every botocore session registers `botocore.handlers.BUILTIN_HANDLERS` when it is
created, so while a plan is installed every client created afterwards (and `reset_clients()` makes the
cached ones be created again) carries two handlers:

- `before-call.<service>.<operation>`: answering there short-circuits the HTTP call, so the request never
  reaches the emulator (the write did not happen), and botocore raises the injected error as usual;
- `after-call.<service>.<operation>`: the request went through and the answer is replaced by an error
  (the write happened, the caller never heard), which is how a timeout or a crash after a write looks.

The index lag makes every Query on a GSI answer as the index stood `index_lag_seconds` ago
(index_lag.py): an item written since is missing if it is new, and shows its old image (old keys, old
projected attributes) if it existed, as a GSI that has not caught up yet does; with
`index_old_images=False` every item written since is missing instead.

Beyond AWS's error answers, a fault can model two things that are not errors at all:

- `lost=True`: the call answers success but never reaches AWS (a callback that never arrives, an
  execution that is never started);
- `crash=True`: the invocation dies at that call (`InvocationCrashed`, a `BaseException`, so no
  `except Exception` of ours can swallow it). With `after=True` the write landed first. A `sticky`
  crash also kills every later call through the plan, from any thread, until `revive()`: a dead Lambda
  makes no clean-up call (no `finally` reaches AWS), so a lease or a half-written drain stays as the
  crash left it. Use it only while nothing else runs through the plan.

`skip` lets the first matching calls through, so "die after the 3rd worker write" is
`crash_after_writes(3, ...)`. Everything is decided by the plan's seeded random and its counters, so a
seed reproduces a run.
"""

from __future__ import annotations

import json
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import botocore.session
from botocore import handlers

from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.services.context import default_context
from fleetkeeper_local.index_lag import LaggingIndexes
from fleetkeeper_local.tables import write_items

# One botocore handler as `BUILTIN_HANDLERS` lists it: (event name, handler), or with a third member,
# `handlers.REGISTER_FIRST` or `handlers.REGISTER_LAST`, for one that must run before or after the rest.
HookSpec = tuple[str, Callable[..., Any]] | tuple[str, Callable[..., Any], object]


class InvocationCrashed(BaseException):
    """The invocation died at this call (a Lambda killed mid-flight); never caught by `except Exception`."""


# botocore's service ids, hyphenized, as they appear in event names.
SERVICE_IDS = {"dynamodb": "dynamodb", "ec2": "ec2", "stepfunctions": "sfn", "sfn": "sfn", "ssm": "ssm"}

_OUR_SERVICES = frozenset(SERVICE_IDS.values())

_WRITE_OPERATIONS = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"})


@dataclass
class HttpAnswer:
    """The part of a botocore HTTP response that the client reads after a short-circuit."""

    status_code: int
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes = b""
    text: str = ""


@dataclass
class Fault:
    """One kind of failure on one service, for some operations, at some rate."""

    service: str
    error: str
    operations: frozenset[str] | None = None  # None: every operation of the service
    rate: float = 1.0
    limit: int | None = None  # inject at most this many times
    status: int = 400
    after: bool = False  # let the call through, then answer with the error (the write happened)
    when: Callable[[str, dict[str, Any]], bool] | None = None  # (operation, params) -> inject?
    message: str = "injected by fleetkeeper_local.faults"
    lost: bool = False  # answer success without reaching AWS: the call silently never happened
    crash: bool = False  # the invocation dies here (InvocationCrashed)
    sticky: bool = False  # with crash: the whole plan stays dead until revive()
    skip: int = 0  # let this many matching calls through first
    lost_response: dict[str, Any] = field(default_factory=dict)  # the success a lost call answers
    injected: int = 0
    seen: int = 0

    @property
    def label(self) -> str:
        return f"{self.service}:{self.error}"

    def matches(self, service: str, operation: str, params: dict[str, Any]) -> bool:
        if SERVICE_IDS.get(self.service, self.service) != service:
            return False
        if self.operations is not None and operation not in self.operations:
            return False
        if self.limit is not None and self.injected >= self.limit:
            return False
        return self.when is None or self.when(operation, params)

    def lost_answer(self) -> dict[str, Any]:
        return {**self.lost_response, "ResponseMetadata": {"HTTPStatusCode": 200, "RetryAttempts": 0}}

    def response(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        code, _, reason = self.error.partition("/")
        body: dict[str, Any] = {
            "Error": {"Code": code, "Message": f"{self.message} ({operation})"},
            "ResponseMetadata": {"HTTPStatusCode": self.status, "RetryAttempts": 0},
        }
        if code == "TransactionCanceledException":
            # One reason per item sent, as DynamoDB reports them: the named reason on the first item.
            items = params.get("TransactItems") or [{}]
            reasons = [{"Code": "None"} for _ in items]
            reasons[0] = {"Code": reason or "TransactionConflict", "Message": self.message}
            body["CancellationReasons"] = reasons
            body["Error"]["Message"] = f"Transaction cancelled [{reason or 'TransactionConflict'}]"
        return body


# Ready-made faults for each class the issue lists; the rate is what a test or `make stress` asks for.
def dynamodb_conflicts(rate: float, **kw: Any) -> Fault:
    return Fault(
        "dynamodb",
        "TransactionCanceledException/TransactionConflict",
        frozenset({"TransactWriteItems"}),
        rate,
        **kw,
    )


def dynamodb_throttling(rate: float, **kw: Any) -> Fault:
    return Fault("dynamodb", "ThrottlingException", rate=rate, **kw)


def dynamodb_throughput(rate: float, **kw: Any) -> Fault:
    return Fault("dynamodb", "ProvisionedThroughputExceededException", rate=rate, **kw)


def ec2_throttling(rate: float, **kw: Any) -> Fault:
    return Fault("ec2", "RequestLimitExceeded", rate=rate, status=503, **kw)


def ec2_server_error(rate: float, **kw: Any) -> Fault:
    return Fault("ec2", "InternalError", rate=rate, status=500, **kw)


def ec2_no_capacity(rate: float, **kw: Any) -> Fault:
    # EC2 answers it with a 500 (ec2_time.py marks an instance type out of capacity for every caller).
    return Fault("ec2", "InsufficientInstanceCapacity", frozenset({"RunInstances"}), rate, status=500, **kw)


_TOKEN_ANSWERS = frozenset({"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"})


def sfn_throttling(rate: float, **kw: Any) -> Fault:
    return Fault("stepfunctions", "ThrottlingException", rate=rate, **kw)


def sfn_task_does_not_exist(rate: float, operations: frozenset[str] = _TOKEN_ANSWERS, **kw: Any) -> Fault:
    return Fault("stepfunctions", "TaskDoesNotExist", operations, rate, **kw)


def sfn_task_timed_out(rate: float, operations: frozenset[str] = _TOKEN_ANSWERS, **kw: Any) -> Fault:
    return Fault("stepfunctions", "TaskTimedOut", operations, rate, **kw)


def sfn_lost_callbacks(rate: float, **kw: Any) -> Fault:
    """SendTaskSuccess answers OK but never reaches Step Functions: the waiting task hears nothing."""
    return Fault("stepfunctions", "LostCallback", frozenset({"SendTaskSuccess"}), rate, lost=True, **kw)


def sfn_execution_never_starts(**kw: Any) -> Fault:
    """The invocation dies on its way to StartExecution: the drain is recorded, no execution exists."""
    return Fault("stepfunctions", "Crashed", frozenset({"StartExecution"}), crash=True, limit=1, **kw)


def ssm_throttling(rate: float, **kw: Any) -> Fault:
    return Fault("ssm", "ThrottlingException", rate=rate, **kw)


def ssm_command_result(status: str, *, stdout: str = "", stderr: str = "", **kw: Any) -> Fault:
    """GetCommandInvocation answers with this result (moto's commands always succeed at once, silently):
    a failed, still running or timed-out command, or one that printed something."""
    answer = {
        "Status": status,
        "StatusDetails": status,
        "ResponseCode": 0 if status == "Success" else (-1 if status in {"Pending", "InProgress"} else 1),
        "StandardOutputContent": stdout,
        "StandardErrorContent": stderr,
    }
    return Fault(
        "ssm", f"Result{status}", frozenset({"GetCommandInvocation"}), lost=True, lost_response=answer, **kw
    )


def ssm_cancel_accepted(**kw: Any) -> Fault:
    """CancelCommand answers as AWS does (moto does not implement it)."""
    return Fault("ssm", "CancelAccepted", frozenset({"CancelCommand"}), lost=True, **kw)


# The calls whose answer, when lost, leaves the caller not knowing whether they happened.
_EC2_CHANGES = frozenset(
    {"RunInstances", "StartInstances", "StopInstances", "TerminateInstances", "CreateTags"}
)
_SFN_CHANGES = frozenset({"StartExecution", "StopExecution", *_TOKEN_ANSWERS})


def dynamodb_lost_answers(rate: float, **kw: Any) -> Fault:
    """A DynamoDB write lands and its answer is lost (a timeout, a dropped connection): the caller hears
    a 500 and must not count it twice, nor take its own write for somebody else's."""
    return Fault("dynamodb", "InternalServerError", _WRITE_OPERATIONS, rate, status=500, after=True, **kw)


def ec2_lost_answers(rate: float, **kw: Any) -> Fault:
    """An EC2 change (a launch, a stop, a tag) happens and its answer is lost."""
    return Fault("ec2", "InternalError", _EC2_CHANGES, rate, status=500, after=True, **kw)


def sfn_lost_answers(rate: float, **kw: Any) -> Fault:
    """An execution starts or stops, or a task hears its answer, and the caller hears a 500."""
    return Fault("stepfunctions", "InternalServerError", _SFN_CHANGES, rate, status=500, after=True, **kw)


def crashes_between_writes(rate: float, **kw: Any) -> Fault:
    """The invocation dies right after a DynamoDB write landed, before whatever it would write next. Not
    sticky: only the invocation that made the write dies, so it can run beside others (`make stress`)."""
    return Fault("dynamodb", "Crashed", _WRITE_OPERATIONS, rate, after=True, crash=True, **kw)


def is_worker_write(operation: str, params: dict[str, Any]) -> bool:
    """A DynamoDB write that touches a worker item (a status move, a claim, a drain record)."""
    if operation not in _WRITE_OPERATIONS:
        return False
    return any(pk.startswith("WORKER#") for pk in _written_partitions(operation, params))


def crash_after_writes(
    writes: int,
    *,
    when: Callable[[str, dict[str, Any]], bool] = is_worker_write,
    sticky: bool = True,
    **kw: Any,
) -> Fault:
    """The invocation dies right after its `writes`-th matching write landed (a reconcile cut short);
    sticky by default, so not even its clean-up reaches AWS."""
    return Fault(
        "dynamodb",
        "Crashed",
        _WRITE_OPERATIONS,
        after=True,
        crash=True,
        skip=max(writes - 1, 0),
        limit=1,
        sticky=sticky,
        when=when,
        **kw,
    )


class FaultPlan:
    """A seeded set of faults and an index lag; `installed()` turns them on for every new client."""

    def __init__(
        self,
        seed: int = 0,
        faults: list[Fault] | None = None,
        index_lag_seconds: float = 0.0,
        *,
        index_old_images: bool = True,
    ) -> None:
        self._random = random.Random(seed)  # noqa: S311 - reproducible faults, not secrets
        self._lock = threading.Lock()
        self.faults: list[Fault] = list(faults or [])
        self.index_lag_seconds = index_lag_seconds
        self.injected: Counter[str] = Counter()
        self.index_lag = (
            LaggingIndexes(
                index_lag_seconds, old_images=index_old_images, reader=lambda: unhooked_client("dynamodb")
            )
            if index_lag_seconds > 0
            else None
        )
        self.enabled = True
        self.dead = False  # a crash fault fired: every call dies until revive()

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    @property
    def hidden_by_lag(self) -> int:
        """Index entries the lag left out of a Query's answer."""
        return self.index_lag.hidden if self.index_lag is not None else 0

    @property
    def old_images_by_lag(self) -> int:
        """Old images the lag answered in their items' place."""
        return self.index_lag.shown_old if self.index_lag is not None else 0

    def revive(self) -> None:
        """A new invocation after a crash: calls reach AWS again (the crash faults stay spent)."""
        self.dead = False

    # ---- botocore handlers -------------------------------------------------------------------------

    def _pick(self, service: str, operation: str, params: dict[str, Any], *, after: bool) -> Fault | None:
        if not self.enabled:
            return None
        with self._lock:
            for fault in self.faults:
                if fault.after != after or not fault.matches(service, operation, params):
                    continue
                if fault.seen < fault.skip:
                    fault.seen += 1
                    continue
                if self._random.random() < fault.rate:
                    fault.injected += 1
                    self.injected[fault.label] += 1
                    if fault.crash and fault.sticky:
                        self.dead = True
                    return fault
        return None

    def _die_if_dead(self, service: str, operation: str) -> None:
        # Only our services: the emulator's own clients (moto's Step Functions calling Lambda) live on.
        if self.dead and self.enabled and service in _OUR_SERVICES:
            raise InvocationCrashed(f"the invocation is dead; {service}.{operation} never ran")

    def before_call(
        self, event_name: str, model: Any, params: dict[str, Any], context: Any = None, **_: Any
    ) -> Any:
        service, operation = service_and_operation(event_name)
        self._die_if_dead(service, operation)
        raw_body = params.get("body")
        api_params = self._api_params(params, raw_body if isinstance(raw_body, dict) else {})
        if isinstance(context, dict):
            context["fleetkeeper_params"] = api_params  # the after-call faults target by request too
        fault = self._pick(service, operation, api_params, after=False)
        if fault is None:
            return None
        if fault.crash:
            raise InvocationCrashed(f"crashed before {service}.{operation}")
        if fault.lost:
            return HttpAnswer(200), fault.lost_answer()
        return HttpAnswer(fault.status), fault.response(operation, api_params)

    def after_call(
        self, event_name: str, http_response: Any, parsed: dict[str, Any], context: Any, **_: Any
    ) -> None:
        service, operation = service_and_operation(event_name)
        api_params = context.get("fleetkeeper_params", {}) if isinstance(context, dict) else {}
        landed = getattr(http_response, "status_code", 500) < 300
        if service == "dynamodb" and self.index_lag is not None and isinstance(context, dict):
            if operation in _WRITE_OPERATIONS:
                self.index_lag.after_write(context, landed)
            elif operation == "Query" and landed:
                self.index_lag.after_query(api_params, parsed)
        if not landed:
            return
        fault = self._pick(service, operation, api_params, after=True)
        if fault is None:
            return
        if fault.crash:
            raise InvocationCrashed(f"crashed after {service}.{operation} landed")
        http_response.status_code = fault.status
        parsed.clear()
        parsed.update(fault.response(operation, api_params))

    @staticmethod
    def _api_params(params: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        # The request dict holds the serialized body; DynamoDB and SFN bodies are JSON text.
        raw = params.get("body")
        if isinstance(raw, bytes | str) and raw:
            try:
                loaded = json.loads(raw)
            except ValueError:
                return body
            return loaded if isinstance(loaded, dict) else body
        return body

    def remember_keys(self, event_name: str, params: dict[str, Any], context: Any, **_: Any) -> None:
        """before-call on DynamoDB: what a write changes, for the index lag."""
        operation = event_name.rsplit(".", 1)[-1]
        if self.index_lag is not None and isinstance(context, dict) and operation in _WRITE_OPERATIONS:
            self.index_lag.before_write(operation, self._api_params(params, {}), context)

    # ---- installation --------------------------------------------------------------------------------

    def _specs(self) -> list[HookSpec]:
        return [
            ("before-call.dynamodb", self.remember_keys),
            ("before-call", self.before_call),
            ("after-call", self.after_call),
        ]

    @contextmanager
    def installed(self) -> Iterator[FaultPlan]:
        """Turn the plan on for every client created inside the block (cached clients are rebuilt).

        The process-wide service context holds its clients, so it is rebuilt too: the handlers (and the
        drain Lambda running in the emulator's thread) see the faults as well.
        """
        with installed_hooks(self._specs()):
            yield self

    def summary(self) -> dict[str, int]:
        counts = dict(self.injected)
        if self.index_lag is not None:
            counts["dynamodb:IndexLagHidden"] = self.hidden_by_lag
            counts["dynamodb:IndexLagOldImages"] = self.old_images_by_lag
        return counts


# Every handler installed through `installed_hooks`, so that `unhooked_client` can leave them all out.
_installed: list[HookSpec] = []
_installed_lock = threading.Lock()


@contextmanager
def installed_hooks(specs: list[HookSpec]) -> Iterator[None]:
    """Register botocore handlers on every client created inside the block; the one way the local
    layers (faults, AWS rules) hook into the clients. Cached clients and the process-wide service
    context are rebuilt on the way in and out."""
    with _installed_lock:
        handlers.BUILTIN_HANDLERS.extend(specs)
        _installed.extend(specs)
    _forget_clients()
    try:
        yield
    finally:
        with _installed_lock:
            for spec in specs:
                handlers.BUILTIN_HANDLERS.remove(spec)
                _installed.remove(spec)
        _forget_clients()


def unhooked_client(service: str, region: str | None = None, **options: Any) -> Any:
    """A client that none of the installed layers sees: what the local machinery itself reads from the
    emulators (table definitions, an item's current keys, EC2 states for the event pump) must not be
    faulted, throttled or counted. `options` go to botocore's create_client (an endpoint, keys)."""
    with _installed_lock:
        session = botocore.session.get_session()
        for spec in _installed:
            session.unregister(spec[0], spec[1])
    return session.create_client(service, region_name=region, **options)


def _forget_clients() -> None:
    reset_clients()
    default_context.cache_clear()


def service_and_operation(event_name: str) -> tuple[str, str]:
    """`before-call.dynamodb.PutItem` -> ("dynamodb", "PutItem")."""
    parts = event_name.split(".")
    return parts[1], parts[-1]


def _written_partitions(operation: str, body: dict[str, Any]) -> Iterator[str]:
    for _, action, spec in write_items(operation, body):
        key = spec.get("Key") or spec.get("Item") or {}
        if action != "ConditionCheck" and "PK" in key:
            yield str(key["PK"].get("S", ""))


# ---- EC2 events as EventBridge really delivers them ---------------------------------------------------


def _malformed_copies(event: dict[str, Any]) -> list[dict[str, Any]]:
    """Broken variants of one event, each wrong in a different field."""
    raw = event.get("detail")
    detail: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return [
        {key: value for key, value in event.items() if key != "detail"},
        {**event, "detail": {**detail, "state": "exploded"}},
        {**event, "detail": {**detail, "instance-id": "not-an-instance"}},
        {**event, "time": "yesterday at noon"},
        {**event, "detail": json.dumps(detail)},
        {**event, "detail-type": None},
    ]


@dataclass
class EventStreamFaults:
    """Duplicates, reorders, delays and corrupts a stream of EC2 events, reproducibly from a seed.

    `mutate(batch)` turns one batch of events (in the order they happened) into what a delivery would
    hand over: an event may come twice (same id, as a redelivery does), be held back for `late_batches`
    batches and then arrive after newer ones (keeping its original time), be followed by a malformed
    copy, and the batch may be shuffled. Nothing is lost: `flush()` hands over what is still held.
    """

    seed: int = 0
    duplicate: float = 0.0
    reorder: float = 0.0
    late: float = 0.0
    malformed: float = 0.0
    late_batches: int = 1
    counts: Counter[str] = field(default_factory=Counter)
    _held: list[tuple[int, dict[str, Any]]] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)  # noqa: S311 - reproducible faults, not secrets
        self._lock = threading.Lock()

    def mutate(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        with self._lock:
            out: list[dict[str, Any]] = []
            released = [event for wait, event in self._held if wait <= 1]
            self._held = [(wait - 1, event) for wait, event in self._held if wait > 1]
            for event in events:
                if self._random.random() < self.late:
                    self._held.append((self.late_batches, event))
                    self.counts["late"] += 1
                    continue
                out.append(event)
                if self._random.random() < self.duplicate:
                    out.append(json.loads(json.dumps(event)))
                    self.counts["duplicated"] += 1
                if self._random.random() < self.malformed:
                    variants = _malformed_copies(event)
                    out.append(variants[self._random.randrange(len(variants))])
                    self.counts["malformed"] += 1
            if len(out) > 1 and self._random.random() < self.reorder:
                self._random.shuffle(out)
                self.counts["reordered"] += 1
            # Late events arrive after the newer ones, which is what makes them dangerous.
            return out + released

    def flush(self) -> list[dict[str, Any]]:
        """Everything still held back, oldest first."""
        with self._lock:
            held = [event for _, event in self._held]
            self._held = []
            return held
