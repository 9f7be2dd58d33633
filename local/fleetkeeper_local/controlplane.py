"""The local control plane: the same handlers and ASL file as on AWS, on the emulated stack.

- the drain state machine is created on moto's Step Functions from infra/statemachines/drain.asl.json;
- its Lambda tasks run our drain_tasks handler in-process (see lambdas.py);
- an HTTP server on 127.0.0.1 turns requests into API Gateway REST proxy events for the api handler.
"""

from __future__ import annotations

import io
import json
import os
import threading
import time
import uuid
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import boto3

from fleetkeeper.cloud.clients import reset_clients
from fleetkeeper.services.context import default_context
from fleetkeeper.settings import get_settings
from fleetkeeper_local import lambdas
from fleetkeeper_local.stack import LocalStack, project_root
from functions.api.handler import handler as api_handler
from functions.drain_tasks.handler import handler as drain_tasks_handler

ASL_PATH = Path("infra") / "statemachines" / "drain.asl.json"
LOCAL_ACCOUNT = "123456789012"
DEFAULT_CALLER = f"arn:aws:iam::{LOCAL_ACCOUNT}:user/local-operator"


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

    def environment(self, heartbeat_seconds: int) -> dict[str, str]:
        return {
            "TABLE_NAME": self.table_name,
            "DRAIN_STATE_MACHINE_ARN": self.state_machine_arn,
            "AUDIT_BUS_NAME": self.audit_bus_name,
            "NOTIFICATION_TOPIC_ARN": self.topic_arn,
            "DRAIN_HEARTBEAT_SECONDS": str(heartbeat_seconds),
        }


def provision(stack: LocalStack, table_name: str, *, suffix: str | None = None) -> LocalResources:
    """Create the table, the drain_tasks function, the state machine, the audit bus and the topic."""
    suffix = suffix or uuid.uuid4().hex[:8]
    stack.create_table(table_name)
    lambdas.install().register(f"fleetkeeper-drain-tasks-{suffix}", drain_tasks_handler)
    iam = boto3.client("iam")
    role_name = f"fleetkeeper-local-{suffix}"
    trust = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Principal": {"Service": ["lambda.amazonaws.com", "states.amazonaws.com"]},
                "Action": "sts:AssumeRole",
            }
        ],
    }
    role_arn = iam.create_role(RoleName=role_name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    function_arn = boto3.client("lambda").create_function(
        FunctionName=f"fleetkeeper-drain-tasks-{suffix}",
        Runtime="python3.12",
        Role=role_arn,
        Handler="handler.handler",
        Code={"ZipFile": _placeholder_zip()},
    )["FunctionArn"]
    state_machine_arn = boto3.client("stepfunctions").create_state_machine(
        name=f"fleetkeeper-drain-{suffix}",
        definition=drain_definition(function_arn),
        roleArn=role_arn,
        type="STANDARD",
    )["stateMachineArn"]
    bus_name = f"fleetkeeper-audit-{suffix}"
    boto3.client("events").create_event_bus(Name=bus_name)
    topic_arn = boto3.client("sns").create_topic(Name=f"fleetkeeper-alerts-{suffix}")["TopicArn"]
    return LocalResources(table_name, state_machine_arn, function_arn, bus_name, topic_arn)


def activate(resources: LocalResources, heartbeat_seconds: int = 300) -> None:
    """Point this process's settings and cached clients at the provisioned resources."""
    os.environ.update(resources.environment(heartbeat_seconds))
    refresh_process_caches()


def refresh_process_caches() -> None:
    get_settings.cache_clear()
    default_context.cache_clear()
    reset_clients()


# ---- API Gateway proxy events ---------------------------------------------------------------------


def api_event(
    method: str,
    path: str,
    *,
    body: str | None = None,
    query: dict[str, str] | None = None,
    headers: dict[str, str] | None = None,
    caller: str = DEFAULT_CALLER,
    source_ip: str = "127.0.0.1",
) -> dict[str, Any]:
    """A REST API proxy-integration event, as API Gateway sends it for `/{proxy+}` with AWS_IAM auth."""
    headers = dict(headers or {})
    request_id = str(uuid.uuid4())
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {k: [v] for k, v in headers.items()},
        "queryStringParameters": dict(query) if query else None,
        "multiValueQueryStringParameters": {k: [v] for k, v in query.items()} if query else None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "path": f"/local{path}",
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


def call_api(event: dict[str, Any]) -> dict[str, Any]:
    return dict(api_handler(event, lambdas.LocalLambdaContext(function_name="fleetkeeper-api")))


class _ApiRequestHandler(BaseHTTPRequestHandler):
    caller = DEFAULT_CALLER

    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        # API Gateway hands text bodies over as they came; undecodable bytes must not crash the adapter.
        body = self.rfile.read(length).decode("utf-8", errors="replace") if length else None
        event = api_event(
            self.command,
            unquote(url.path),
            body=body,
            query=dict(parse_qsl(url.query, keep_blank_values=True)) or None,
            headers={k: v for k, v in self.headers.items()},
            caller=self.headers.get("X-Fleetkeeper-Caller") or self.caller,
            source_ip=self.client_address[0],
        )
        response = call_api(event)
        payload = (response.get("body") or "").encode()
        self.send_response(int(response["statusCode"]))
        for name, value in (response.get("headers") or {}).items():
            self.send_header(name, str(value))
        for name, values in (response.get("multiValueHeaders") or {}).items():
            for value in values:
                self.send_header(name, str(value))
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def __getattr__(self, name: str) -> Any:
        # Every method goes to the resolver, which answers 404 for what it does not route, as API Gateway
        # answers a 4xx for a method it has no integration for.
        if name.startswith("do_"):
            return self._serve
        raise AttributeError(name)

    def log_message(self, format: str, *args: Any) -> None:
        if os.environ.get("FLEETKEEPER_LOCAL_ACCESS_LOG"):
            super().log_message(format, *args)


@dataclass
class ApiServer:
    """The admin API on http://127.0.0.1:<port>, served by the api handler in-process."""

    port: int = 8080
    _server: ThreadingHTTPServer | None = field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ApiServer:
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), _ApiRequestHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="api-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
