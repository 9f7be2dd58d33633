"""`python -m fleetkeeper_local run`: the local control plane on the emulated AWS stack."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

import boto3

from fleetkeeper.store.repository import FleetStore
from fleetkeeper_local.seed import describe_fleet, seed_demo_fleet
from fleetkeeper_local.stack import LocalStack, LocalStackError

DEFAULT_TABLE = "fleetkeeper-local"


def run(args: argparse.Namespace) -> int:
    stack = LocalStack.from_environ()
    try:
        stack.start()
    except LocalStackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        os.environ.update(stack.environment())
        table_name = os.environ.setdefault("TABLE_NAME", DEFAULT_TABLE)
        stack.create_table(table_name)

        store = FleetStore(boto3.client("dynamodb"), table_name)
        if not args.no_seed:
            seed_demo_fleet(store, boto3.client("ec2"), stack.environment()["AWS_REGION"])
        print(f"DynamoDB Local  {stack.dynamodb_endpoint}  table {table_name}")
        print(f"moto server     {stack.moto_endpoint}  (EC2, Step Functions, EventBridge, SNS, CloudWatch)")
        print()
        print(describe_fleet(store))
        print()
        print("The local stack is up. Press Ctrl-C to stop it.", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    finally:
        # A second Ctrl-C while the servers shut down would leave DynamoDB Local running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        stack.stop()
    print("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fleetkeeper_local", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="start the local stack, seed a demo fleet and keep serving")
    run_parser.add_argument("--no-seed", action="store_true", help="start with an empty table")
    run_parser.set_defaults(handler=run)
    args = parser.parse_args(argv)
    return int(args.handler(args))


if __name__ == "__main__":
    sys.exit(main())
