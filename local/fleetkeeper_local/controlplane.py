"""The local control plane: the same handlers and ASL file as on AWS, on the emulated stack.

- the drain state machine is created on moto's Step Functions from infra/statemachines/drain.asl.json;
- its Lambda tasks run our drain_tasks handler in-process (see lambdas.py);
- an HTTP server on 127.0.0.1 turns requests into API Gateway REST proxy events for the api handler,
  one event at a time per instance as Lambda runs them; several instances run as processes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import boto3
from botocore import handlers as botocore_handlers

from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.services.context import default_context
from fleetkeeper.settings import get_settings
from fleetkeeper_local import aws_rules, faults, lambdas
from fleetkeeper_local.console import hide_metrics_when_disabled
from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.iam.attribution import acting_as
from fleetkeeper_local.stack import (
    API_PORT_ENVIRONMENT,
    LOCAL_ACCOUNT,
    LocalStack,
    _wait_for_http,
    binding,
    free_port,
    moto_generation,
    project_root,
    remember_provisioned,
)
from functions.api.handler import handler as api_handler
from functions.drain_tasks.handler import handler as drain_tasks_handler

ASL_PATH = Path("infra") / "statemachines" / "drain.asl.json"
DEFAULT_CALLER = f"arn:aws:iam::{LOCAL_ACCOUNT}:user/local-operator"
# The local stage's one tooling principal: the internal routes answer it, and not the default operator.
TOOLING_CALLER = f"arn:aws:iam::{LOCAL_ACCOUNT}:role/fleetkeeper-local-tooling"
# The role the local workers' agents would report their health with.
WORKER_AGENT_CALLER = f"arn:aws:iam::{LOCAL_ACCOUNT}:role/fleetkeeper-local-worker-agent"


def worker_agent_session(instance_id: str) -> str:
    """How API Gateway names a machine's agent calling with its instance profile: a session of the
    worker-agent role named after the instance."""
    return f"arn:aws:sts::{LOCAL_ACCOUNT}:assumed-role/fleetkeeper-local-worker-agent/{instance_id}"


def drain_definition(function_arn: str) -> str:
    """The ASL file with its one substitution resolved, exactly as CDK does at deploy time."""
    text = (project_root() / ASL_PATH).read_text()
    return text.replace("${DrainTaskFunctionArn}", function_arn)


def _placeholder_zip() -> bytes:
    # moto wants code for create_function; invocations never run it (lambdas.py answers them).
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(
            "handler.py", "def handler(event, context):\n    raise RuntimeError('served in-process')\n"
        )
    return buffer.getvalue()


@dataclass
class LocalResources:
    table_name: str
    state_machine_arn: str
    drain_function_arn: str
    audit_bus_name: str
    topic_arn: str
    instance_profile: str

    def environment(self, heartbeat_seconds: int) -> dict[str, str]:
        return {
            "WORKER_INSTANCE_PROFILE": self.instance_profile,
            "TABLE_NAME": self.table_name,
            "DRAIN_STATE_MACHINE_ARN": self.state_machine_arn,
            "AUDIT_BUS_NAME": self.audit_bus_name,
            "NOTIFICATION_TOPIC_ARN": self.topic_arn,
            "DRAIN_HEARTBEAT_SECONDS": str(heartbeat_seconds),
            "OPERATIONS_CATALOGUE": json.dumps(local_operations_catalogue()),
            "INSTANCE_TYPES": ",".join(local_instance_types()),
            "TOOLING_PRINCIPALS": TOOLING_CALLER,
            "WORKER_AGENT_PRINCIPALS": WORKER_AGENT_CALLER,
        }


@functools.cache
def _dev_stage() -> dict[str, Any]:
    context = json.loads((project_root() / "cdk.json").read_text(encoding="utf-8"))["context"]
    stage: dict[str, Any] = context["fleetkeeper:stages"]["dev"]
    return stage


def local_operations_catalogue() -> dict[str, Any]:
    """The dev stage's operations catalogue from cdk.json: the local stack offers what dev deploys
    (moto's Run Command accepts any document name and reports every command as a success)."""
    catalogue: dict[str, Any] = _dev_stage()["operations"]["catalogue"]
    return catalogue


def local_instance_types() -> list[str]:
    """The instance types the dev stage may launch (cdk.json): the local API refuses others as dev's."""
    return list(_dev_stage()["instance_types"])


# The workers' instance profile, as a stage's stack creates it (infra/worker_profile.py): the reconciler
# launches with it, as do the seed and a restart, and the emulated SSM agent registers only a machine
# that has one (machines.py). One per moto server, shared by every control plane on it.
LOCAL_WORKER_PROFILE = "fleetkeeper-local-worker"
# (moto endpoint, moto generation) where the profile is known to exist: until moto is reset it stays.
_profiles_made: set[tuple[str | None, int]] = set()


def ensure_worker_profile() -> str:
    """The workers' instance profile and its role on the emulated IAM (created if missing); its name."""
    key = (os.environ.get("AWS_ENDPOINT_URL"), moto_generation())
    if key in _profiles_made:
        return LOCAL_WORKER_PROFILE
    iam = _setup("iam")
    try:
        iam.get_instance_profile(InstanceProfileName=LOCAL_WORKER_PROFILE)
        _profiles_made.add(key)
        return LOCAL_WORKER_PROFILE
    except iam.exceptions.NoSuchEntityException:
        pass
    # Two processes on one moto server (a test process and make run, two API instances) may both get
    # here: whichever creates a part second finds it there, which is what it wanted.
    with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
        iam.create_role(
            RoleName=LOCAL_WORKER_PROFILE, AssumeRolePolicyDocument=json.dumps(_trust("ec2.amazonaws.com"))
        )
    with contextlib.suppress(iam.exceptions.EntityAlreadyExistsException):
        iam.create_instance_profile(InstanceProfileName=LOCAL_WORKER_PROFILE)
    with contextlib.suppress(iam.exceptions.LimitExceededException):
        # A profile holds one role: the limit answer means the other process added it already.
        iam.add_role_to_instance_profile(
            InstanceProfileName=LOCAL_WORKER_PROFILE, RoleName=LOCAL_WORKER_PROFILE
        )
    _profiles_made.add(key)
    return LOCAL_WORKER_PROFILE


@functools.cache
def _setup_client(service: str, endpoint: str | None) -> Any:
    """Clients for provisioning, one per service and endpoint: the test suite provisions a control plane
    for nearly every test, and a new client costs more CPU than the calls it makes."""
    return boto3.client(service, endpoint_url=endpoint)  # type: ignore[call-overload]


def _setup(service: str) -> Any:
    return _setup_client(service, os.environ.get("AWS_ENDPOINT_URL"))


def _trust(*services: str) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Principal": {"Service": list(services)}, "Action": "sts:AssumeRole"}
        ],
    }


@dataclass(frozen=True)
class _SharedParts:
    role_arn: str
    function_arn: str


# The drain_tasks function and its role, per (moto endpoint, moto generation): every control plane on one
# emulator shares them, as a test observes neither, until a reset forgets them. Their names never change,
# so neither does the drain definition's text, which moto then parses once per process (stack.py).
_shared_parts: dict[tuple[str | None, int], _SharedParts] = {}
_shared_lock = threading.Lock()


def _drain_function() -> _SharedParts:
    key = (os.environ.get("AWS_ENDPOINT_URL"), moto_generation())
    with _shared_lock:
        if key not in _shared_parts:
            iam = _setup("iam")
            trust = json.dumps(_trust("lambda.amazonaws.com", "states.amazonaws.com"))
            role_arn = iam.create_role(
                RoleName="fleetkeeper-local-drain-tasks", AssumeRolePolicyDocument=trust
            )["Role"]["Arn"]
            function_arn = _setup("lambda").create_function(
                FunctionName="fleetkeeper-drain-tasks",
                Runtime="python3.12",
                Role=role_arn,
                Handler="handler.handler",
                Code={"ZipFile": _placeholder_zip()},
            )["FunctionArn"]
            _shared_parts[key] = _SharedParts(role_arn, function_arn)
        return _shared_parts[key]


def provision(stack: LocalStack, table_name: str, *, suffix: str | None = None) -> LocalResources:
    """Create the table, the state machine, the audit bus and the topic, on the drain_tasks function and
    the workers' instance profile (created once per emulator and shared).

    The parts a test observes (the state machine's executions, the bus's rules, the topic's
    subscriptions) are new for every call; moto validates each definition text once (stack.py)."""
    suffix = suffix or uuid.uuid4().hex[:8]
    profile = ensure_worker_profile()
    shared = _drain_function()
    lambdas.install().register(shared.function_arn.split(":")[-1], drain_tasks_handler)
    state_machine_arn = _setup("stepfunctions").create_state_machine(
        name=f"fleetkeeper-drain-{suffix}",
        definition=drain_definition(shared.function_arn),
        roleArn=shared.role_arn,
        type="STANDARD",
    )["stateMachineArn"]
    bus_name = f"fleetkeeper-audit-{suffix}"
    _setup("events").create_event_bus(Name=bus_name)
    topic_arn = _setup("sns").create_topic(Name=f"fleetkeeper-alerts-{suffix}")["TopicArn"]
    remember_provisioned("state-machine", state_machine_arn)
    remember_provisioned("bus", bus_name)
    remember_provisioned("topic", topic_arn)
    # Last: the moto resources above are made while a JVM just launched still boots.
    stack.create_table(table_name)
    return LocalResources(table_name, state_machine_arn, shared.function_arn, bus_name, topic_arn, profile)


def activate(resources: LocalResources, heartbeat_seconds: int = 300) -> None:
    """Point this process's settings and cached clients at the provisioned resources."""
    os.environ.update(resources.environment(heartbeat_seconds))
    refresh_process_caches()


# What the process's cached clients were made under: the AWS variables (endpoints, credentials, region)
# and botocore's built-in handlers, where the local layers hook in (faults.installed_hooks).
_clients_made_under: tuple[Any, ...] | None = None


def _client_inputs() -> tuple[Any, ...]:
    variables = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return variables, tuple(botocore_handlers.BUILTIN_HANDLERS)


def refresh_process_caches() -> None:
    """Settings and the service context read afresh from the environment. The clients are made again
    only when what they were made under changed: six new clients cost more CPU than most tests' calls."""
    global _clients_made_under  # noqa: PLW0603 - one record per process, as the clients are
    get_settings.cache_clear()
    default_context.cache_clear()
    inputs = _client_inputs()
    if inputs != _clients_made_under:
        reset_clients()
        _clients_made_under = inputs


# ---- API Gateway proxy events ---------------------------------------------------------------------


def api_event(
    method: str,
    path: str,
    *,
    body: str | None = None,
    query: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
    headers: dict[str, str] | None = None,
    caller: str = DEFAULT_CALLER,
    source_ip: str = "127.0.0.1",
) -> dict[str, Any]:
    """A REST API proxy-integration event, as API Gateway sends it for `/{proxy+}` with AWS_IAM auth.

    `query` is a mapping, or the query's (name, value) pairs in order when a name repeats: API Gateway
    then puts every value in multiValueQueryStringParameters and the last one in queryStringParameters."""
    headers = dict(headers or {})
    request_id = str(uuid.uuid4())
    pairs = list(query.items()) if isinstance(query, Mapping) else list(query or [])
    values: dict[str, list[str]] = {}
    for name, value in pairs:
        values.setdefault(name, []).append(value)
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": {k: v[-1] for k, v in values.items()} if values else None,
        "multiValueQueryStringParameters": values or None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            # The local server has no stage in its URLs, as a custom domain mapped at its root: a stage
            # prefix here would make /docs send Swagger UI's calls to /local/api/..., which 404.
            "path": path,
            "stage": "local",
            "requestId": request_id,
            "accountId": LOCAL_ACCOUNT,
            "apiId": "local",
            "requestTimeEpoch": int(time.time() * 1000),
            "identity": {
                "userArn": caller,
                "caller": caller.rsplit("/", 1)[-1],
                "sourceIp": source_ip,
                "accountId": LOCAL_ACCOUNT,
            },
        },
        "body": body,
        "isBase64Encoded": False,
    }


# ---- the HTTP adapter: API Gateway in front of "Lambda instances" ---------------------------------

# Lambda runs one event at a time per execution environment, and Powertools relies on that: the
# resolver keeps the current event, the route's path arguments and the appended context on itself.
# A threaded server sharing the one module-level resolver would hand one request's body, path and
# caller to another. So every invocation in this process goes through this lock, exactly as one
# Lambda instance serves one event; concurrency comes from running several instances (processes).
_INVOCATION_LOCK = threading.Lock()

# Instance processes answer these paths themselves (never the resolver); only the harnesses that
# started them use them, on the instance's own port.
LOCAL_CONTROL_PREFIX = "/_local/"
FAULTS_ENVIRONMENT = "FLEETKEEPER_LOCAL_FAULTS"
API_INSTANCES_ENVIRONMENT = "FLEETKEEPER_LOCAL_API_INSTANCES"
_FORWARDED_FOR = "X-Forwarded-For"
_HOP_BY_HOP = frozenset({"connection", "keep-alive", "transfer-encoding", "content-length", "host"})


def call_api(event: dict[str, Any]) -> dict[str, Any]:
    """Invoke the api handler with one event, one at a time in this process (one Lambda instance)."""
    with _INVOCATION_LOCK, acting_as("api"):
        return dict(api_handler(event, lambdas.LocalLambdaContext(function_name="fleetkeeper-api")))


def _respond(
    handler: BaseHTTPRequestHandler, status: int, headers: list[tuple[str, str]], payload: bytes
) -> None:
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(payload)))
    handler.end_headers()
    handler.wfile.write(payload)


class _LocalServer(ThreadingHTTPServer):
    # The standard library listens with a backlog of 5; a burst of concurrent clients beyond that gets
    # its connections reset before any request is read. API Gateway queues far more than that.
    request_queue_size = 128
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that left before its answer (a timeout, Ctrl-C) is not a fault of the server: no
        # traceback for it in the console.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _LocalHandler(BaseHTTPRequestHandler):
    # HTTP/1.1 keeps the proxy's connections to an instance open between requests.
    protocol_version = "HTTP/1.1"
    # The headers and the body leave in two writes. With Nagle's algorithm the body then waits for the
    # client's delayed ACK of the headers on a kept-alive connection: 40 ms on every answer.
    disable_nagle_algorithm = True

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def __getattr__(self, name: str) -> Any:
        # Every method goes to _serve; the resolver answers 404 for what it does not route, as API
        # Gateway answers a 4xx for a method it has no integration for.
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def _serve(self) -> None:
        raise NotImplementedError

    def log_message(self, format: str, *args: Any) -> None:
        if os.environ.get("FLEETKEEPER_LOCAL_ACCESS_LOG"):
            super().log_message(format, *args)


class _ApiRequestHandler(_LocalHandler):
    """Turns one HTTP request into an API Gateway proxy event for the api handler in this process."""

    caller = DEFAULT_CALLER

    def _serve(self) -> None:
        url = urlsplit(self.path)
        raw = self._body()
        if url.path.startswith(LOCAL_CONTROL_PREFIX):
            self._control(url.path, raw)
            return
        # API Gateway hands text bodies over as they came; undecodable bytes must not crash the adapter.
        body = raw.decode("utf-8", errors="replace") if raw else None
        event = api_event(
            self.command,
            unquote(url.path),
            body=body,
            query=parse_qsl(url.query, keep_blank_values=True),
            headers={k: v for k, v in self.headers.items() if k != _FORWARDED_FOR},
            caller=self.headers.get("X-Fleetkeeper-Caller") or self.caller,
            source_ip=self.headers.get(_FORWARDED_FOR) or self.client_address[0],
        )
        response = call_api(event)
        headers = [(name, str(value)) for name, value in (response.get("headers") or {}).items()]
        for name, values in (response.get("multiValueHeaders") or {}).items():
            headers.extend((name, str(value)) for value in values)
        _respond(self, int(response["statusCode"]), headers, (response.get("body") or "").encode())

    def _control(self, path: str, raw: bytes) -> None:
        """`GET /_local/faults`: faults injected and calls throttled by the AWS rules here;
        `POST /_local/faults {"enabled": b}`: switch the faults."""
        plan = _process_fault_plan
        if path != f"{LOCAL_CONTROL_PREFIX}faults" or plan is None:
            _respond(self, 404, [("Content-Type", "application/json")], b'{"error": "NOT_FOUND"}')
            return
        if self.command == "POST":
            plan.enabled = bool(json.loads(raw or b"{}").get("enabled", True))
        rules = aws_rules.process_rules()
        throttled = rules.summary() if rules is not None else {}
        answer = {"enabled": plan.enabled, "injected": plan.summary(), "throttled": throttled}
        body = json.dumps(answer).encode()
        _respond(self, 200, [("Content-Type", "application/json")], body)


# ---- several instances: processes behind one front door, like Lambda's concurrency ---------------


class _Instance:
    """One API instance process, with the kept-alive connection of whoever holds it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._connection: http.client.HTTPConnection | None = None

    def forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        for attempt in range(2):
            if self._connection is None:
                self._connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            try:
                self._connection.request(method, path, body=body or None, headers=headers)
                response = self._connection.getresponse()
                payload = response.read()
            except (ConnectionError, http.client.HTTPException):
                # A kept-alive connection the instance closed: reconnect once.
                self._connection.close()
                self._connection = None
                if attempt:
                    raise
                continue
            answer = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
            return response.status, answer, payload
        raise AssertionError("unreachable")


class _ProxyServer(_LocalServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], instances: queue.Queue[_Instance]) -> None:
        super().__init__(address, _ProxyHandler)
        self.instances = instances


class _ProxyHandler(_LocalHandler):
    """Hands each request to a free instance; when all are busy it waits for one (Lambda would
    start another instance or throttle, a local user would rather have the answer)."""

    server: _ProxyServer

    def _serve(self) -> None:
        raw = self._body()
        if urlsplit(self.path).path.startswith(LOCAL_CONTROL_PREFIX):
            _respond(self, 404, [("Content-Type", "application/json")], b'{"error": "NOT_FOUND"}')
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers[_FORWARDED_FOR] = self.client_address[0]
        instance = self.server.instances.get()
        try:
            status, answer_headers, payload = instance.forward(self.command, self.path, headers, raw)
        finally:
            self.server.instances.put(instance)
        _respond(self, status, answer_headers, payload)


def fault_plan_from_environ(index: int = 0) -> faults.FaultPlan | None:
    """The fault plan FLEETKEEPER_LOCAL_FAULTS describes, for an API instance process.

    The value is JSON: `{"seed": 7, "faults": [{"kind": "dynamodb_conflicts", "rate": 0.03}],
    "index_lag_seconds": 0.5, "index_old_images": true}`; each kind names one of the ready-made faults
    in faults.py; the index lag shows old images unless `index_old_images` is false. Instance
    `index` draws from seed + index, so instances fail differently yet every run repeats.
    """
    raw = os.environ.get(FAULTS_ENVIRONMENT)
    if not raw:
        return None
    spec = json.loads(raw)
    made: list[faults.Fault] = []
    for entry in spec.get("faults", []):
        factory = FAULT_KINDS.get(entry["kind"])
        if factory is None:
            raise ValueError(f"{FAULTS_ENVIRONMENT}: unknown fault kind {entry['kind']!r}")
        made.append(factory(float(entry["rate"])))
    return faults.FaultPlan(
        int(spec.get("seed", 0)) + index,
        made,
        index_lag_seconds=float(spec.get("index_lag_seconds", 0)),
        index_old_images=bool(spec.get("index_old_images", True)),
    )


FAULT_KINDS: dict[str, Callable[[float], faults.Fault]] = {
    "dynamodb_conflicts": faults.dynamodb_conflicts,
    "dynamodb_throttling": faults.dynamodb_throttling,
    "dynamodb_throughput": faults.dynamodb_throughput,
    "dynamodb_lost_answers": faults.dynamodb_lost_answers,
    "ec2_lost_answers": faults.ec2_lost_answers,
    "sfn_lost_answers": faults.sfn_lost_answers,
    "ec2_throttling": faults.ec2_throttling,
    "ec2_server_error": faults.ec2_server_error,
    "ec2_no_capacity": faults.ec2_no_capacity,
    "sfn_throttling": faults.sfn_throttling,
    "sfn_task_does_not_exist": faults.sfn_task_does_not_exist,
    "sfn_task_timed_out": faults.sfn_task_timed_out,
}

_process_fault_plan: faults.FaultPlan | None = None


@dataclass
class ApiServer:
    """The admin API on http://127.0.0.1:<port>.

    With one instance (the default) the api handler runs in this process, one request at a time. With
    `instances` > 1 (or FLEETKEEPER_LOCAL_API_INSTANCES) each instance is its own process, as each
    Lambda execution environment is, and this port forwards every request to a free one; they share
    the table and the emulators, so concurrent requests race in DynamoDB as they do on AWS. Instance
    processes read the environment at start (activate() first) and install the fault plan that
    FLEETKEEPER_LOCAL_FAULTS describes, each with its own seed (seed + its index).
    """

    port: int = 8080
    instances: int = field(default_factory=lambda: int(os.environ.get(API_INSTANCES_ENVIRONMENT, "1")))
    log_path: Path | None = None  # instance processes' output goes here (default: this console)
    _server: ThreadingHTTPServer | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False, repr=False)
    backend_urls: list[str] = field(default_factory=list, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiServer:
        if self.instances <= 1:
            with binding(self.port, "the admin API", API_PORT_ENVIRONMENT):
                self._server = _LocalServer(("127.0.0.1", self.port), _ApiRequestHandler)
        else:
            instances: queue.Queue[_Instance] = queue.Queue()
            try:
                for index in range(self.instances):
                    instances.put(self._start_instance(index))
                with binding(self.port, "the admin API", API_PORT_ENVIRONMENT):
                    self._server = _ProxyServer(("127.0.0.1", self.port), instances)
            except BaseException:
                self.stop()
                raise
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="api-server", daemon=True)
        self._thread.start()
        return self

    def _start_instance(self, index: int) -> _Instance:
        port = free_port()
        env = {**os.environ, "FLEETKEEPER_LOCAL_INSTANCE_INDEX": str(index)}
        with contextlib.ExitStack() as files:
            output = files.enter_context(self.log_path.open("ab")) if self.log_path else None
            # Its own session: a Ctrl-C in the terminal reaches the control plane, which stops it.
            process = subprocess.Popen(  # noqa: S603 - our own module, fixed argv
                [sys.executable, "-m", "fleetkeeper_local.controlplane", "--port", str(port)],
                cwd=project_root(),
                env=env,
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
                start_new_session=True,
            )
        self._processes.append(process)
        url = f"http://127.0.0.1:{port}"
        _wait_for_http(f"{url}/openapi.json", timeout=60, process=process)
        self.backend_urls.append(url)
        return _Instance(port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        for process in self._processes:
            process.terminate()
        for process in self._processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self._processes.clear()
        self.backend_urls.clear()


def serve_instance(port: int) -> None:
    """One API instance process, serving until SIGTERM (requests still run one at a time)."""
    global _process_fault_plan  # noqa: PLW0603 - one plan per instance process, by design
    hide_metrics_when_disabled()
    aws_rules.install_from_environ()  # before the fault plan, as the harness process installs them
    plan = fault_plan_from_environ(int(os.environ.get("FLEETKEEPER_LOCAL_INSTANCE_INDEX", "0")))
    server = _LocalServer(("127.0.0.1", port), _ApiRequestHandler)
    server.daemon_threads = True
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with contextlib.ExitStack() as active:
        # Before the fault plan, so a request the role may not make is refused before any fault.
        active.enter_context(iam_session.recording())
        active.callback(
            iam_session.write_record, f".instance-{os.environ.get('FLEETKEEPER_LOCAL_INSTANCE_INDEX', '0')}"
        )
        if plan is not None:
            _process_fault_plan = active.enter_context(plan.installed())
        thread = threading.Thread(target=server.serve_forever, name="api-instance", daemon=True)
        thread.start()
        with contextlib.suppress(KeyboardInterrupt):
            while not stop.wait(0.5):
                pass
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one local API instance (ApiServer starts these)")
    parser.add_argument("--port", type=int, required=True)
    serve_instance(parser.parse_args().port)
