"""API latency on the local stack, as a ratio to the DynamoDB work each request cannot avoid.

Four requests an operator's tools make all day:
- GET a worker;
- POST a drain (the worker keeps one instance, so the workflow waits on it);
- POST an instance placement by pool (pack);
- POST an instance state, COMPLETED, on the last instance of a draining worker: the completion that ends
  the drain.

Each is sent over HTTP to the local API, which runs the api handler in its own processes, one request at a
time per process as a Lambda execution environment does (one process per client), with 1 and with 8
concurrent clients.

The floor is measured in the same run: the DynamoDB calls that one such request makes, recorded from a
request served in this process (a botocore hook on our own client), then issued directly with a plain
boto3 client, by as many threads as there are clients. A replayed conditional write fails its condition,
which DynamoDB evaluates just as it would apply it, so the floor is a lower bound. Work that is not
DynamoDB (StartExecution for a drain, SendTaskSuccess for the completion, HTTP, validation, the handler)
is what the ratio shows.

The time a request spends in its other AWS calls (StartExecution, SendTaskSuccess, EventBridge, SNS) is
measured on the recorded requests and shown beside the floor: on the local stack those calls go to moto,
whose Step Functions parses the state machine again on every StartExecution, so they say more about the
emulator than about AWS.

Goal: at one client, every route's p50 within 3x its floor plus its other AWS calls. HTTP and a Lambda
invocation cost a few milliseconds against a few for DynamoDB, so this asks that the handler itself add
little; the 8-client figures show how that holds up when requests contend on a 2-core machine.

Run: `make bench` (all benchmarks) or `python -m bench api_latency`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import itertools
import json
import math
import os
import platform
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import boto3
import requests
from botocore.exceptions import ClientError

from fleetkeeper.cloud.clients import client as shared_client
from fleetkeeper.domain.lifecycle import Cause, WorkerStatus
from fleetkeeper.domain.models import Worker, WorkerTemplate
from fleetkeeper.services import catalog, placement, workers
from fleetkeeper.services.context import Context, default_context
from fleetkeeper_local.controlplane import ApiServer, activate, api_event, call_api, provision
from fleetkeeper_local.stack import LocalStack, free_port

CLIENTS = (1, 8)
SAMPLES = 160  # per route and client count: 20 per client at 8 clients
GOAL_RATIO_ONE_CLIENT = 3.0
TEMPLATE = "latency"
PLACEMENT_CAPACITY = 50
_ids = itertools.count()

Call = tuple[str, dict[str, Any]]


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


@dataclass
class Series:
    seconds: list[float]
    failures: int = 0

    @property
    def p50(self) -> float:
        return percentile(self.seconds, 0.5)

    @property
    def p99(self) -> float:
        return percentile(self.seconds, 0.99)


@dataclass
class Row:
    route: str
    clients: int
    api: Series
    floor: Series  # the request's DynamoDB calls, issued directly
    calls: int
    other_seconds: float  # the request's other AWS calls (moto), median of the recorded requests

    def ratio(self) -> float:
        return self.api.p50 / self.floor.p50

    def ratio_with_other_calls(self) -> float:
        return self.api.p50 / (self.floor.p50 + self.other_seconds)

    def render(self) -> str:
        goal = "-"
        if self.clients == 1:
            goal = "met" if self.ratio_with_other_calls() <= GOAL_RATIO_ONE_CLIENT else "NOT met"
        return (
            f"| {self.route} | {self.clients} | {ms(self.api.p50)} | {ms(self.api.p99)} | "
            f"{ms(self.floor.p50)} | {ms(self.floor.p99)} | {self.calls} | {self.ratio():.1f}x | "
            f"{self.api.p99 / self.floor.p99:.1f}x | {ms(self.other_seconds)} | "
            f"{self.ratio_with_other_calls():.1f}x | {self.api.failures} | {goal} |"
        )


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


# ---- the fleet the requests act on -------------------------------------------------------------------


def running_worker(ctx: Context, pool: str) -> Worker:
    worker = workers.create_worker(ctx.store, template=TEMPLATE, region="us-east-1", pool=pool, actor="bench")
    worker = ctx.store.transition_worker(
        worker,
        WorkerStatus.PROVISIONING,
        cause=Cause.CONTROL,
        actor="bench",
        changes={"ec2_instance_id": f"i-{next(_ids):017x}"},
    )
    return ctx.store.transition_worker(worker, WorkerStatus.RUNNING, cause=Cause.EC2, actor="bench")


def busy_workers(ctx: Context, count: int) -> list[tuple[str, str]]:
    """(worker id, instance id) pairs: running workers, each with one instance."""
    pool = f"drain-{uuid.uuid4().hex[:6]}"
    catalog.ensure_pool(ctx.store, pool, actor="bench")
    pairs = []
    for _ in range(count):
        worker = running_worker(ctx, pool)
        instance = placement.place_instance(ctx.store, actor="bench", worker_id=worker.id)
        pairs.append((worker.id, instance.id))
    return pairs


def placement_pool(ctx: Context, placements: int) -> str:
    pool = f"place-{uuid.uuid4().hex[:6]}"
    catalog.ensure_pool(ctx.store, pool, actor="bench")
    for _ in range(math.ceil(placements * 1.5 / PLACEMENT_CAPACITY)):
        running_worker(ctx, pool)
    return pool


def wait_for_tokens(ctx: Context, worker_ids: list[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    waiting = set(worker_ids)
    while waiting and time.monotonic() < deadline:
        waiting = {w for w in waiting if not ((d := ctx.store.get_worker(w).drain) and d.task_token)}
        time.sleep(0.2)
    if waiting:
        raise TimeoutError(f"{len(waiting)} drains never reached their wait")


# ---- requests ---------------------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    body: dict[str, Any] | None = None
    expected: int = 200

    def send(self, session: requests.Session, base_url: str) -> tuple[float, bool]:
        started = time.perf_counter()
        response = session.request(
            self.method,
            base_url + self.path,
            data=json.dumps(self.body) if self.body is not None else None,
            headers={"Content-Type": "application/json"} if self.body is not None else {},
            timeout=60,
        )
        return time.perf_counter() - started, response.status_code == self.expected

    def in_process(self) -> int:
        body = json.dumps(self.body) if self.body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else {}
        return int(call_api(api_event(self.method, self.path, body=body, headers=headers))["statusCode"])


def get_worker(worker_id: str) -> Request:
    return Request("GET", f"/api/v1/workers/{worker_id}")


def drain(worker_id: str) -> Request:
    return Request("POST", f"/api/v1/workers/{worker_id}/drain", {"timeout_seconds": 3600}, expected=202)


def place(pool: str) -> Request:
    return Request("POST", "/api/v1/instances", {"pool": pool, "strategy": "pack"}, expected=201)


def complete(instance_id: str) -> Request:
    return Request("POST", f"/api/v1/instances/{instance_id}/state", {"state": "COMPLETED"})


def over_http(base_url: str, requests_: list[Request], clients: int) -> Series:
    """Send the requests from `clients` threads, each with its own keep-alive connection."""
    shares = [requests_[i::clients] for i in range(clients)]

    def run(share: list[Request]) -> list[tuple[float, bool]]:
        with requests.Session() as session:
            return [request.send(session, base_url) for request in share]

    with ThreadPoolExecutor(clients) as pool:
        results = [result for share in pool.map(run, shares) for result in share]
    return Series([seconds for seconds, _ in results], sum(1 for _, ok in results if not ok))


# ---- the floor --------------------------------------------------------------------------------------


OTHER_SERVICES = ("stepfunctions", "events", "sns")
RECORDINGS = 5  # requests recorded per route: the floor's other-AWS time is their median


@dataclass
class Recording:
    dynamodb: list[Call]  # what the request asked DynamoDB, to replay
    other_seconds: float  # time the request spent in other AWS calls (moto here)


@contextmanager
def recording() -> Iterator[Recording]:
    """What our code asks AWS on this thread (the drain workflow's own calls, made by moto's threads
    meanwhile, are not the request's): DynamoDB calls with their parameters, and the time spent in
    calls to the other services."""
    result = Recording([], 0.0)
    thread = threading.get_ident()
    started: list[float] = []

    def record(params: dict[str, Any], model: Any, **_: Any) -> None:
        if threading.get_ident() == thread:
            result.dynamodb.append((model.name, copy.deepcopy(params)))

    def call_started(**_: Any) -> None:
        if threading.get_ident() == thread:
            started.append(time.perf_counter())

    def call_ended(**_: Any) -> None:
        if threading.get_ident() == thread and started:
            result.other_seconds += time.perf_counter() - started.pop()

    hooks: list[tuple[Any, str, Callable[..., None]]] = [
        (shared_client("dynamodb").meta.events, "provide-client-params.dynamodb.*", record)
    ]
    for service in OTHER_SERVICES:
        events = shared_client(service).meta.events
        hooks += [(events, "before-call.*", call_started), (events, "after-call.*", call_ended)]
    for events, name, hook in hooks:
        events.register(name, hook, unique_id=f"bench-{name}")
    try:
        yield result
    finally:
        for events, name, _ in hooks:
            events.unregister(name, unique_id=f"bench-{name}")


def record(requests_: list[Request]) -> Recording:
    """The first request's DynamoDB calls, and the median time the requests spent in other AWS calls."""
    recordings = []
    for request in requests_:
        with recording() as calls:
            status = request.in_process()
        if status != request.expected:
            raise RuntimeError(f"{request.method} {request.path} answered {status} while recording")
        recordings.append(calls)
    return Recording(recordings[0].dynamodb, statistics.median(r.other_seconds for r in recordings))


def replay(dynamodb: Any, calls: list[Call]) -> float:
    started = time.perf_counter()
    for operation, params in calls:
        # A replayed conditional write fails its condition: evaluated, not applied.
        with contextlib.suppress(ClientError):
            dynamodb._make_api_call(operation, params)
    return time.perf_counter() - started


def floor(calls: list[Call], samples: int, clients: int) -> Series:
    def run(count: int) -> list[float]:
        dynamodb = boto3.client("dynamodb")
        return [replay(dynamodb, calls) for _ in range(count)]

    with ThreadPoolExecutor(clients) as pool:
        shares = pool.map(run, [samples // clients] * clients)
        return Series([seconds for share in shares for seconds in share])


# ---- the run ----------------------------------------------------------------------------------------


def measure(ctx: Context, clients: int, samples: int) -> list[Row]:
    server = ApiServer(port=free_port(), instances=max(2, clients)).start()
    rows = []

    def row(name: str, requests_: list[Request], recorded: Recording) -> None:
        api = over_http(server.url, requests_, clients)
        replayed = floor(recorded.dynamodb, samples, clients)
        rows.append(Row(name, clients, api, replayed, len(recorded.dynamodb), recorded.other_seconds))

    try:
        # Every instance process serves each route once before anything is timed (its cold start).
        warm = busy_workers(ctx, 2 * clients)
        over_http(server.url, [drain(w) for w, _ in warm], clients)
        wait_for_tokens(ctx, [w for w, _ in warm])
        warm_pool = placement_pool(ctx, 2 * clients)
        over_http(
            server.url,
            [complete(i) for _, i in warm]
            + [get_worker(w) for w, _ in warm]
            + [place(warm_pool)] * 2 * clients,
            clients,
        )

        catalog.ensure_pool(ctx.store, "read", actor="bench")
        readers = [running_worker(ctx, "read").id for _ in range(8)]
        recorded = record([get_worker(w) for w in readers[:RECORDINGS]])
        row("GET worker", [get_worker(readers[i % len(readers)]) for i in range(samples)], recorded)

        pool = placement_pool(ctx, samples + RECORDINGS)
        recorded = record([place(pool)] * RECORDINGS)
        row("POST placement (pool, pack)", [place(pool)] * samples, recorded)

        draining = busy_workers(ctx, samples + RECORDINGS)
        recorded = record([drain(w) for w, _ in draining[samples:]])
        row("POST drain", [drain(w) for w, _ in draining[:samples]], recorded)

        wait_for_tokens(ctx, [w for w, _ in draining])
        recorded = record([complete(i) for _, i in draining[samples:]])
        row(
            "POST instance state (the completion that ends a drain)",
            [complete(i) for _, i in draining[:samples]],
            recorded,
        )
    finally:
        server.stop()
    return rows


def render(rows: list[Row], samples: int, seconds: float) -> str:
    one_client = [row for row in rows if row.clients == 1]
    met = all(row.ratio_with_other_calls() <= GOAL_RATIO_ONE_CLIENT for row in one_client)
    lines = [
        "## API latency (bench/api_latency_bench.py)",
        "",
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{datetime.now(UTC):%Y-%m-%d}; {samples} requests per route and client count; {seconds:.0f} s.",
        "The API is the local HTTP server in front of the api handler, one process per client (one request",
        "at a time each, as a Lambda execution environment); the floor is the same request's DynamoDB calls",
        "issued directly (recorded from one request, replayed by as many threads as there are clients).",
        "",
        f"Goal: at 1 client, every route's p50 within {GOAL_RATIO_ONE_CLIENT:.0f}x its DynamoDB floor plus "
        f"its other AWS calls: "
        f"**{'met' if met else 'NOT met'}**.",
        "",
        "| route | clients | API p50 | API p99 | DynamoDB floor p50 | floor p99 | DynamoDB calls | p50 ratio "
        "| p99 ratio | other AWS calls | p50 ratio, floor + other calls | unexpected status | goal |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|",
        *[row.render() for row in rows],
        "",
        "What the ratio holds beyond DynamoDB: HTTP through the local proxy, the handler (routing, pydantic",
        "validation, the response model), and for a drain its StartExecution, for the completion its",
        "SendTaskSuccess, both to moto. On AWS, API Gateway and the Lambda invoke add their own few",
        "milliseconds to the API column, and DynamoDB's own latency (single-digit ms) replaces DynamoDB",
        "Local's. At 8 clients the two cores are shared by 8 API processes, the emulators and the clients.",
        "",
    ]
    return "\n".join(lines)


def run(samples: int = SAMPLES) -> str:
    os.environ.setdefault("POWERTOOLS_METRICS_DISABLED", "true")
    os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "ERROR")
    started = time.perf_counter()
    stack = LocalStack(dynamodb_port=free_port(), moto_port=free_port()).start()
    try:
        os.environ.update(stack.environment())
        activate(provision(stack, f"fk-latency-{uuid.uuid4().hex[:8]}"), heartbeat_seconds=300)
        ctx = default_context()
        catalog.put_template(
            ctx.store,
            WorkerTemplate(
                name=TEMPLATE,
                instance_type="m5.large",
                ami_name_filter="bench-*",
                capacity=PLACEMENT_CAPACITY,
            ),
            actor="bench",
        )
        rows = [row for clients in CLIENTS for row in measure(ctx, clients, samples)]
    finally:
        stack.stop()
    return render(rows, samples, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="API latency against its DynamoDB floor")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="requests per route and client count")
    print(run(parser.parse_args(argv).samples))


if __name__ == "__main__":
    main()
