"""The admin API over HTTP: which URL, how requests are signed, and how errors come back.

Deployed stages authorize every method with AWS_IAM, so requests to them are SigV4-signed with
botocore's signer and the caller's normal credential chain (environment, profiles, SSO, assumed roles),
and go through requests (proxies, CA bundles). The local control plane authenticates no one: requests to
a loopback address go unsigned over the standard library's HTTP client, so a local command loads
neither botocore nor requests, and a refused connection is reported at once.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode, urlsplit

if TYPE_CHECKING:
    import http.client

    import requests

# The local control plane (`make run`) serves on FLEETKEEPER_API_PORT, 8080 unless set: the CLI follows it.
LOCAL_PORT = 8080
LOCAL_PORT_ENV = "FLEETKEEPER_API_PORT"
LOCAL_API = f"http://127.0.0.1:{LOCAL_PORT}"
API_ENV = "FLEETKEEPER_API"
API_URL_OUTPUT = "ApiUrl"
SERVICE = "execute-api"
TIMEOUT_SECONDS = 30
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# https://<api-id>.execute-api.<region>.amazonaws.com/<stage>/
_EXECUTE_API_HOST = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?$")


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1  # a drain failed or timed out, a rollout failed or was cancelled, or the API failed
    USAGE = 2
    NOT_FOUND_OR_CONFLICT = 3
    AUTH = 4


class CliError(Exception):
    """Ends the command with one readable line on stderr and an exit code."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code


def exit_code_for(status: int) -> ExitCode:
    if status in (401, 403):
        return ExitCode.AUTH
    if status in (404, 409):
        return ExitCode.NOT_FOUND_OR_CONFLICT
    if status in (400, 415, 422):
        return ExitCode.USAGE
    return ExitCode.FAILED


class ApiError(CliError):
    """An answer of 4xx or 5xx, with the API's error code."""

    def __init__(self, status: int, code: str, message: str, body: Any = None) -> None:
        super().__init__(f"{code} ({status}): {message}", exit_code_for(status))
        self.status = status
        self.code = code
        self.body = body


@dataclass(frozen=True)
class Answer:
    """What came back: the status, its reason phrase and the body."""

    status: int
    reason: str
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


def _api_error(response: Answer) -> ApiError:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "error" in body:
        message = str(body.get("message") or "")
        details = body.get("details")
        if isinstance(details, list) and details:
            # A rule broken by one field already says "field: reason" in the message: say it once.
            said = [f"{d.get('field')}: {d.get('reason')}" for d in details if isinstance(d, dict)]
            fields = "; ".join(text for text in said if text not in message)
            message = f"{message} ({fields})" if fields else message
        return ApiError(response.status, str(body["error"]), message, body)
    # API Gateway's own refusals (a missing or bad signature) say {"message": ...} and no code.
    text = body.get("message") if isinstance(body, dict) else None
    code = {401: "UNAUTHORIZED", 403: "FORBIDDEN"}.get(response.status, "HTTP_ERROR")
    return ApiError(response.status, code, str(text or response.reason or "no message"), body)


def is_local(url: str) -> bool:
    return (urlsplit(url).hostname or "") in LOOPBACK_HOSTS


def region_of(url: str) -> str | None:
    match = _EXECUTE_API_HOST.search(urlsplit(url).hostname or "")
    return match.group(1) if match else None


def _botocore_session(profile: str | None) -> Any:
    import botocore.session  # noqa: PLC0415 - only a deployed stage's calls need botocore

    return botocore.session.Session(profile=profile)


def stack_api_url(stack: str, *, region: str | None = None, profile: str | None = None) -> str:
    """The `ApiUrl` output of a deployed fleetkeeper stack (CloudFormation DescribeStacks)."""
    import boto3  # noqa: PLC0415 - only --stack needs boto3
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError  # noqa: PLC0415

    session = boto3.Session(profile_name=profile, region_name=region)
    try:
        stacks = session.client("cloudformation").describe_stacks(StackName=stack)["Stacks"]
    except NoCredentialsError as exc:
        raise CliError(f"no AWS credentials to read stack {stack}: {exc}", ExitCode.AUTH) from exc
    except ClientError as exc:
        error = exc.response.get("Error", {})
        code, message = str(error.get("Code", "")), str(error.get("Message", exc))
        if "does not exist" in message:
            raise CliError(f"stack {stack} not found: {message}", ExitCode.NOT_FOUND_OR_CONFLICT) from exc
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
        raise CliError(f"{code} ({status}): {message}", exit_code_for(status)) from exc
    except BotoCoreError as exc:
        raise CliError(f"cannot read stack {stack}: {exc}", ExitCode.FAILED) from exc
    for output in stacks[0].get("Outputs", []) if stacks else []:
        if output.get("OutputKey") == API_URL_OUTPUT:
            return str(output["OutputValue"])
    raise CliError(f"stack {stack} has no {API_URL_OUTPUT} output", ExitCode.NOT_FOUND_OR_CONFLICT)


@dataclass(frozen=True)
class ApiTarget:
    url: str
    source: str | None = None  # what chose it, when neither --api nor the default did


def local_api() -> ApiTarget:
    """The local control plane, on the port `make run` uses (FLEETKEEPER_API_PORT, default 8080)."""
    port = os.environ.get(LOCAL_PORT_ENV, "").strip()
    if not port:
        return ApiTarget(LOCAL_API)
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise CliError(f"{LOCAL_PORT_ENV}={port!r} is not a port number", ExitCode.USAGE)
    url = f"http://127.0.0.1:{int(port)}"
    return ApiTarget(url, None if url == LOCAL_API else f"{LOCAL_PORT_ENV}={int(port)}")


def resolve_api_target(
    api: str | None, stack: str | None, *, region: str | None = None, profile: str | None = None
) -> ApiTarget:
    """--api, then --stack, then $FLEETKEEPER_API, then the local control plane on $FLEETKEEPER_API_PORT."""
    if api and stack:
        raise CliError("give --api or --stack, not both", ExitCode.USAGE)
    if api:
        return ApiTarget(api)
    if stack:
        return ApiTarget(stack_api_url(stack, region=region, profile=profile), f"stack {stack}")
    if os.environ.get(API_ENV):
        return ApiTarget(os.environ[API_ENV], API_ENV)
    return local_api()


def resolve_api_url(
    api: str | None, stack: str | None, *, region: str | None = None, profile: str | None = None
) -> str:
    return resolve_api_target(api, stack, region=region, profile=profile).url


class _Loopback:
    """One kept-alive connection to a loopback API: the standard library's client, no proxy, no TLS."""

    def __init__(self, base_url: str, timeout: float) -> None:
        parts = urlsplit(base_url)
        self._host, self._port, self._timeout = parts.hostname or "127.0.0.1", parts.port or 80, timeout
        self._connection: http.client.HTTPConnection | None = None

    def send(self, method: str, url: str, body: str | None, headers: dict[str, str]) -> Answer:
        import http.client  # noqa: PLC0415 - `--help` and usage errors start without it

        parts = urlsplit(url)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        reused = self._connection is not None
        if self._connection is None:
            self._connection = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        try:
            self._connection.request(method, target, body=body, headers=headers)
            response = self._connection.getresponse()
            return Answer(response.status, response.reason, response.read())
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self._connection.close()
            self._connection = None
            if not reused:
                raise
            # The server closed a connection kept from an earlier call: one new connection, once.
            return self.send(method, url, body, headers)


@dataclass
class ApiClient:
    """JSON over HTTP to the admin API; signs every request for a deployed stage."""

    base_url: str
    region: str | None = None
    profile: str | None = None
    sign: bool | None = None  # None: sign unless the API is on a loopback address
    timeout: float = TIMEOUT_SECONDS
    _transport: Any = field(default=None, init=False, repr=False)
    _credentials: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        if self.sign is None:
            self.sign = not is_local(self.base_url)

    def _signing_region(self) -> str:
        region = region_of(self.base_url) or self.region or os.environ.get("AWS_REGION")
        region = (
            region
            or os.environ.get("AWS_DEFAULT_REGION")
            or _botocore_session(self.profile).get_config_variable("region")
        )
        if not region:
            raise CliError("cannot tell the API's region: pass --region or set AWS_REGION", ExitCode.USAGE)
        return str(region)

    def _frozen_credentials(self) -> Any:
        if self._credentials is None:
            credentials = _botocore_session(self.profile).get_credentials()
            if credentials is None:
                raise CliError(
                    "no AWS credentials found to sign the request (environment, profile, SSO or role); "
                    "run `aws sso login` or set AWS_PROFILE",
                    ExitCode.AUTH,
                )
            self._credentials = credentials
        return self._credentials.get_frozen_credentials()

    def _signed_headers(
        self, method: str, url: str, body: str | None, headers: dict[str, str]
    ) -> dict[str, str]:
        from botocore.auth import SigV4Auth  # noqa: PLC0415 - a deployed stage's calls only
        from botocore.awsrequest import AWSRequest  # noqa: PLC0415

        request = AWSRequest(method=method, url=url, data=body or None, headers=headers)
        SigV4Auth(self._frozen_credentials(), SERVICE, self._signing_region()).add_auth(request)
        return dict(request.headers.items())

    def _send(self, method: str, url: str, body: str | None, headers: dict[str, str]) -> Answer:
        local = urlsplit(self.base_url).scheme == "http" and is_local(self.base_url)
        if local:
            if self._transport is None:
                self._transport = _Loopback(self.base_url, self.timeout)
            try:
                answer: Answer = self._transport.send(method, url, body, headers)
            except TimeoutError as exc:
                raise self._timed_out() from exc
            except OSError as exc:  # refused, reset: nothing listens there
                raise self._unreachable() from exc
            return answer
        import requests  # noqa: PLC0415 - only a remote API needs proxies and CA bundles

        if self._transport is None:
            self._transport = requests.Session()
        session: requests.Session = self._transport
        try:
            response = session.request(method, url, data=body, headers=headers, timeout=self.timeout)
        except requests.ConnectionError as exc:
            raise self._unreachable() from exc
        except requests.Timeout as exc:
            raise self._timed_out() from exc
        return Answer(response.status_code, response.reason or "", response.content)

    def _unreachable(self) -> CliError:
        local = is_local(self.base_url)
        hint = f" (is `make run` running there? it serves on ${LOCAL_PORT_ENV})" if local else ""
        return CliError(f"cannot reach the API at {self.base_url}{hint}", ExitCode.FAILED)

    def _timed_out(self) -> CliError:
        return CliError(f"the API at {self.base_url} did not answer in {self.timeout:g} s", ExitCode.FAILED)

    def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: dict[str, Any] | None = None,
    ) -> Any:
        params = {k: str(v) for k, v in (query or {}).items() if v is not None}
        url = f"{self.base_url}{path}" + (f"?{urlencode(sorted(params.items()))}" if params else "")
        data = json.dumps(body) if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.sign:
            headers = self._signed_headers(method, url, data, headers)
        response = self._send(method, url, data, headers)
        if response.status >= 400:
            raise _api_error(response)
        if not response.content:
            return None
        return response.json()

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body=body if body is not None else {})

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body=body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body=body)

    def pages(self, path: str, **query: Any) -> list[Any]:
        """Every item of a paginated listing, following next_token."""
        items: list[Any] = []
        token: str | None = None
        while True:
            page = self.get(path, **query, next_token=token)
            items.extend(page.get("items", []))
            token = page.get("next_token")
            if not token:
                return items
