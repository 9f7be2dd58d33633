"""The request recorder: every AWS request a function makes is evaluated against its deployed policies.

Two botocore handlers, installed through the fault layer's mechanism (`faults.installed_hooks`): the API
parameters are kept when the request is built (`before-parameter-build`), and at `before-call` the
request is attributed to a function (attribution.py), translated into what AWS authorizes (requests.py),
each authorization is evaluated for the function's role (policies.py, evaluator.py), and the outcome is
recorded (record.py). A denied request fails as AWS fails it, with the service's own error (EC2's
UnauthorizedOperation, SNS's AuthorizationError, the JSON services' AccessDeniedException), and never
reaches the emulator; with `enforce=False` it is only recorded. A request no decision is reached for goes
on to the emulator, and fails the run instead.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from types import CodeType
from typing import Any, Final

import fleetkeeper
from fleetkeeper.settings import Settings, SettingsError, get_settings
from fleetkeeper_local.faults import HookSpec, HttpAnswer, installed_hooks, service_and_operation
from fleetkeeper_local.iam.attribution import SETUP, UNATTRIBUTED, attribute
from fleetkeeper_local.iam.emulator import Emulator, Lookups
from fleetkeeper_local.iam.evaluator import Decision, Evaluator
from fleetkeeper_local.iam.policies import CANONICAL, PolicyModel
from fleetkeeper_local.iam.record import ALLOWED, DENIED, ERROR, MISSING, UNMODELLED, Outcome, Summary
from fleetkeeper_local.iam.requests import (
    Authorization,
    Environment,
    Localizer,
    MissingResource,
    Request,
    Unmodelled,
    authorizations,
)
from fleetkeeper_local.stack import provisioned

_PARAMS: Final = "fleetkeeper_iam_params"
_PACKAGE: Final = str(Path(fleetkeeper.__file__).resolve().parent) + "/"
_ADAPTERS: Final = ("cloud/", "store/")
_IDEMPOTENCY: Final = "aws_lambda_powertools/utilities/idempotency/"
# Set while a request is judged: whatever the judging itself asks AWS is not a request to judge.
_judging: ContextVar[bool] = ContextVar("fleetkeeper_iam_judging", default=False)

# How each service answers a request its caller may not make.
_DENIAL_ANSWERS: Final = {
    "ec2": ("UnauthorizedOperation", 403),
    "sns": ("AuthorizationError", 403),
    "cloudwatch": ("AccessDenied", 403),
}


def referenced_keys(model: PolicyModel) -> frozenset[str]:
    """Every condition key (lower case) any of the model's policies reads, in conditions or variables."""
    found: set[str] = set()

    def walk(value: Any, in_condition: bool) -> None:
        if isinstance(value, Mapping):
            for key, item in value.items():
                if in_condition and isinstance(item, Mapping):
                    found.update(str(k).lower() for k in item)
                walk(item, in_condition or key == "Condition")
        elif isinstance(value, list):
            for item in value:
                walk(item, in_condition)
        elif isinstance(value, str) and "${" in value:
            found.update(part.split("}", 1)[0].lower() for part in value.split("${")[1:])

    for document in model.identity_documents():
        walk(document["policy"], False)
    for document in model.resource_documents().values():
        walk(document, False)
    return frozenset(found)


def code_path() -> str:
    """Where in fleetkeeper the current request comes from: the use case, then the adapter it called."""
    frame = sys._getframe(1)
    site: str | None = None
    idempotency = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if site is None and _IDEMPOTENCY in filename:
            idempotency = True
        if filename.startswith(_PACKAGE):
            relative = filename.removeprefix(_PACKAGE)
            where = f"{relative}:{_qualname(frame.f_code)}"
            if site is None:
                site = where
                if not relative.startswith(_ADAPTERS):
                    break
            elif not relative.startswith(_ADAPTERS):
                return f"{where} -> {site}"
        frame = frame.f_back  # type: ignore[assignment]
    path = site or "outside fleetkeeper"
    return f"{path} (idempotency record)" if idempotency else path


def _qualname(code: CodeType) -> str:
    return code.co_qualname.split(".<locals>", 1)[0]


def _resource_account(resource: str, caller: str) -> str:
    parts = resource.split(":", 5)
    return parts[4] if len(parts) > 5 and parts[4] else caller


class Recorder:
    """Evaluates and records the requests made inside a function (see attribution.py)."""

    def __init__(
        self,
        model: PolicyModel,
        *,
        summary: Summary,
        enforce: bool = True,
        evaluator: Evaluator | None = None,
        lookups: Lookups | None = None,
    ) -> None:
        self.model = model
        self.summary = summary
        self.enforce = enforce
        self.evaluator = evaluator or Evaluator()
        self.lookups = lookups or Emulator()
        self.evaluator.define(model.set_id, model.identity_documents(), model.resource_documents())
        self._keys = referenced_keys(model)
        self.enabled = True
        self._lock = threading.Lock()
        self._localizer_key: tuple[Any, ...] | None = None
        self._localizer_cache = Localizer(None)

    # ---- botocore handlers ------------------------------------------------------------------------

    def specs(self) -> list[HookSpec]:
        return [("before-parameter-build", self.remember_params), ("before-call", self.before_call)]

    def remember_params(self, params: Mapping[str, Any], context: Any = None, **_: Any) -> None:
        if self.enabled and isinstance(context, dict):
            context[_PARAMS] = params

    def before_call(
        self, event_name: str, context: Any = None, request_signer: Any = None, **_: Any
    ) -> tuple[HttpAnswer, dict[str, Any]] | None:
        if not self.enabled or _judging.get():
            return None
        started = time.thread_time()
        token = _judging.set(True)
        try:
            service, operation = service_and_operation(event_name)
            params = context.get(_PARAMS, {}) if isinstance(context, dict) else {}
            region = getattr(request_signer, "region_name", None) or CANONICAL.region
            function = attribute(sys._getframe(1))
            request = Request(service, operation, params, region)
            return self.check(function, request, path=code_path() if function != SETUP else "")
        finally:
            _judging.reset(token)
            spent = time.thread_time() - started
            with self._lock:
                self.summary.add_cost("hook_cpu_seconds", spent)

    # ---- evaluation -------------------------------------------------------------------------------

    def _localizer(self) -> Localizer:
        try:
            settings: Settings | None = get_settings()
        except SettingsError:
            settings = None
        stage = provisioned()
        key = (
            (
                settings.table_name,
                settings.audit_bus_name,
                settings.drain_state_machine_arn,
                settings.notification_topic_arn,
                settings.worker_instance_profile,
            )
            if settings is not None
            else None,
            tuple(sorted((kind, len(found)) for kind, found in stage.items())),
        )
        with self._lock:
            if self._localizer_key != key:
                self._localizer_cache = Localizer(settings, stage)
                self._localizer_key = key
            return self._localizer_cache

    def check(
        self, function: str, request: Request, *, path: str = "test"
    ) -> tuple[HttpAnswer, dict[str, Any]] | None:
        """Judge and record one request of `function`; the denial answer when it is denied and enforced."""
        outcome = self.judge(function, request)
        with self._lock:
            self.summary.record(
                function,
                f"{request.service}:{request.operation}",
                outcome,
                path=path,
                # Under pytest, the test (and its phase) that made it: a failure is found from its test.
                during=os.environ.get("PYTEST_CURRENT_TEST", ""),
            )
        if outcome.kind != DENIED or not self.enforce:
            return None
        one, decision = outcome.denied[0]
        return denial_answer(request.service, self.model.functions[function].principal, one, decision)

    def judge(self, function: str, request: Request) -> Outcome:
        """The one place a request's outcome is decided (record.py names the kinds)."""
        if function == SETUP:
            return Outcome(SETUP)
        if function == UNATTRIBUTED:
            return Outcome(
                UNATTRIBUTED,
                error="fleetkeeper's code on a thread that did not copy its invocation's context "
                "(fleetkeeper.pool.ContextThreadPool does)",
            )
        if function not in self.model.functions:
            return Outcome(UNMODELLED, error=f"the template has no function {function}")
        try:
            decisions = tuple(self.decisions(function, request))
        except Unmodelled as exc:
            return Outcome(UNMODELLED, error=f"no authorization model for {exc}")
        except MissingResource as exc:
            return Outcome(
                MISSING,
                error=f"{exc} is unknown to the emulator, so the conditions on it cannot be decided "
                "(AWS denies a tag-conditioned action on it)",
            )
        except Exception as exc:  # the run fails on it, not the code under test, which may swallow it
            return Outcome(ERROR, error=f"{type(exc).__name__}: {exc}")
        denied = any(not decision.allowed for _, decision in decisions)
        return Outcome(DENIED if denied else ALLOWED, decisions)

    def decisions(
        self, function: str, request: Request, *, localizer: Localizer | None = None
    ) -> list[tuple[Authorization, Decision]]:
        """Each authorization the request needs, with the evaluator's decision for `function`'s role.

        Raises Unmodelled or MissingResource when the request cannot be evaluated.
        """
        env = Environment(self.lookups, localizer or self._localizer(), self.model)
        needed = authorizations(request, env)
        return [(one, self.decide(function, one)) for one in needed]

    def decide(self, function: str, authorization: Authorization) -> Decision:
        """The evaluator's decision for one authorization of `function`'s role."""
        identity = self.model.functions[function]
        context = {k: v for k, v in authorization.context.items() if k.lower() in self._keys}
        return self.evaluator.evaluate(
            self.model.set_id,
            principal=identity.principal,
            action=authorization.action,
            resource=authorization.resource,
            account=_resource_account(authorization.resource, CANONICAL.account),
            context=context,
            identity=[policy.name for policy in identity.policies],
            resource_policy=self.model.resource_policy_for(authorization.resource),
        )

    @contextmanager
    def installed(self) -> Iterator[Recorder]:
        """Record (and with `enforce`, refuse) the requests of every client created inside the block."""
        with self._lock:
            self.summary.recorders += 1
        try:
            with installed_hooks(self.specs()):
                yield self
        finally:
            self.evaluator.close()
            with self._lock:
                self.summary.add_cost("evaluator_cpu_seconds", self.evaluator.cpu_seconds)
                self.summary.add_cost("evaluations", self.evaluator.evaluations)


def denial_answer(
    service: str, principal: str, authorization: Authorization, decision: Decision
) -> tuple[HttpAnswer, dict[str, Any]]:
    """The error AWS answers when `principal` may not make this request, in the service's shape."""
    code, status = _DENIAL_ANSWERS.get(service, ("AccessDeniedException", 400))
    explicit = decision.result == "ExplicitlyDenied"
    kind = (
        "identity-based"
        if any("identity" in d for d in decision.denials) or not decision.denials
        else "resource-based"
    )
    because = (
        f"with an explicit deny in a {kind} policy"
        if explicit
        else f"because no {kind} policy allows the {authorization.action} action"
    )
    message = (
        f"User: {principal} is not authorized to perform: {authorization.action} on resource: "
        f"{authorization.resource} {because}"
    )
    if service == "ec2":
        # EC2 hides the details in an encoded message (sts:DecodeAuthorizationMessage); this one is plain.
        encoded = base64.b64encode(
            json.dumps(
                {"allowed": False, "explicitDeny": explicit, "matchedStatements": list(decision.denials)}
            ).encode()
        ).decode()
        message = (
            f"You are not authorized to perform this operation. {message}. "
            f"Encoded authorization failure message: {encoded}"
        )
    body = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": status, "RetryAttempts": 0},
    }
    return HttpAnswer(status), body
