"""What a use case needs from the outside world, built once per process from the settings."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from fleetkeeper.cloud.alarms import AlarmsGateway
from fleetkeeper.cloud.clients import RetryLayer, client
from fleetkeeper.cloud.ec2 import Ec2Gateway
from fleetkeeper.cloud.events import AuditBus, Notifier
from fleetkeeper.cloud.metrics import MetricsGateway
from fleetkeeper.cloud.workflows import Workflows
from fleetkeeper.settings import Settings, get_settings
from fleetkeeper.store.breakers import BreakerStore
from fleetkeeper.store.capacity import CapacityStore
from fleetkeeper.store.disruption import WaitingStore
from fleetkeeper.store.repository import FleetStore
from fleetkeeper.store.rollouts import RolloutStore
from fleetkeeper.store.stats import StatsStore


@dataclass(frozen=True)
class Context:
    settings: Settings
    store: FleetStore
    workflows: Workflows
    audit: AuditBus
    notifier: Notifier

    def ec2(self, region: str | None = None) -> Ec2Gateway:
        return Ec2Gateway(client("ec2", region))

    def cloudwatch(self, region: str | None = None) -> MetricsGateway:
        return MetricsGateway(client("cloudwatch", region))

    def alarms(self, region: str | None = None) -> AlarmsGateway:
        """CloudWatch alarms of the stage's own region unless another is named."""
        return AlarmsGateway(client("cloudwatch", region))

    def ssm(self, region: str | None = None) -> Any:
        """The SSM client of a worker region (Run Command goes to the machine's own region)."""
        return client("ssm", region)

    @property
    def dynamodb_client(self) -> Any:
        """A DynamoDB client for libraries that keep records in the table (idempotency): they call it
        directly, not through cloud/retry.py, so the SDK's own retries are theirs."""
        return client("dynamodb", retries=RetryLayer.SDK)

    @property
    def stats(self) -> StatsStore:
        return StatsStore(client("dynamodb"), self.settings.table_name)

    @property
    def waiting(self) -> WaitingStore:
        """What waits on each pool's disruption budgets."""
        return WaitingStore(client("dynamodb"), self.settings.table_name)

    @property
    def capacity(self) -> CapacityStore:
        """Pools' member counts and scale-out state."""
        return CapacityStore(client("dynamodb"), self.settings.table_name)

    @property
    def rollouts(self) -> RolloutStore:
        return RolloutStore(
            client("dynamodb"),
            self.settings.table_name,
            audit_retention_days=self.settings.audit_retention_days,
        )

    @property
    def breakers(self) -> BreakerStore:
        return BreakerStore(client("dynamodb"), self.settings.table_name)


def build_context(settings: Settings) -> Context:
    return Context(
        settings=settings,
        store=FleetStore(
            client("dynamodb"),
            settings.table_name,
            audit_retention_days=settings.audit_retention_days,
            operation_retention_days=settings.operation_retention_days,
        ),
        workflows=Workflows(client("stepfunctions"), settings.drain_state_machine_arn),
        audit=AuditBus(client("events"), settings.audit_bus_name),
        notifier=Notifier(client("sns"), settings.notification_topic_arn),
    )


@cache
def default_context() -> Context:
    """The process-wide context; Lambda reuses it across warm invocations."""
    return build_context(get_settings())
