"""The emulated machines answer Run Command as fleetkeeper's real workers do.

moto's Run Command accepts any instance id and reports every command as a silent success, so a
`collect-system-info` never had output to parse and a machine that could not be reached looked fine.
This module hooks moto's SSM backend (in the moto server's own process, as lambdas.py does for Lambda):

- **Registration.** On AWS only a machine the SSM agent registered is reachable, and the agent registers
  only with an instance profile that grants it Systems Manager. An instance that the emulated EC2 does not
  know, that is terminated or shutting down, or that was launched without an instance profile, answers
  SendCommand with `InvalidInstanceId`, as AWS does. A stopped one is registered but offline: its
  command is not delivered (`TimedOut`, `DeliveryTimedOut`), nor is one whose agent a simulation
  disconnected (health.py).
- **Ping status.** DescribeInstanceInformation (which moto does not have) lists the registered machines
  as Systems Manager does: `Online` while running, `ConnectionLost` while booting, stopping or
  disconnected, a stopped one not at all, with AWS's bounds (MaxResults 5-50, at most 100 filter
  values) and its paging. It honours the filters fleetkeeper uses, `InstanceIds` and `PingStatus`
  (together they must all hold), and refuses any other key rather than ignore it; a call naming an id
  that is not a live machine (unknown, shutting down, terminated) is refused whole with
  `InvalidInstanceId`, as AWS refuses it.
- **The catalogue's documents.** Each command runs what the stage's document runs on a worker image
  (infra/operations.py), against what the emulator knows of the machine:
  - `collect-system-info` prints one JSON object: hostname, instance id, instance type, vCPUs, memory
    and disk (from the instance type and the attached volumes), kernel and uptime;
  - `register-license` reads its `licenseParameter` from Parameter Store, as the document does with the
    instance's role, and fails as the document would (exit 1, `ParameterNotFound`) when it is missing;
  - `deregister-license` releases the license.
  Which operation a document serves comes from the stage's catalogue (`OPERATIONS_CATALOGUE`); a document
  outside it keeps moto's answer.

Only the local stack uses this; it is never shipped to Lambda.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from moto.core.responses import ActionResult
from moto.ec2.models import ec2_backends
from moto.ec2.models.instance_types import INSTANCE_TYPES
from moto.ssm.exceptions import SSMException
from moto.ssm.models import SimpleSystemManagerBackend
from moto.ssm.responses import SimpleSystemManagerResponse

from fleetkeeper.domain.operations import SYSTEM_INFO_OPERATION
from fleetkeeper.settings import get_settings
from fleetkeeper_local import health

UNREACHABLE_STATES: Final = frozenset({"shutting-down", "terminated"})
OFFLINE_STATES: Final = frozenset({"pending", "stopping", "stopped"})
KERNEL: Final = "6.1.0-fleetkeeper-local"


class InvalidInstanceId(SSMException):
    """SendCommand to a machine Systems Manager does not manage (AWS's code and wording)."""

    def __init__(self, instance_id: str, account_id: str) -> None:
        super().__init__(
            "InvalidInstanceId", f"Instances [[{instance_id}]] not in a valid state for account {account_id}"
        )


@dataclass(frozen=True)
class Result:
    """How one command ended on one machine."""

    status: str
    stdout: str = ""
    stderr: str = ""
    code: int = 0
    details: str | None = None


def _instances(backend: SimpleSystemManagerBackend) -> dict[str, Any]:
    """The region's emulated instances that are not shutting down or terminated."""
    ec2 = ec2_backends[backend.account_id][backend.region_name]
    return {
        i.id: i
        for reservation in ec2.reservations.values()
        for i in reservation.instances
        if i.state not in UNREACHABLE_STATES
    }


def _machines(backend: SimpleSystemManagerBackend) -> dict[str, Any]:
    """The region's emulated instances that Systems Manager manages (registered by their agent)."""
    return {i: instance for i, instance in _instances(backend).items() if instance.iam_instance_profile}


def _registered(backend: SimpleSystemManagerBackend, instance_id: str) -> Any:
    """The emulated instance if Run Command reaches it; InvalidInstanceId otherwise."""
    instance = _machines(backend).get(instance_id)
    if instance is None:
        raise InvalidInstanceId(instance_id, backend.account_id)
    return instance


def _offline(instance: Any) -> bool:
    return instance.state in OFFLINE_STATES or health.agent_lost_since(health.tags_of(instance)) is not None


def _operation_of(document: str | None) -> str | None:
    """The catalogue operation whose document this is, in the stage the local stack runs."""
    try:
        catalogue = get_settings().operations_catalogue.operations
    except Exception:  # no settings in this process: nothing to recognise
        return None
    return next((name for name, spec in catalogue.items() if spec.document == document), None)


def _disk_gib(instance: Any) -> int:
    ec2 = instance.ec2_backend
    total = 0
    for _, block in instance.get_block_device_mapping:
        size = block.size
        if size is None and block.volume_id:
            size = ec2.get_volume(block.volume_id).size
        total += int(size or 0)
    return total


def system_info(instance: Any, now: datetime) -> dict[str, Any]:
    """What the collect-system-info document prints on this machine."""
    facts = INSTANCE_TYPES.get(instance.instance_type, {})
    launched = instance.launch_time
    if not isinstance(launched, datetime):
        launched = datetime.fromisoformat(str(launched).replace("Z", "+00:00"))
    if launched.tzinfo is None:
        launched = launched.replace(tzinfo=UTC)  # moto keeps UTC without a zone
    private_ip = str(instance.private_ip or "10.0.0.1")
    return {
        "hostname": f"ip-{private_ip.replace('.', '-')}",
        "instance_id": instance.id,
        "instance_type": instance.instance_type,
        "cpus": int(facts.get("VCpuInfo", {}).get("DefaultVCpus", 1)),
        "memory_mib": int(facts.get("MemoryInfo", {}).get("SizeInMiB", 0)),
        "disk_gib": _disk_gib(instance),
        "kernel": KERNEL,
        "uptime_seconds": max(0, int((now - launched).total_seconds())),
    }


def _register_license(backend: SimpleSystemManagerBackend, parameters: dict[str, list[str]]) -> Result:
    name = (parameters.get("licenseParameter") or [""])[0]
    if not name or backend.get_parameter(name) is None:
        return Result(
            "Failed",
            stderr="An error occurred (ParameterNotFound) when calling the GetParameter operation: "
            f"Parameter {name} not found.",
            code=1,
        )
    return Result("Success", stdout=f"license registered from {name}")


def run(
    backend: SimpleSystemManagerBackend,
    instance: Any,
    document: str | None,
    parameters: dict[str, list[str]],
    now: datetime,
) -> Result | None:
    """The result of the document on the machine; None for a document outside the catalogue."""
    if _offline(instance):
        return Result("TimedOut", code=-1, details="DeliveryTimedOut")
    operation = _operation_of(document)
    if operation == SYSTEM_INFO_OPERATION:
        return Result("Success", stdout=json.dumps(system_info(instance, now)) + "\n")
    if operation == "register-license":
        return _register_license(backend, parameters)
    if operation == "deregister-license":
        return Result("Success", stdout="license released")
    return None


def _answer(command: Any, results: dict[str, Result]) -> None:
    for invocation in command.invocations:
        result = results.get(invocation["InstanceId"])
        if result is None:
            continue
        invocation.update(
            Status=result.status,
            StatusDetails=result.details or result.status,
            ResponseCode=result.code,
            StandardOutputContent=result.stdout,
            StandardErrorContent=result.stderr,
        )
    statuses = {r.status for r in results.values()}
    if statuses - {"Success"}:
        command.status = next(iter(sorted(statuses - {"Success"})))
        command.status_details = command.status
        command.error_count = sum(1 for r in results.values() if r.status != "Success")


_lock = threading.Lock()
_installed = False


def install() -> None:
    """Make moto's SSM backend answer as the machines would (once per process)."""
    global _installed  # noqa: PLW0603 - one patch per process, by design
    with _lock:
        if _installed:
            return
        original: Callable[..., Any] = SimpleSystemManagerBackend.send_command

        def send_command(self: SimpleSystemManagerBackend, **kwargs: Any) -> Any:
            machines = {i: _registered(self, i) for i in kwargs.get("instance_ids") or []}
            command = original(self, **kwargs)
            now = datetime.now(UTC)
            document, parameters = kwargs.get("document_name"), kwargs.get("parameters") or {}
            results = {
                instance_id: result
                for instance_id, machine in machines.items()
                if (result := run(self, machine, document, parameters, now))
            }
            _answer(command, results)
            return command

        SimpleSystemManagerBackend.send_command = send_command  # type: ignore[method-assign,assignment]
        # moto has no CancelCommand; the operations' timeouts and cancels call it.
        SimpleSystemManagerBackend.cancel_command = _cancel_command  # type: ignore[attr-defined]
        SimpleSystemManagerResponse.cancel_command = _cancel_command_answer  # type: ignore[attr-defined]
        # Nor DescribeInstanceInformation; discovery's health sweep reads the agents' ping with it.
        SimpleSystemManagerResponse.describe_instance_information = _describe_information  # type: ignore[attr-defined]
        _installed = True


# An invocation that has not ended yet; AWS leaves an ended one as it is when its command is cancelled.
_CANCELLABLE: Final = frozenset({"Pending", "InProgress", "Delayed"})


def _cancel_command(backend: SimpleSystemManagerBackend, command_id: str, instance_ids: list[str]) -> None:
    """CancelCommand as SSM answers it: unknown id InvalidCommandId, else the named (or every) invocation
    that has not ended is Cancelled."""
    command = backend.get_command_by_id(command_id)
    for invocation in command.invocations:
        if instance_ids and invocation["InstanceId"] not in instance_ids:
            continue
        if invocation.get("Status") in _CANCELLABLE:
            invocation.update(Status="Cancelled", StatusDetails="Cancelled")


def _cancel_command_answer(response: SimpleSystemManagerResponse) -> ActionResult:
    _cancel_command(
        response.ssm_backend, response._get_param("CommandId"), response._get_param("InstanceIds", [])
    )
    return ActionResult({})


# DescribeInstanceInformation's bounds on AWS.
INFORMATION_MAX_RESULTS: Final = 50
INFORMATION_MIN_RESULTS: Final = 5
FILTER_VALUES_MAX: Final = 100


# The filter keys the emulator honours; AWS knows more, and one it would honour is never ignored here.
_FILTER_KEYS: Final = frozenset({"InstanceIds", "PingStatus"})


def _filters(response: SimpleSystemManagerResponse) -> dict[str, set[str]]:
    """The request's filters (either form, not both: AWS refuses that) by key, each within AWS's bounds
    on its values."""
    current = response._get_param("Filters") or []
    legacy = response._get_param("InstanceInformationFilterList") or []
    if current and legacy:
        raise SSMException(
            "ValidationException", "Filters and InstanceInformationFilterList exclude each other"
        )
    entries = [(e.get("Key"), e.get("Values")) for e in current]
    entries += [(e.get("key"), e.get("valueSet")) for e in legacy]
    found: dict[str, set[str]] = {}
    for key, values in entries:
        if key not in _FILTER_KEYS:
            raise SSMException("ValidationException", f"the local stack does not emulate filter key {key}")
        listed = list(values or [])
        if not 1 <= len(listed) <= FILTER_VALUES_MAX:
            raise SSMException(
                "ValidationException", f"a filter takes 1 to {FILTER_VALUES_MAX} values, not {len(listed)}"
            )
        found[str(key)] = set(listed)
    return found


def information(instance: Any, now: datetime) -> dict[str, Any]:
    """What Systems Manager says of one registered machine that is not stopped."""
    lost = health.agent_lost_since(health.tags_of(instance))
    online = lost is None and instance.state not in OFFLINE_STATES
    return {
        "InstanceId": instance.id,
        "PingStatus": "Online" if online else "ConnectionLost",
        "LastPingDateTime": (now if online else lost or now).timestamp(),
        "PlatformType": "Linux",
        "ResourceType": "EC2Instance",
        "IPAddress": str(instance.private_ip or ""),
    }


def _describe_information(response: SimpleSystemManagerResponse) -> ActionResult:
    size = int(response._get_param("MaxResults") or INFORMATION_MAX_RESULTS)
    if not INFORMATION_MIN_RESULTS <= size <= INFORMATION_MAX_RESULTS:
        raise SSMException(
            "ValidationException",
            f"MaxResults must be from {INFORMATION_MIN_RESULTS} to {INFORMATION_MAX_RESULTS}, not {size}",
        )
    backend = response.ssm_backend
    filters = _filters(response)
    wanted = filters.get("InstanceIds")
    if wanted is not None:
        invalid = sorted(wanted - _instances(backend).keys())
        if invalid:
            raise InvalidInstanceId(invalid[0], backend.account_id)
    now = datetime.now(UTC)
    listed = {
        i: information(machine, now)
        for i, machine in _machines(backend).items()
        if machine.state != "stopped" and (wanted is None or i in wanted)
    }
    pings = filters.get("PingStatus")
    ids = sorted(i for i, info in listed.items() if pings is None or info["PingStatus"] in pings)
    start = int(response._get_param("NextToken") or 0)
    answer: dict[str, Any] = {"InstanceInformationList": [listed[i] for i in ids[start : start + size]]}
    if start + size < len(ids):
        answer["NextToken"] = str(start + size)
    return ActionResult(answer)
