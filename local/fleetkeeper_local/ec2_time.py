"""The emulated machines take time to boot, and an instance type can run out of capacity, as on EC2.

moto runs a machine the moment RunInstances or StartInstances answers, and never lacks capacity, so
PROVISIONING and STARTING lasted one reconcile step and nothing measured how long a machine takes to come
up. This module hooks moto's EC2 (in the moto server's own process, as health.py and machines.py do):

- **Boot time.** A launched machine is `pending` for `launch_seconds`, a started one for `start_seconds`,
  then `running`; every read of its state after that moment says so (nothing ticks in the background).
  The delays come from `FLEETKEEPER_LOCAL_LAUNCH_SECONDS` and `FLEETKEEPER_LOCAL_START_SECONDS` (default
  3 and 2 s), `python -m fleetkeeper_local run --launch-seconds/--start-seconds`, or `configure()`; the
  test harness sets 0, which is moto's own behaviour. A machine keeps the delay it was launched with.
- **Stopped machines.** moto keeps a stopped machine's instance id and volumes, as EC2 does for an
  EBS-backed instance (tests/integration/test_local_ec2_time.py holds it to that).
- **No capacity.** An instance type marked out of capacity in a region is refused by RunInstances and
  StartInstances with EC2's `InsufficientInstanceCapacity` (HTTP 500, EC2's messages). The mark is a tag
  on the region's default VPC, so `python -m fleetkeeper_local simulate ice m5.large [--off]` from another
  process reaches a running stack, and the reset between tests clears it. A mark may also hold a number
  of machines left: launches and starts take from it, and what it cannot hold is refused.
- **Batches.** RunInstances launches as many machines as capacity allows up to MaxCount, and refuses the
  call only below MinCount (moto launches MinCount); each machine says its `AmiLaunchIndex` (moto's own).
  A call repeating an earlier ClientToken answers that call's machines instead of launching again, as
  EC2's idempotency does (for ever here, not for EC2's window), and is refused with other parameters
  (`IdempotentParameterMismatch`). Every machine of a call gets its instance profile (moto gives it to
  the first one only).

Only the local stack uses this; it is never shipped to Lambda.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final
from xml.sax.saxutils import escape

from werkzeug.exceptions import HTTPException

LAUNCH_ENVIRONMENT: Final = "FLEETKEEPER_LOCAL_LAUNCH_SECONDS"
START_ENVIRONMENT: Final = "FLEETKEEPER_LOCAL_START_SECONDS"
DEFAULT_LAUNCH_SECONDS: Final = 3.0
DEFAULT_START_SECONDS: Final = 2.0
NO_CAPACITY_TAG_PREFIX: Final = "fleetkeeper-local:no-capacity:"
INSUFFICIENT_CAPACITY: Final = "InsufficientInstanceCapacity"
_NONE_LEFT: Final = "on"
_PENDING: Final = ("pending", 0)
_RUNNING: Final = ("running", 16)


@dataclass(frozen=True)
class Delays:
    """How long a machine is `pending` after a launch and after a start."""

    launch_seconds: float = DEFAULT_LAUNCH_SECONDS
    start_seconds: float = DEFAULT_START_SECONDS

    @classmethod
    def from_environ(cls) -> Delays:
        return cls(
            launch_seconds=_seconds(LAUNCH_ENVIRONMENT, DEFAULT_LAUNCH_SECONDS),
            start_seconds=_seconds(START_ENVIRONMENT, DEFAULT_START_SECONDS),
        )


def _seconds(variable: str, default: float) -> float:
    raw = os.environ.get(variable)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{variable} must be a number of seconds, not {raw!r}") from None
    if value < 0:
        raise ValueError(f"{variable} must be 0 or more, not {raw!r}")
    return value


_delays = Delays.from_environ()
_lock = threading.Lock()
_installed = False


def configure(delays: Delays) -> None:
    """The delays of the machines launched or started from now on, in this process's moto."""
    global _delays  # noqa: PLW0603 - the emulator's one clock setting, by design
    _delays = delays


def current() -> Delays:
    return _delays


@contextlib.contextmanager
def delayed(delays: Delays) -> Iterator[Delays]:
    """These delays inside the block, the ones before it after."""
    before = _delays
    configure(delays)
    try:
        yield delays
    finally:
        configure(before)


def instant() -> contextlib.AbstractContextManager[Delays]:
    """Machines that run at once: what stands for machines that exist already (the demo fleet)."""
    return delayed(Delays(0.0, 0.0))


# ---- no capacity ---------------------------------------------------------------------------------


def _default_vpc_id(ec2: Any) -> str:
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    if not vpcs:
        raise ValueError("the region has no default VPC to hold the capacity marks")
    return str(vpcs[0]["VpcId"])


def set_capacity(ec2: Any, instance_type: str, *, available: bool | int) -> None:
    """Mark an instance type out of capacity in the client's region, give it back (True), or leave it
    that many machines (a number: launches and starts take from it until none is left)."""
    vpc_id = _default_vpc_id(ec2)
    key = NO_CAPACITY_TAG_PREFIX + instance_type
    if available is True:
        ec2.delete_tags(Resources=[vpc_id], Tags=[{"Key": key}])
    else:
        ec2.create_tags(
            Resources=[vpc_id],
            Tags=[{"Key": key, "Value": _NONE_LEFT if available is False else str(available)}],
        )


def _capacity_left(backend: Any) -> dict[str, int]:
    """Machines left per instance type the region limits (0: out of capacity); a type not named has no
    limit."""
    vpc = backend.get_default_vpc()
    if vpc is None:
        return {}
    tags: dict[str, str] = backend.tags.get(vpc.id, {})
    return {
        key.removeprefix(NO_CAPACITY_TAG_PREFIX): int(value) if value.isdigit() else 0
        for key, value in tags.items()
        if key.startswith(NO_CAPACITY_TAG_PREFIX)
    }


def _take_capacity(backend: Any, instance_type: str, machines: int) -> None:
    left = _capacity_left(backend).get(instance_type)
    if left is not None:
        vpc = backend.get_default_vpc()
        backend.create_tags([vpc.id], {NO_CAPACITY_TAG_PREFIX + instance_type: str(left - machines)})


class Ec2Refusal(HTTPException):
    """An EC2 error answer: its code and message in EC2's XML."""

    code = 400
    error = ""

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message
        self.description = (
            '<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
            f"<Code>{self.error}</Code><Message>{escape(message)}</Message>"
            "</Error></Errors><RequestID>fleetkeeper-local</RequestID></Response>"
        )

    def get_headers(self, *args: Any, **kwargs: Any) -> list[tuple[str, str]]:
        return [("Content-Type", "text/xml")]


class InsufficientInstanceCapacity(Ec2Refusal):
    """EC2's answer when it has no machine of the type to give: a server error (HTTP 500)."""

    code = 500
    error = INSUFFICIENT_CAPACITY


class IdempotentParameterMismatch(Ec2Refusal):
    """EC2's answer to a ClientToken sent again with other parameters: another request, refused."""

    error = "IdempotentParameterMismatch"


def launch_refusal(instance_type: str, zone: str) -> str:
    """RunInstances' message, as EC2 words it for one Availability Zone."""
    return (
        f"We currently do not have sufficient {instance_type} capacity in the Availability Zone you "
        f"requested ({zone}). Our system will be working on provisioning additional capacity."
    )


# StartInstances' message (EC2 does not name the type there).
START_REFUSAL: Final = "Insufficient capacity."


# ---- the hooks -------------------------------------------------------------------------------------


def _state_of(instance: Any) -> Any:
    state = instance.__dict__["_fk_state"]
    ready_at = instance.__dict__.get("_fk_ready_at")
    if ready_at is not None and state.name == _PENDING[0] and time.monotonic() >= ready_at:
        state.name, state.code = _RUNNING
        instance.__dict__["_fk_ready_at"] = None
    return state


def _set_state(instance: Any, state: Any) -> None:
    instance.__dict__["_fk_state"] = state


def _boot(instance: Any, seconds: float) -> None:
    """Pending for `seconds` from now (running at once for 0)."""
    if seconds <= 0:
        return
    state = instance.__dict__["_fk_state"]
    state.name, state.code = _PENDING
    instance.__dict__["_fk_ready_at"] = time.monotonic() + seconds


# What the RunInstances being answered on this thread asked for, which moto's backend is not given.
_asked = threading.local()


def _launched_with(backend: Any, client_token: str) -> Any:
    """The reservation an earlier RunInstances with this ClientToken made, if any."""
    for reservation in backend.reservations.values():
        if any(getattr(i, "client_token", None) == client_token for i in reservation.instances):
            return reservation
    return None


def _hook_launches() -> None:
    """Capacity on launches and starts, and RunInstances answering as EC2 does for a batch."""
    from moto.core.responses import ActionResult  # noqa: PLC0415 - moto loads here
    from moto.ec2.models.instances import InstanceBackend  # noqa: PLC0415 - moto loads here
    from moto.ec2.responses.instances import InstanceResponse  # noqa: PLC0415 - moto loads here

    original_run: Callable[..., Any] = InstanceBackend.run_instances
    original_start_instances: Callable[..., Any] = InstanceBackend.start_instances
    original_answer: Callable[..., Any] = InstanceResponse.run_instances

    def run_instances(self: Any, image_id: str, count: int, *args: Any, **kwargs: Any) -> Any:
        instance_type = kwargs.get("instance_type", "m1.small")
        wanted = max(getattr(_asked, "max_count", count), count)
        left = _capacity_left(self).get(instance_type, wanted)
        if left < count:
            zone = kwargs.get("placement") or f"{self.region_name}a"
            raise InsufficientInstanceCapacity(launch_refusal(instance_type, zone))
        launched = original_run(self, image_id, min(wanted, left), *args, **kwargs)
        _take_capacity(self, instance_type, len(launched.instances))
        return launched

    def start_instances(self: Any, instance_ids: list[str]) -> Any:
        stopped = Counter(
            i.instance_type for i in self.get_multi_instances_by_id(instance_ids) if i.state == "stopped"
        )
        left = _capacity_left(self)
        if any(n > left.get(kind, n) for kind, n in stopped.items()):
            raise InsufficientInstanceCapacity(START_REFUSAL)
        for kind, n in stopped.items():
            _take_capacity(self, kind, n)
        return original_start_instances(self, instance_ids)

    def answer_run_instances(self: Any) -> Any:
        token = self._get_param("ClientToken")
        earlier = _launched_with(self.ec2_backend, token) if token else None
        asked = sorted((k, tuple(v)) for k, v in self.querystring.items() if k != "ClientToken")
        if earlier is not None:
            if earlier.__dict__.get("_fk_asked", asked) != asked:
                raise IdempotentParameterMismatch(f"Arguments on this idempotent request ({token}) differ")
            return ActionResult(earlier)
        _asked.max_count = int(self._get_param("MaxCount", if_none="1"))
        try:
            answer = original_answer(self)
        finally:
            del _asked.max_count
        answer.result.__dict__["_fk_asked"] = asked
        profile = {
            "iam_instance_profile_name": self._get_param("IamInstanceProfile.Name"),
            "iam_instance_profile_arn": self._get_param("IamInstanceProfile.Arn"),
        }
        if any(profile.values()):
            for instance in answer.result.instances[1:]:
                self.ec2_backend.associate_iam_instance_profile(instance_id=instance.id, **profile)
        return answer

    InstanceBackend.run_instances = run_instances  # type: ignore[method-assign]
    InstanceBackend.start_instances = start_instances  # type: ignore[method-assign]
    InstanceResponse.run_instances = answer_run_instances  # type: ignore[method-assign]


def install() -> None:
    """Boot delays, capacity and batch launches in moto's EC2 (once per process)."""
    global _installed  # noqa: PLW0603 - one patch per process, by design
    with _lock:
        if _installed:
            return
        from moto.ec2.models.instances import Instance  # noqa: PLC0415 - moto loads here

        # Every read and write of a machine's state goes through `_state`: reading it is where time passes.
        Instance._state = property(_state_of, _set_state)  # type: ignore[assignment]
        original_init: Callable[..., None] = Instance.__init__
        original_start: Callable[..., Any] = Instance.start

        def init(self: Any, *args: Any, **kwargs: Any) -> None:
            original_init(self, *args, **kwargs)
            _boot(self, _delays.launch_seconds)

        def start(self: Any) -> Any:
            previous = original_start(self)
            if previous.name == "stopped":
                _boot(self, _delays.start_seconds)
            return previous

        Instance.__init__ = init  # type: ignore[method-assign]
        Instance.start = start  # type: ignore[method-assign]
        _hook_launches()
        _installed = True
