"""Worker operations: the SSM command documents of the catalogue, and who may send them where.

Each shipped operation is its own command document (AWS::SSM::Document) rather than AWS-RunShellScript
with a script: `ssm:SendCommand` can then be granted on exactly these documents, where a grant on
AWS-RunShellScript would let the functions run any command on every managed machine. A catalogue entry
whose operation has no document here names a document the deployer manages; the grant covers it too.

The documents run hooks the worker image provides (/opt/fleetkeeper/hooks/<operation>), so the product
specifics (which license tool, which facts) stay in the image. A secret never travels as a parameter:
register-license is given the *name* of a SecureString parameter, reads it on the machine with the
instance's own role, and hands it to the hook on stdin, so it appears in no command line, output,
table item or log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from fleetkeeper.domain.operations import OperationSpec
from fleetkeeper.domain.tags import MANAGED_BY_TAG, MANAGED_BY_VALUE
from infra.config import StageConfig
from infra.permissions import allow

HOOKS_DIR: Final = "/opt/fleetkeeper/hooks"
# SendCommand on an instance only when SSM sees fleetkeeper's tag on it.
MANAGED_INSTANCE: Final = {"StringEquals": {f"ssm:resourceTag/{MANAGED_BY_TAG}": MANAGED_BY_VALUE}}
# The calls the reconciler and the drain's finish step make (cloud/ssm.py).
READ_ACTIONS: Final = ("ssm:CancelCommand", "ssm:GetCommandInvocation", "ssm:ListCommands")
# Discovery's read of the agents' ping status (docs/repair.md).
AGENT_READ_ACTIONS: Final = ("ssm:DescribeInstanceInformation",)


def _run_hook(name: str, *, stdin: str | None = None) -> list[str]:
    hook = f"{HOOKS_DIR}/{name}"
    feed = f"{stdin} | " if stdin else ""
    return [
        "set -euo pipefail",
        f'if [ ! -x "{hook}" ]; then echo "{hook} is missing on this image" >&2; exit 3; fi',
        f'{feed}"{hook}"',
    ]


def _document(description: str, parameters: Mapping[str, Any], commands: list[str], timeout: int) -> Any:
    return {
        "schemaVersion": "2.2",
        "description": description,
        "parameters": dict(parameters),
        "mainSteps": [
            {
                "action": "aws:runShellScript",
                "name": "run",
                "precondition": {"StringEquals": ["platformType", "Linux"]},
                "inputs": {"timeoutSeconds": str(timeout), "runCommand": commands},
            }
        ],
    }


def document_content(operation: str, spec: OperationSpec) -> Any | None:
    """The command document of a shipped operation; None for an operation fleetkeeper ships none for."""
    if operation == "register-license":
        parameter = spec.parameters.get("licenseParameter")
        token_source = {
            "type": "String",
            "description": "name of the SecureString parameter holding the license token",
            # The same rule as the catalogue's, checked by SSM too: the value is a parameter name.
            "allowedPattern": parameter.pattern if parameter else r"^/[A-Za-z0-9/_.-]{1,1000}$",
        }
        if parameter and parameter.default:
            token_source["default"] = parameter.default
        read_parameter = (
            "aws ssm get-parameter --with-decryption --name '{{ licenseParameter }}' "
            "--query Parameter.Value --output text"
        )
        return _document(
            "fleetkeeper: register the machine's license (token read here, passed to the hook on stdin)",
            {"licenseParameter": token_source},
            _run_hook("register-license", stdin=read_parameter),
            spec.timeout_seconds,
        )
    if operation == "deregister-license":
        return _document(
            "fleetkeeper: release the machine's license before it stops",
            {},
            _run_hook("deregister-license"),
            spec.timeout_seconds,
        )
    if operation == "collect-system-info":
        fallback = (
            'printf \'{"hostname":"%s","kernel":"%s","cpus":%s,"uptime_seconds":%s}\\n\' '
            '"$(hostname)" "$(uname -r)" "$(nproc)" "$(cut -d. -f1 /proc/uptime)"'
        )
        hook = f"{HOOKS_DIR}/collect-system-info"
        return _document(
            "fleetkeeper: print one JSON object describing the machine (the image's hook, else basics)",
            {},
            ["set -euo pipefail", f'if [ -x "{hook}" ]; then exec "{hook}"; fi', fallback],
            spec.timeout_seconds,
        )
    return None


class WorkerOperations(Construct):
    """The catalogue's command documents, and the grant to send them to fleetkeeper's machines."""

    def __init__(self, scope: Construct, construct_id: str, *, config: StageConfig) -> None:
        super().__init__(scope, construct_id)
        self._config = config
        self.documents: dict[str, ssm.CfnDocument] = {}
        for operation, spec in sorted(config.operations.catalogue.items()):
            content = document_content(operation, spec)
            if content is None:
                continue
            self.documents[operation] = ssm.CfnDocument(
                self,
                "".join(part.title() for part in operation.split("-")),
                name=spec.document,
                document_type="Command",
                document_format="JSON",
                content=content,
                # A named document is updated in place, as a new version, instead of being replaced.
                update_method="NewVersion",
            )

    def document_arns(self) -> list[str]:
        stack = Stack.of(self)
        names = sorted({spec.document for spec in self._config.operations.catalogue.values()})
        return [
            stack.format_arn(service="ssm", region=region, resource="document", resource_name=name)
            for region in sorted(self._config.regions)
            for name in names
        ]

    def grant_run(self, role: iam.IRole) -> None:
        """SendCommand of the catalogue's documents to managed instances; reading and cancelling them."""
        if not self._config.operations.catalogue:
            return
        allow(role, actions=["ssm:SendCommand"], resources=self.document_arns())
        stack = Stack.of(self)
        instances = [
            stack.format_arn(service="ec2", region=region, resource="instance", resource_name="*")
            for region in sorted(self._config.regions)
        ]
        allow(
            role,
            actions=["ssm:SendCommand"],
            resources=instances,
            conditions=MANAGED_INSTANCE,
            wildcard_reason=(
                "Instance ids are not known before launch; SendCommand reaches only instances carrying "
                f"the {MANAGED_BY_TAG}={MANAGED_BY_VALUE} tag in the stage's worker regions."
            ),
        )
        allow(
            role,
            actions=list(READ_ACTIONS),
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": sorted(self._config.regions)}},
            wildcard_reason=(
                "GetCommandInvocation, ListCommands and CancelCommand support no resource-level "
                "permissions; the statement is limited to the stage's worker regions."
            ),
        )

    def grant_agent_reads(self, role: iam.IRole) -> None:
        """DescribeInstanceInformation in the worker regions: whether the agents of the workers that use
        operations still answer (none does when the catalogue is empty)."""
        if not self._config.operations.catalogue:
            return
        allow(
            role,
            actions=list(AGENT_READ_ACTIONS),
            resources=["*"],
            conditions={"StringEquals": {"aws:RequestedRegion": sorted(self._config.regions)}},
            wildcard_reason=(
                "DescribeInstanceInformation supports no resource-level permissions; the statement is "
                "limited to the stage's worker regions."
            ),
        )
