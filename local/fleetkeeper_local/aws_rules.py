"""AWS's limits, enforced on the real boto3 clients wherever fleetkeeper runs on the local stack.

The emulators answer every request as fast as the machine allows. AWS does not: a DynamoDB partition
key value takes about 1,000 write units and 3,000 read units a second, a global secondary index
partition throttles the table's writes that feed it, and EC2 meters every API action per account and
region with token buckets. `AwsRules` makes the real clients meet those limits, so a test, `make run`
and `make stress` find a hot key or an over-eager poll before AWS does.

What it enforces (figures and sources in docs/fault-injection.md):

- DynamoDB throughput per partition key value, one token bucket per (table or index, partition key
  value), for writes and reads apart, at `Limits.partition_write_units` and
  `Limits.partition_read_units` a second. A bucket holds one second of its rate: AWS's burst capacity
  (300 s of a table's unused capacity) and adaptive capacity are not modelled per partition. A write
  draws on its table partition and on every index partition its item enters, leaves or rewrites, so
  a hot index partition throttles the table's writes, as AWS's index back-pressure does. The units
  are DynamoDB Local's own ConsumedCapacity (it sizes items exactly as DynamoDB does, doubles
  transactional units and counts an index key change as a delete and a put), asked for on every call
  and handed back to the caller only as the caller asked. A request may go ahead while its buckets
  are in credit and then pays what it consumed, which can leave a bucket in debt: sustained, the rate
  is the bucket's refill rate. Throttled requests answer as an on-demand table does
  (`ThrottlingException`, or a transaction cancelled with `ThrottlingError` on the hot item), with a
  `ThrottlingReasons` entry naming the key range limit and the table or index.
- EC2 request rates: a bucket per action and region (capacity, refill per second) by the action's
  category, the smaller bucket of the unfiltered and unpaginated Describe calls, the actions with
  buckets of their own, and the resource buckets of RunInstances, StartInstances, StopInstances and
  TerminateInstances (tokens per instance). A throttled call answers `RequestLimitExceeded` (503).

DynamoDB Local itself already refuses, with DynamoDB's error codes, what DynamoDB refuses in a single
request (item size, key sizes, transaction and batch sizes, expression sizes, the 1 MB page); the tests
in tests/integration/faults/test_aws_rules.py hold it to that, so nothing here repeats it.

Throttling is decided on each HTTP attempt (botocore's `before-send`), so the SDK's own retries and
backoff run as they would against AWS. Buckets live in the process that installs the rules; processes
started with FLEETKEEPER_AWS_RULES in their environment (the API instances of `make stress`) have
their own. The figures scale with `Limits.dynamodb_scale` and `Limits.ec2_scale`
(FLEETKEEPER_AWS_RULES=<scale>, `dynamodb=<scale>,ec2=<scale>`, or `off`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import threading
import time
import uuid
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs

import boto3
from botocore import handlers

from fleetkeeper_local.faults import HookSpec, installed_hooks, unhooked_client
from fleetkeeper_local.tables import TableShape, describe, key_text, write_items

ENVIRONMENT = "FLEETKEEPER_AWS_RULES"
_OFF = frozenset({"off", "0", "false", "no"})
ACCOUNT = "123456789012"
# What the caller asked of ConsumedCapacity, kept by whichever rules saw the call first.
_ASKED_KEY = "fleetkeeper_asked_capacity"

# ---- the figures ------------------------------------------------------------------------------------

# DynamoDB developer guide, "Best practices for designing and using partition keys effectively" and
# the throttling guide's KeyRangeThroughputExceeded: per partition, per second, in both capacity modes.
PARTITION_WRITE_UNITS = 1000.0
PARTITION_READ_UNITS = 3000.0


@dataclass(frozen=True)
class Rate:
    """A token bucket: at most `capacity` tokens, refilled by `per_second`."""

    capacity: float
    per_second: float

    def scaled(self, scale: float) -> Rate:
        # A bucket that can never hold one token would refuse every call; keep one.
        return Rate(max(1.0, self.capacity * scale), self.per_second * scale)


# Amazon EC2 developer guide, "Request throttling for the Amazon EC2 API": request tokens by category
# (one per call, per action and region) and the actions with buckets of their own.
EC2_NON_MUTATING = Rate(100, 20)
EC2_UNFILTERED = Rate(50, 10)
EC2_MUTATING = Rate(50, 5)
EC2_RESOURCE_INTENSIVE = Rate(50, 5)
# Without a filter or pagination these use the smaller bucket.
EC2_UNFILTERED_ACTIONS = frozenset(
    {
        "DescribeInstances",
        "DescribeInstanceStatus",
        "DescribeNetworkInterfaces",
        "DescribeSecurityGroups",
        "DescribeSnapshots",
        "DescribeSpotInstanceRequests",
        "DescribeVolumes",
    }
)
EC2_RESOURCE_INTENSIVE_ACTIONS = frozenset(
    {
        "AcceptVpcPeeringConnection",
        "AuthorizeSecurityGroupIngress",
        "CancelSpotInstanceRequests",
        "CreateKeyPair",
        "CreateVpcPeeringConnection",
        "DeleteVpcPeeringConnection",
        "RejectVpcPeeringConnection",
        "RevokeSecurityGroupIngress",
        "RequestSpotInstances",
    }
)
# The uncategorized actions fleetkeeper (or its tests) call; the guide lists many more.
EC2_ACTION_REQUESTS: Mapping[str, Rate] = {
    "RunInstances": Rate(5, 2),
    "StartInstances": Rate(5, 2),
    "TerminateInstances": Rate(100, 5),
    "CreateTags": Rate(100, 10),
    "DeleteTags": Rate(100, 10),
    "CreateSnapshot": Rate(100, 5),
    "CreateVolume": Rate(100, 5),
    "DeleteVolume": Rate(100, 5),
    "DeregisterImage": Rate(100, 5),
    "CopyImage": Rate(100, 1),
    "ModifyInstanceMetadataOptions": Rate(100, 5),
    "AssociateIamInstanceProfile": Rate(100, 5),
    "DisassociateIamInstanceProfile": Rate(100, 5),
}
# Resource tokens: one per instance the call acts on.
EC2_ACTION_RESOURCES: Mapping[str, Rate] = {
    "RunInstances": Rate(1000, 2),
    "TerminateInstances": Rate(1000, 20),
    "StartInstances": Rate(1000, 2),
    "StopInstances": Rate(1000, 20),
}
_NON_MUTATING_PREFIXES = ("Describe", "List", "Search", "Get")


@dataclass(frozen=True)
class Limits:
    """The figures the rules enforce. The scales multiply every rate and bucket of their service:
    DynamoDB Local writes a few hundred items a second on a laptop, far below what one partition of
    DynamoDB takes, so a benchmark that wants to meet the partition limits at the emulator's speed
    scales them down; EC2's limits are per account, whatever the emulator's speed."""

    dynamodb_scale: float = 1.0
    ec2_scale: float = 1.0
    partition_write_units: float = PARTITION_WRITE_UNITS
    partition_read_units: float = PARTITION_READ_UNITS
    burst_seconds: float = 1.0
    ec2_requests: Mapping[str, Rate] = field(default_factory=dict)  # overrides, by action
    ec2_resources: Mapping[str, Rate] = field(default_factory=dict)  # overrides, by action

    def partition(self, write: bool) -> Rate:
        per_second = self.partition_write_units if write else self.partition_read_units
        return Rate(per_second * self.burst_seconds, per_second).scaled(self.dynamodb_scale)

    def ec2_request(self, action: str, unfiltered: bool) -> tuple[str, Rate]:
        """The request bucket an EC2 call draws on: its name (per action) and size."""
        if action in self.ec2_requests:
            return action, self.ec2_requests[action].scaled(self.ec2_scale)
        if action in EC2_ACTION_REQUESTS:
            rate = EC2_ACTION_REQUESTS[action]
        elif action in EC2_UNFILTERED_ACTIONS and unfiltered:
            return f"{action}:unfiltered", EC2_UNFILTERED.scaled(self.ec2_scale)
        elif action in EC2_RESOURCE_INTENSIVE_ACTIONS:
            rate = EC2_RESOURCE_INTENSIVE
        elif action.startswith(_NON_MUTATING_PREFIXES):
            rate = EC2_NON_MUTATING
        else:
            rate = EC2_MUTATING
        return action, rate.scaled(self.ec2_scale)

    def ec2_resource(self, action: str) -> Rate | None:
        rate = self.ec2_resources.get(action) or EC2_ACTION_RESOURCES.get(action)
        return rate.scaled(self.ec2_scale) if rate is not None else None


class TokenBucket:
    """One token bucket, refilled continuously from a monotonic clock."""

    __slots__ = ("capacity", "per_second", "stamp", "tokens")

    def __init__(self, rate: Rate, now: float) -> None:
        self.capacity = rate.capacity
        self.per_second = rate.per_second
        self.tokens = rate.capacity
        self.stamp = now

    def level(self, now: float) -> float:
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.per_second)
        self.stamp = now
        return self.tokens

    def take(self, tokens: float, now: float) -> None:
        self.level(now)
        self.tokens -= tokens


# ---- DynamoDB: what a request touches ---------------------------------------------------------------

# DynamoDB's answers to a request an on-demand table throttles (the API reference's
# TransactionCanceledException lists both messages for ThrottlingError).
TABLE_THROTTLED = (
    "Throughput exceeds the current capacity of your table or index. DynamoDB is automatically scaling "
    "your table or index so please try again shortly. If exceptions persist, check if you have a hot "
    "key: https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/bp-partition-key-design.html"
)
INDEX_THROTTLED = (
    "Throughput exceeds the current capacity for one or more global secondary indexes. DynamoDB is "
    "automatically scaling your index so please try again shortly."
)
_WRITES = frozenset({"PutItem", "UpdateItem", "DeleteItem", "TransactWriteItems", "BatchWriteItem"})
_READS = frozenset({"GetItem", "BatchGetItem", "TransactGetItems", "Query"})
_TRANSACTIONS = frozenset({"TransactWriteItems", "TransactGetItems"})
_DYNAMODB_PREFIX = "com.amazonaws.dynamodb.v20120810#"
_CANCELLED = "Transaction cancelled, please refer cancellation reasons for specific reasons"
_CACHE_SIZE = 200_000
_MAX_BUCKETS = 100_000


@dataclass(frozen=True)
class _Touch:
    """One partition a request reads or writes; `item` is the request's item it belongs to."""

    table: str
    index: str | None
    partition: str
    item: int


@dataclass
class _Write:
    table: TableShape
    key: str
    action: str  # Put, Update, Delete, ConditionCheck
    new: dict[str, Any] | None  # the item's index key attributes after the write; None: unknown


@dataclass
class _Call:
    """One DynamoDB API call on its way through the hooks."""

    operation: str
    body: dict[str, Any]
    touches: list[_Touch] | None = None
    writes: list[_Write] = field(default_factory=list)
    sent: bool = False


_SECTION = re.compile(r"(?<![\w:#.])(SET|REMOVE|ADD|DELETE)(?![\w])", re.IGNORECASE)
_KEY_EQUALITY = re.compile(r"([#:\w.]+)\s*=\s*([#:\w.]+)")


def _top_level_split(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    depth = 0
    start = 0
    for position, char in enumerate(text):
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:position])
            start = position + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def updated_index_attributes(
    before: Mapping[str, Any],
    expression: str,
    names: Mapping[str, str],
    values: Mapping[str, Any],
    index_attributes: frozenset[str],
) -> dict[str, Any] | None:
    """The index key attributes after an UpdateExpression, from those before; None when the expression
    sets one in a way only DynamoDB can evaluate (a function, arithmetic, ADD)."""
    after = dict(before)
    pieces = _SECTION.split(expression)
    for keyword, clause in zip(pieces[1::2], pieces[2::2], strict=True):
        section = keyword.upper()
        for action in _top_level_split(clause, ","):
            if section == "SET":
                path, _, operand = action.partition("=")
                name = names.get(path.strip(), path.strip())
                if name not in index_attributes:
                    continue
                operand = operand.strip()
                if not operand.startswith(":") or operand not in values:
                    return None
                after[name] = values[operand]
            elif section == "REMOVE":
                after.pop(names.get(action, action), None)
            else:
                path = action.split()[0] if action.split() else action
                if names.get(path, path) in index_attributes:
                    return None
    return after


# ---- the rules --------------------------------------------------------------------------------------


@dataclass
class _Http:
    """The part of a botocore HTTP response the client reads after `before-send` answered."""

    status_code: int
    headers: dict[str, str]
    content: bytes


class AwsRules:
    """AWS's limits for every client created while `installed()`; `reset()` refills every bucket."""

    def __init__(self, limits: Limits | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.limits = limits or Limits()
        self.enabled = True
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[tuple[str, ...], TokenBucket] = {}
        self._tables: dict[str, TableShape | None] = {}
        self._images: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self._raw: Any = None
        self._context_key = f"fleetkeeper_aws_rules_{id(self)}"
        self.throttled: Counter[str] = Counter()
        self.write_units: defaultdict[str, float] = defaultdict(float)
        self.read_units: defaultdict[str, float] = defaultdict(float)

    @classmethod
    def from_environ(cls) -> AwsRules | None:
        """The rules FLEETKEEPER_AWS_RULES asks for: unset or `on` is AWS's figures, `off` none (None),
        a number scales every figure, `dynamodb=0.1,ec2=1` each service's."""
        raw = os.environ.get(ENVIRONMENT, "").strip().lower()
        if raw in _OFF:
            return None
        if raw in ("", "on", "1", "true", "yes"):
            return cls()
        scales: dict[str, float] = {}
        try:
            if "=" in raw:
                for part in raw.split(","):
                    service, _, value = part.partition("=")
                    if service.strip() not in ("dynamodb", "ec2"):
                        raise ValueError(service)
                    scales[f"{service.strip()}_scale"] = float(value)
            else:
                scales = {"dynamodb_scale": float(raw), "ec2_scale": float(raw)}
        except ValueError as exc:
            raise ValueError(
                f"{ENVIRONMENT}: expected on, off, a scale such as 0.1 or dynamodb=0.1,ec2=1; got {raw!r}"
            ) from exc
        if any(scale <= 0 for scale in scales.values()):
            raise ValueError(f"{ENVIRONMENT}: a scale must be above 0 (use off to turn the rules off)")
        return cls(
            Limits(dynamodb_scale=scales.get("dynamodb_scale", 1.0), ec2_scale=scales.get("ec2_scale", 1.0))
        )

    # ---- installation --------------------------------------------------------------------------------

    def _specs(self) -> list[HookSpec]:
        return [
            ("before-call.dynamodb", self._dynamodb_before_call),
            ("before-send.dynamodb", self._dynamodb_before_send),
            ("after-call.dynamodb", self._dynamodb_after_call),
            ("after-call.dynamodb", self._restore_capacity, handlers.REGISTER_LAST),
            ("before-send.ec2", self._ec2_before_send),
        ]

    @contextmanager
    def installed(self) -> Iterator[AwsRules]:
        """The rules on every client created inside the block, boto3's default session's included."""
        with installed_hooks(self._specs()):
            boto3.DEFAULT_SESSION = None
            try:
                yield self
            finally:
                boto3.DEFAULT_SESSION = None

    def reset(self) -> None:
        """Full buckets, nothing counted and nothing remembered (between tests)."""
        with self._lock:
            self._buckets.clear()
            self._tables.clear()
            self._images.clear()
            self.throttled.clear()
            self.write_units.clear()
            self.read_units.clear()

    @contextmanager
    def suspended(self) -> Iterator[None]:
        """No rule applies inside the block (a test that documents why it needs that)."""
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = True

    def summary(self) -> dict[str, int]:
        """Throttled calls by the reason AWS would give."""
        with self._lock:
            return dict(self.throttled)

    def hottest(self, *, writes: bool = True, top: int = 5) -> list[tuple[str, float]]:
        """The partitions (`table[/index]:value`) that consumed the most units so far."""
        with self._lock:
            units = self.write_units if writes else self.read_units
            return sorted(units.items(), key=lambda entry: -entry[1])[:top]

    # ---- DynamoDB ------------------------------------------------------------------------------------

    def _dynamodb_before_call(self, event_name: str, params: dict[str, Any], context: Any, **_: Any) -> None:
        operation = event_name.rsplit(".", 1)[-1]
        if not self.enabled or operation not in _WRITES | _READS or not isinstance(context, dict):
            return
        raw = params.get("body")
        try:
            body = json.loads(raw) if isinstance(raw, bytes | str) and raw else {}
        except ValueError:
            return
        if not isinstance(body, dict):
            return
        asked = body.get("ReturnConsumedCapacity")
        context.setdefault(_ASKED_KEY, asked if isinstance(asked, str) else None)
        # DynamoDB Local's own count of the units, per table and index: what the buckets are charged.
        body["ReturnConsumedCapacity"] = "INDEXES"
        params["body"] = json.dumps(body).encode()
        context[self._context_key] = _Call(operation, body)

    def _dynamodb_before_send(self, request: Any, **_: Any) -> _Http | None:
        context = getattr(request, "context", None)
        call = context.get(self._context_key) if isinstance(context, dict) else None
        if call is None or not self.enabled:
            return None
        if call.touches is None:
            call.touches, call.writes = self._plan(call)
        write = call.operation in _WRITES
        with self._lock:
            now = self._clock()
            hot = [touch for touch in call.touches if self._partition_bucket(touch, write).level(now) <= 0]
            if not hot:
                call.sent = True
                return None
            for touch in hot:
                self.throttled[f"dynamodb:{_reason(touch, write)}"] += 1
        region = (
            str(context.get("client_region") or "us-east-1") if isinstance(context, dict) else "us-east-1"
        )
        return _throttled_answer(call, hot, write, region)

    def _dynamodb_after_call(
        self, http_response: Any, parsed: dict[str, Any], context: Any, **_: Any
    ) -> None:
        call = context.get(self._context_key) if isinstance(context, dict) else None
        if call is None:
            return
        consumed = parsed.get("ConsumedCapacity")
        ok = getattr(http_response, "status_code", 500) < 300 and "Error" not in parsed
        if call.sent and ok and call.touches is not None:
            self._charge(call, consumed)
            self._remember(call, parsed)
        elif call.writes:
            # The write may have landed with its answer lost: forget what we knew of those items.
            with self._lock:
                for write in call.writes:
                    self._images.pop((write.table.name, write.key), None)

    @staticmethod
    def _restore_capacity(parsed: dict[str, Any], context: Any, **_: Any) -> None:
        """After every other handler: ConsumedCapacity as the caller asked for it, or none."""
        if isinstance(context, dict) and _ASKED_KEY in context:
            _as_asked(parsed, parsed.get("ConsumedCapacity"), context.pop(_ASKED_KEY))

    def _table(self, name: str) -> TableShape | None:
        with self._lock:
            if name in self._tables:
                return self._tables[name]
        try:
            table = describe(self._raw_dynamodb(), name)
        except Exception:
            return None  # DynamoDB Local will answer the call itself (a missing table, say)
        with self._lock:
            self._tables[name] = table
        return table

    def _raw_dynamodb(self) -> Any:
        if self._raw is None:
            self._raw = unhooked_client("dynamodb")
        return self._raw

    def _plan(self, call: _Call) -> tuple[list[_Touch], list[_Write]]:
        """The partitions the call touches, and for a write what each item becomes."""
        body = call.body
        if call.operation == "Query":
            table = self._table(str(body.get("TableName", "")))
            partition = _query_partition(body, table) if table is not None else None
            if table is None or partition is None:
                return [], []
            return [_Touch(table.name, body.get("IndexName"), partition, 0)], []
        touches: list[_Touch] = []
        if call.operation in _READS:
            for position, (table_name, read) in enumerate(_read_keys(call.operation, body)):
                table = self._table(table_name)
                if table is not None:
                    touches.append(_Touch(table.name, None, key_text(read.get(table.hash_key)), position))
            return touches, []
        # (position in the request, table, action, item or key, spec)
        items: list[tuple[int, TableShape, str, Mapping[str, Any], Mapping[str, Any]]] = []
        for position, (table_name, action, spec) in enumerate(write_items(call.operation, body)):
            table = self._table(table_name)
            if table is not None:
                items.append(
                    (position, table, action, spec.get("Item" if action == "Put" else "Key") or {}, spec)
                )
        befores = self._before_images(
            [(t, t.item_key(item)) for _, t, action, item, _ in items if action in ("Update", "Delete")]
        )
        writes: list[_Write] = []
        for position, table, action, item, spec in items:
            key = table.item_key(item)
            touches.append(_Touch(table.name, None, key_text(item.get(table.hash_key)), position))
            with self._lock:
                remembered = self._images.get((table.name, key))
            before = befores.get((table.name, key), remembered)  # None: not known
            if action == "Put":
                new: dict[str, Any] | None = {a: v for a, v in item.items() if a in table.index_attributes}
            elif action == "Update":
                new = (
                    None
                    if before is None
                    else updated_index_attributes(
                        before,
                        str(spec.get("UpdateExpression") or ""),
                        spec.get("ExpressionAttributeNames") or {},
                        spec.get("ExpressionAttributeValues") or {},
                        table.index_attributes,
                    )
                )
            elif action == "Delete":
                new = {}
            else:  # ConditionCheck: reads the item, writes no index
                writes.append(_Write(table, key, action, before))
                continue
            writes.append(_Write(table, key, action, new))
            # The index entries the write removes, rewrites or adds: every partition it lands on.
            was = table.index_entries(before or {})
            becomes = table.index_entries(new if new is not None else before or {})
            for index in sorted(set(was) | set(becomes)):
                for partition in sorted({p for p in (was.get(index), becomes.get(index)) if p is not None}):
                    touches.append(_Touch(table.name, index, partition, position))
        return touches, writes

    def _before_images(
        self, wanted: Iterable[tuple[TableShape, str]]
    ) -> dict[tuple[str, str], dict[str, Any]]:
        """The index key attributes of the items a write changes, as they are now: remembered from this
        process's reads and writes, else read out of band (a consistent BatchGetItem)."""
        found: dict[tuple[str, str], dict[str, Any]] = {}
        missing: dict[str, tuple[TableShape, dict[str, Any]]] = {}
        with self._lock:
            for table, key in wanted:
                image = self._images.get((table.name, key))
                if image is not None:
                    found[(table.name, key)] = image
                elif table.indexes:
                    missing.setdefault(table.name, (table, {}))[1][key] = json.loads(key)
        for table, keys in missing.values():
            names = (table.hash_key, table.range_key) if table.range_key else (table.hash_key,)
            attributes = sorted({*names, *table.index_attributes})
            aliases = {f"#a{n}": name for n, name in enumerate(attributes)}
            requested = [dict(zip(names, values, strict=True)) for values in keys.values()]
            for start in range(0, len(requested), 100):
                request: dict[str, Any] = {
                    table.name: {
                        "Keys": requested[start : start + 100],
                        "ConsistentRead": True,
                        "ProjectionExpression": ", ".join(aliases),
                        "ExpressionAttributeNames": aliases,
                    }
                }
                read: dict[tuple[str, str], dict[str, Any]] = {}
                try:
                    while request:
                        answer = self._raw_dynamodb().batch_get_item(RequestItems=request)
                        for item in answer.get("Responses", {}).get(table.name, []):
                            read[(table.name, table.item_key(item))] = {
                                a: v for a, v in item.items() if a in table.index_attributes
                            }
                        request = answer.get("UnprocessedKeys") or {}
                except Exception:  # noqa: S112 - unknown keys cost precision only, never the call
                    continue
                found.update(read)
                for values in requested[start : start + 100]:
                    found.setdefault((table.name, table.item_key(values)), {})  # no such item yet
        return found

    def _bucket(self, name: tuple[str, ...], rate: Rate) -> TokenBucket:
        bucket = self._buckets.get(name)
        if bucket is None:
            now = self._clock()
            if len(self._buckets) >= _MAX_BUCKETS:
                # A full bucket is a fresh one: forget those, so a long `make run` stays small.
                for full in [k for k, b in self._buckets.items() if b.level(now) >= b.capacity]:
                    del self._buckets[full]
            bucket = self._buckets[name] = TokenBucket(rate, now)
        return bucket

    def _partition_bucket(self, touch: _Touch, write: bool) -> TokenBucket:
        name = ("dynamodb", touch.table, touch.index or "", touch.partition, "write" if write else "read")
        return self._bucket(name, self.limits.partition(write))

    def _charge(self, call: _Call, consumed: Any) -> None:
        """Each table's and index's units, split evenly over the partitions the call touched there."""
        write = call.operation in _WRITES
        entries = consumed if isinstance(consumed, list) else [consumed] if isinstance(consumed, dict) else []
        spent: list[tuple[str, str | None, float]] = []
        for entry in entries:
            table = str(entry.get("TableName", ""))
            table_units = entry.get("Table", {}).get("CapacityUnits")
            if table_units is None and "GlobalSecondaryIndexes" not in entry:
                table_units = entry.get("CapacityUnits", 0)
            spent.append((table, None, float(table_units or 0)))
            for index, units in (entry.get("GlobalSecondaryIndexes") or {}).items():
                spent.append((table, index, float(units.get("CapacityUnits", 0))))
        touches = call.touches or []
        counted = self.write_units if write else self.read_units
        with self._lock:
            now = self._clock()
            for table, index, units in spent:
                partitions = sorted({t.partition for t in touches if t.table == table and t.index == index})
                if not partitions or units <= 0:
                    continue
                share = units / len(partitions)
                for partition in partitions:
                    self._partition_bucket(_Touch(table, index, partition, 0), write).take(share, now)
                    counted[f"{table}{'/' + index if index else ''}:{partition}"] += share

    def _remember(self, call: _Call, parsed: Mapping[str, Any]) -> None:
        """What this call showed of its items' index keys, for the next write's partitions."""
        images: list[tuple[str, str, dict[str, Any] | None]] = []
        for write in call.writes:
            if write.action != "ConditionCheck":
                images.append((write.table.name, write.key, write.new))
        for table_name, item in _read_items(call, parsed):
            table = self._tables.get(table_name)
            if table is not None:
                images.append(
                    (
                        table.name,
                        table.item_key(item),
                        {a: v for a, v in item.items() if a in table.index_attributes},
                    )
                )
        with self._lock:
            for table_name, key, image in images:
                if image is None:
                    self._images.pop((table_name, key), None)
                    continue
                self._images[(table_name, key)] = image
                self._images.move_to_end((table_name, key))
            while len(self._images) > _CACHE_SIZE:
                self._images.popitem(last=False)

    # ---- EC2 -----------------------------------------------------------------------------------------

    def _ec2_before_send(self, request: Any, **_: Any) -> _Http | None:
        if not self.enabled:
            return None
        body = request.body
        text = body.decode() if isinstance(body, bytes) else str(body or "")
        params = parse_qs(text)
        action = (params.get("Action") or [""])[0]
        if not action:
            return None
        context = getattr(request, "context", None)
        region = (
            str(context.get("client_region") or "us-east-1") if isinstance(context, dict) else "us-east-1"
        )
        unfiltered = action in EC2_UNFILTERED_ACTIONS and not any(
            name.startswith("Filter.") or name in ("MaxResults", "NextToken") for name in params
        )
        bucket_name, request_rate = self.limits.ec2_request(action, unfiltered)
        resource_rate = self.limits.ec2_resource(action)
        resources = _resource_count(action, params) if resource_rate is not None else 0
        with self._lock:
            now = self._clock()
            requests = self._bucket(("ec2", region, bucket_name), request_rate)
            pool = (
                self._bucket(("ec2-resource", region, action), resource_rate)
                if resource_rate and resources
                else None
            )
            needed = min(resources, pool.capacity) if pool is not None else 0
            if requests.level(now) >= 1 and (pool is None or pool.level(now) >= needed):
                requests.take(1, now)
                if pool is not None:
                    pool.take(needed, now)
                return None
            self.throttled[f"ec2:RequestLimitExceeded:{action}"] += 1
        return _ec2_throttled()


def _resource_count(action: str, params: Mapping[str, list[str]]) -> int:
    if action == "RunInstances":
        with contextlib.suppress(ValueError, IndexError):
            return max(1, int(params["MaxCount"][0]))
        return 1
    return sum(1 for name in params if name.startswith("InstanceId."))


def _ec2_throttled() -> _Http:
    request_id = str(uuid.uuid4())
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>RequestLimitExceeded</Code>'
        f"<Message>Request limit exceeded.</Message></Error></Errors><RequestID>{request_id}</RequestID>"
        "</Response>"
    )
    return _Http(
        503, {"Content-Type": "text/xml;charset=UTF-8", "x-amzn-RequestId": request_id}, body.encode()
    )


# The rules `install_from_environ` turned on for the rest of the process.
_process_rules: list[AwsRules] = []
_process_hooks = contextlib.ExitStack()


def install_from_environ() -> AwsRules | None:
    """Turn on, for the rest of this process, the rules FLEETKEEPER_AWS_RULES asks for (on unless it
    says off): `make run` and each API instance process call this once."""
    if _process_rules:
        return _process_rules[0]
    rules = AwsRules.from_environ()
    if rules is not None:
        _process_rules.append(_process_hooks.enter_context(rules.installed()))
    return rules


def process_rules() -> AwsRules | None:
    """The rules `install_from_environ` turned on in this process, if any."""
    return _process_rules[0] if _process_rules else None


# ---- DynamoDB request and answer shapes ---------------------------------------------------------------


def _reason(touch: _Touch, write: bool) -> str:
    return f"{'Index' if touch.index else 'Table'}{'Write' if write else 'Read'}KeyRangeThroughputExceeded"


def _resource(touch: _Touch, region: str) -> str:
    arn = f"arn:aws:dynamodb:{region}:{ACCOUNT}:table/{touch.table}"
    return f"{arn}/index/{touch.index}" if touch.index else arn


def _throttled_answer(call: _Call, hot: list[_Touch], write: bool, region: str) -> _Http:
    request_id = str(uuid.uuid4())
    reasons = [{"reason": _reason(t, write), "resource": _resource(t, region)} for t in hot]
    if call.operation in _TRANSACTIONS:
        # A transaction is cancelled, the hot item's reason saying why (others: "None").
        items = call.body.get("TransactItems") or []
        by_item = {t.item: t for t in reversed(hot)}
        cancellation = [
            {"Code": "ThrottlingError", "Message": INDEX_THROTTLED if by_item[n].index else TABLE_THROTTLED}
            if n in by_item
            else {"Code": "None"}
            for n in range(len(items))
        ]
        codes = ", ".join(str(c["Code"]) for c in cancellation)
        payload: dict[str, Any] = {
            "__type": f"{_DYNAMODB_PREFIX}TransactionCanceledException",
            "Message": f"{_CANCELLED} [{codes}]",
            "CancellationReasons": cancellation,
        }
    else:
        payload = {
            "__type": f"{_DYNAMODB_PREFIX}ThrottlingException",
            "message": INDEX_THROTTLED if any(t.index for t in hot) and write else TABLE_THROTTLED,
            "throttlingReasons": reasons,
        }
    headers = {"Content-Type": "application/x-amz-json-1.0", "x-amzn-RequestId": request_id}
    return _Http(400, headers, json.dumps(payload).encode())


def _as_asked(parsed: dict[str, Any], consumed: Any, asked: str | None) -> None:
    """Hand ConsumedCapacity back only as the caller asked for it."""
    if consumed is None:
        return
    if asked not in ("TOTAL", "INDEXES"):
        parsed.pop("ConsumedCapacity", None)
    elif asked == "TOTAL":
        entries = consumed if isinstance(consumed, list) else [consumed]
        trimmed = [{k: v for k, v in e.items() if k in ("TableName", "CapacityUnits")} for e in entries]
        parsed["ConsumedCapacity"] = trimmed if isinstance(consumed, list) else trimmed[0]


def _read_keys(operation: str, body: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if operation == "GetItem":
        yield str(body.get("TableName", "")), body.get("Key") or {}
    elif operation == "BatchGetItem":
        for table_name, request in (body.get("RequestItems") or {}).items():
            for key in request.get("Keys") or []:
                yield table_name, key
    elif operation == "TransactGetItems":
        for entry in body.get("TransactItems") or []:
            get = entry.get("Get") or {}
            yield str(get.get("TableName", "")), get.get("Key") or {}


def _query_partition(body: Mapping[str, Any], table: TableShape) -> str | None:
    """The partition key value a Query reads: the equality on its table's or index's hash key."""
    index = body.get("IndexName")
    if index is not None and index not in table.indexes:
        return None
    hash_attribute = table.indexes[index][0] if index else table.hash_key
    names = body.get("ExpressionAttributeNames") or {}
    values = body.get("ExpressionAttributeValues") or {}
    for left, right in _KEY_EQUALITY.findall(str(body.get("KeyConditionExpression") or "")):
        for name, value in ((left, right), (right, left)):
            if value in values and names.get(name, name) == hash_attribute:
                return key_text(values[value])
    condition = (body.get("KeyConditions") or {}).get(hash_attribute) or {}
    listed = condition.get("AttributeValueList") or []
    return key_text(listed[0]) if listed else None


def _read_items(call: _Call, parsed: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Whole items a read answered with (a projection shows only part of an item: not those)."""
    body = call.body
    if call.operation == "GetItem" and not _projected(body) and isinstance(parsed.get("Item"), dict):
        yield str(body.get("TableName", "")), parsed["Item"]
    elif call.operation == "BatchGetItem":
        for table_name, items in (parsed.get("Responses") or {}).items():
            if not _projected((body.get("RequestItems") or {}).get(table_name) or {}):
                for item in items:
                    yield table_name, item
    elif call.operation == "TransactGetItems":
        for entry, answer in zip(
            body.get("TransactItems") or [], parsed.get("Responses") or [], strict=False
        ):
            get = entry.get("Get") or {}
            if not _projected(get) and isinstance(answer.get("Item"), dict):
                yield str(get.get("TableName", "")), answer["Item"]
    elif call.operation == "Query" and body.get("IndexName") is None and not _projected(body):
        for item in parsed.get("Items") or []:
            yield str(body.get("TableName", "")), item


def _projected(spec: Mapping[str, Any]) -> bool:
    select = spec.get("Select")
    return bool(spec.get("ProjectionExpression") or spec.get("AttributesToGet")) or select not in (
        None,
        "ALL_ATTRIBUTES",
    )
