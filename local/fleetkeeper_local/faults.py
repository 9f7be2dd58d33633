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

The index lag hides, from every Query on a GSI, the items written less than `index_lag_seconds` ago, as a
GSI that has not caught up yet would.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from botocore import handlers

from fleetkeeper.cloud.clients import reset_clients

# botocore's service ids, hyphenized, as they appear in event names.
SERVICE_IDS = {"dynamodb": "dynamodb", "ec2": "ec2", "stepfunctions": "sfn", "sfn": "sfn", "ssm": "ssm"}

_WRITE_OPERATIONS = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"})


@dataclass
class _Http:
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
    injected: int = 0

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
    return Fault("ec2", "InsufficientInstanceCapacity", frozenset({"RunInstances"}), rate, **kw)


def sfn_throttling(rate: float, **kw: Any) -> Fault:
    return Fault("stepfunctions", "ThrottlingException", rate=rate, **kw)


def sfn_task_does_not_exist(rate: float, **kw: Any) -> Fault:
    return Fault(
        "stepfunctions",
        "TaskDoesNotExist",
        frozenset({"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"}),
        rate,
        **kw,
    )


def sfn_task_timed_out(rate: float, **kw: Any) -> Fault:
    return Fault(
        "stepfunctions",
        "TaskTimedOut",
        frozenset({"SendTaskSuccess", "SendTaskFailure", "SendTaskHeartbeat"}),
        rate,
        **kw,
    )


class FaultPlan:
    """A seeded set of faults and an index lag; `installed()` turns them on for every new client."""

    def __init__(
        self, seed: int = 0, faults: list[Fault] | None = None, index_lag_seconds: float = 0.0
    ) -> None:
        self._random = random.Random(seed)  # noqa: S311 - reproducible faults, not secrets
        self._lock = threading.Lock()
        self.faults: list[Fault] = list(faults or [])
        self.index_lag_seconds = index_lag_seconds
        self.injected: Counter[str] = Counter()
        self.hidden_by_lag = 0
        self._written: dict[str, float] = {}
        self.enabled = True

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            self.faults.append(fault)
        return fault

    # ---- botocore handlers -------------------------------------------------------------------------

    def _pick(self, service: str, operation: str, params: dict[str, Any], *, after: bool) -> Fault | None:
        if not self.enabled:
            return None
        with self._lock:
            for fault in self.faults:
                if fault.after != after or not fault.matches(service, operation, params):
                    continue
                if self._random.random() < fault.rate:
                    fault.injected += 1
                    self.injected[fault.label] += 1
                    return fault
        return None

    def before_call(self, event_name: str, model: Any, params: dict[str, Any], **_: Any) -> Any:
        service, operation = _service_and_operation(event_name)
        raw_body = params.get("body")
        api_params = self._api_params(params, raw_body if isinstance(raw_body, dict) else {})
        fault = self._pick(service, operation, api_params, after=False)
        if fault is None:
            return None
        return _Http(fault.status), fault.response(operation, api_params)

    def after_call(
        self, event_name: str, http_response: Any, parsed: dict[str, Any], context: Any, **_: Any
    ) -> None:
        service, operation = _service_and_operation(event_name)
        if service == "dynamodb":
            self._track_lag(operation, parsed, context)
        if getattr(http_response, "status_code", 500) >= 300:
            return
        fault = self._pick(service, operation, {}, after=True)
        if fault is None:
            return
        http_response.status_code = fault.status
        parsed.clear()
        parsed.update(fault.response(operation, {}))

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

    def _track_lag(self, operation: str, parsed: dict[str, Any], context: Any) -> None:
        if self.index_lag_seconds <= 0:
            return
        request = context.get("fleetkeeper_request") if isinstance(context, dict) else None
        if operation in _WRITE_OPERATIONS and request is not None:
            now = time.monotonic()
            with self._lock:
                for pk in request:
                    self._written[pk] = now
        elif operation == "Query" and isinstance(context, dict) and context.get("fleetkeeper_index"):
            cutoff = time.monotonic() - self.index_lag_seconds
            items = parsed.get("Items")
            if not items:
                return
            with self._lock:
                kept = [i for i in items if self._written.get(i.get("PK", {}).get("S", ""), 0) < cutoff]
                self.hidden_by_lag += len(items) - len(kept)
            parsed["Items"] = kept
            parsed["Count"] = len(kept)

    def remember_keys(self, event_name: str, params: dict[str, Any], context: Any, **_: Any) -> None:
        """before-call on DynamoDB: note which partitions a write touches and whether a Query uses a GSI."""
        if self.index_lag_seconds <= 0 or not isinstance(context, dict):
            return
        operation = event_name.rsplit(".", 1)[-1]
        body = self._api_params(params, {})
        if operation == "Query":
            context["fleetkeeper_index"] = bool(body.get("IndexName"))
        elif operation in _WRITE_OPERATIONS:
            context["fleetkeeper_request"] = list(_written_partitions(operation, body))

    # ---- installation --------------------------------------------------------------------------------

    def _specs(self) -> list[tuple[str, Callable[..., Any]]]:
        return [
            ("before-call.dynamodb", self.remember_keys),
            ("before-call", self.before_call),
            ("after-call", self.after_call),
        ]

    @contextmanager
    def installed(self) -> Iterator[FaultPlan]:
        """Turn the plan on for every client created inside the block (cached clients are rebuilt)."""
        specs = self._specs()
        handlers.BUILTIN_HANDLERS.extend(specs)
        reset_clients()
        try:
            yield self
        finally:
            for spec in specs:
                handlers.BUILTIN_HANDLERS.remove(spec)
            reset_clients()

    def summary(self) -> dict[str, int]:
        counts = dict(self.injected)
        if self.index_lag_seconds > 0:
            counts["dynamodb:IndexLagHidden"] = self.hidden_by_lag
        return counts


def _service_and_operation(event_name: str) -> tuple[str, str]:
    """`before-call.dynamodb.PutItem` -> ("dynamodb", "PutItem")."""
    parts = event_name.split(".")
    return parts[1], parts[-1]


def _written_partitions(operation: str, body: dict[str, Any]) -> Iterator[str]:
    if operation == "TransactWriteItems":
        for entry in body.get("TransactItems", []):
            for action in entry.values():
                key = action.get("Key") or action.get("Item") or {}
                if "PK" in key:
                    yield str(key["PK"].get("S", ""))
    elif operation == "BatchWriteItem":
        for requests in body.get("RequestItems", {}).values():
            for request in requests:
                for action in request.values():
                    key = action.get("Key") or action.get("Item") or {}
                    if "PK" in key:
                        yield str(key["PK"].get("S", ""))
    else:
        key = body.get("Key") or body.get("Item") or {}
        if "PK" in key:
            yield str(key["PK"].get("S", ""))
