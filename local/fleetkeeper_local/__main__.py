"""`python -m fleetkeeper_local run`: the local control plane on the emulated AWS stack.

A start overlaps its slow parts: DynamoDB Local's JVM boots, and the IAM template is synthesized when
its inputs changed, each in a process of its own, while this one imports the control plane (serve.py),
starts moto and seeds the fleet. This module imports nothing heavy before they have started.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fleetkeeper_local.ec2_time import (
    DEFAULT_LAUNCH_SECONDS,
    DEFAULT_START_SECONDS,
    LAUNCH_ENVIRONMENT,
    START_ENVIRONMENT,
)
from fleetkeeper_local.iam import session as iam_session
from fleetkeeper_local.iam.policies import TemplateState, template_path, template_state
from fleetkeeper_local.stack import (
    API_PORT_ENVIRONMENT,
    DATA_DIR_ENV,
    DEFAULT_API_PORT,
    LOCAL_REGION,
    LocalStack,
    LocalStackError,
    ensure_port_free,
)

# Console defaults: warnings only, and no EMF metric blobs between the lines people read.
QUIET_POWERTOOLS = {"POWERTOOLS_LOG_LEVEL": "WARNING", "POWERTOOLS_METRICS_DISABLED": "true"}
VERBOSE_POWERTOOLS = {"POWERTOOLS_LOG_LEVEL": "INFO", "POWERTOOLS_METRICS_DISABLED": "false"}
# How often the synthesis says how far it is while the rest of the start goes on.
PROGRESS_EVERY_SECONDS = 15.0


@dataclass
class Synthesis:
    """The IAM template for the current inputs: synthesized in the background (its own process) when not
    cached, saying every PROGRESS_EVERY_SECONDS how long it has run and about how long it has left."""

    state: TemplateState
    started: float = field(default_factory=time.monotonic)
    seconds: float | None = None  # how long this start's synthesis took (None: none ran)
    _error: BaseException | None = None
    _thread: threading.Thread | None = None

    @classmethod
    def begin(cls) -> Synthesis:
        synthesis = cls(template_state())
        if not synthesis.state.cached:
            print(f"IAM: {synthesis.what()}, in the background", flush=True)
            synthesis._thread = threading.Thread(target=synthesis._run, name="iam-synth", daemon=True)
            synthesis._thread.start()
        return synthesis

    def _run(self) -> None:
        worker = threading.Thread(target=self._synthesize, name="iam-synth-process", daemon=True)
        worker.start()
        while True:
            worker.join(PROGRESS_EVERY_SECONDS)
            if not worker.is_alive():
                return
            spent = time.monotonic() - self.started
            print(f"IAM: {self.what()}: {spent:.0f} s so far, {self.left(spent)}", flush=True)

    def _synthesize(self) -> None:
        try:
            template_path()
        except BaseException as exc:
            self._error = exc
        self.seconds = time.monotonic() - self.started

    def wait(self) -> None:
        """Until the template is there."""
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error

    def what(self) -> str:
        return f"synthesizing the dev stage's policies ({self.state.why})"

    def left(self, spent: float) -> str:
        estimate = self.state.estimate_seconds
        if spent < estimate:
            return f"about {estimate - spent:.0f} s left"
        if self.state.last_seconds is None:
            return f"longer than the {estimate:.0f} s it takes on a quiet machine"
        return f"longer than the {estimate:.0f} s the last one took"

    def banner(self) -> str:
        where = os.path.relpath(self.state.path)
        if self.seconds is None:
            return f"{where} (cached: infra/, cdk.json and what they read are unchanged)"
        return f"{where} (synthesized in {self.seconds:.0f} s: {self.state.why})"


def run(args: argparse.Namespace) -> int:
    for key, value in (VERBOSE_POWERTOOLS if args.verbose else QUIET_POWERTOOLS).items():
        os.environ.setdefault(key, value)
    # The emulated machines' boot times (ec2_time.py reads them when the stack starts moto).
    if args.launch_seconds is not None:
        os.environ[LAUNCH_ENVIRONMENT] = str(args.launch_seconds)
    if args.start_seconds is not None:
        os.environ[START_ENVIRONMENT] = str(args.start_seconds)
    api_port = int(os.environ.get(API_PORT_ENVIRONMENT, DEFAULT_API_PORT))
    if args.data_dir is not None:
        os.environ[DATA_DIR_ENV] = str(args.data_dir)
    stack = LocalStack.from_environ()
    try:
        ensure_port_free(api_port, "the admin API", API_PORT_ENVIRONMENT)
        stack.start_dynamodb()
    except LocalStackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    synthesis = Synthesis.begin() if iam_session.mode() != "off" else None
    try:
        from fleetkeeper_local import serve  # noqa: PLC0415 - after the JVM and the synthesis started

        return serve.serve(args, stack, api_port, synthesis)
    finally:
        stack.stop()


def publish_image(args: argparse.Namespace) -> int:
    from fleetkeeper_local import serve  # noqa: PLC0415 - see the module's docstring

    return serve.publish_image(args)


def simulate(args: argparse.Namespace) -> int:
    from fleetkeeper_local import serve  # noqa: PLC0415 - see the module's docstring

    return serve.simulate(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetkeeper_local", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser(
        "run", help="start the local control plane, seed a demo fleet, serve the API"
    )
    run_parser.add_argument("--no-seed", action="store_true", help="start with an empty table")
    run_parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"keep the fleet in this folder and restart into it (or {DATA_DIR_ENV}); default: in memory",
    )
    run_parser.add_argument(
        "--workload",
        action="store_true",
        help="simulate users: place instances and complete them after random durations",
    )
    run_parser.add_argument(
        "--workload-rate", type=float, default=12.0, help="instances placed per minute (default 12)"
    )
    run_parser.add_argument(
        "--workload-min-seconds", type=float, default=10.0, help="shortest instance (default 10 s)"
    )
    run_parser.add_argument(
        "--workload-max-seconds", type=float, default=60.0, help="longest instance (default 60 s)"
    )
    run_parser.add_argument("--workload-seed", type=int, default=None, help="seed, to repeat a simulation")
    run_parser.add_argument(
        "--launch-seconds",
        type=float,
        default=None,
        help=f"how long a launched machine is pending (or {LAUNCH_ENVIRONMENT}; default "
        f"{DEFAULT_LAUNCH_SECONDS:g} s)",
    )
    run_parser.add_argument(
        "--start-seconds",
        type=float,
        default=None,
        help=f"how long a started machine is pending (or {START_ENVIRONMENT}; default "
        f"{DEFAULT_START_SECONDS:g} s)",
    )
    run_parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print the functions' INFO logs and their EMF metric lines",
    )
    run_parser.set_defaults(handler=run)
    publish_parser = commands.add_parser(
        "publish-image",
        help="on a running `make run`: register a newer image for a template's ami_name_filter, so its "
        "workers show drift `image` after the next reconcile cycle",
    )
    publish_parser.add_argument("template", help="the template whose ami_name_filter the image matches")
    publish_parser.add_argument("--region", default=LOCAL_REGION, help=f"default {LOCAL_REGION}")
    publish_parser.set_defaults(handler=publish_image)
    simulate_parser = commands.add_parser(
        "simulate",
        help="on a running `make run`: make a health signal happen to a machine (docs/repair.md), or "
        "an instance type run out of capacity (docs/fault-injection.md)",
    )
    simulate_parser.add_argument(
        "signal",
        choices=["retirement", "impair", "silence", "disconnect", "recover", "ice"],
        help="retirement: a scheduled event; impair: failed status checks; silence: no status at all; "
        "disconnect: the SSM agent is ConnectionLost; recover: checks pass, the agent answers and a "
        "scheduled event is cancelled; ice: RunInstances and StartInstances of the instance type answer "
        "InsufficientInstanceCapacity",
    )
    simulate_parser.add_argument(
        "instance_id", help="the machine, e.g. i-0123456789abcdef0; for ice the instance type, e.g. m5.large"
    )
    simulate_parser.add_argument(
        "--off", action="store_true", help="ice: the instance type has capacity again"
    )
    simulate_parser.add_argument(
        "--in", dest="within", default="2h", help="retirement: how far ahead its NotBefore is (default 2h)"
    )
    simulate_parser.add_argument(
        "--code",
        default="instance-retirement",
        help="retirement: the event's code (default instance-retirement)",
    )
    simulate_parser.add_argument("--region", default=LOCAL_REGION, help=f"default {LOCAL_REGION}")
    simulate_parser.set_defaults(handler=simulate)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    code = main()
    # Everything the run started has stopped and its record is written: what is left is the
    # interpreter freeing the emulators' objects one by one, seconds on a busy machine.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
