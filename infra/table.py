"""The one DynamoDB table, built from the shared definition in fleetkeeper.store.schema."""

from __future__ import annotations

from typing import Final

from aws_cdk import RemovalPolicy
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_iam as iam
from constructs import Construct

from fleetkeeper.store import schema
from infra.permissions import allow

_ATTRIBUTE_TYPES: Final = {
    "S": dynamodb.AttributeType.STRING,
    "N": dynamodb.AttributeType.NUMBER,
    "B": dynamodb.AttributeType.BINARY,
}
_PROJECTIONS: Final = {
    "ALL": dynamodb.ProjectionType.ALL,
    "KEYS_ONLY": dynamodb.ProjectionType.KEYS_ONLY,
    "INCLUDE": dynamodb.ProjectionType.INCLUDE,
}

# What the store and Powertools idempotency call. Transactions are authorised per item action, so
# TransactWriteItems needs PutItem/UpdateItem/ConditionCheckItem. Scan is left out on purpose:
# nothing reads the table with Scan (docs/data-model.md).
READ_ACTIONS: Final = ("dynamodb:GetItem", "dynamodb:BatchGetItem", "dynamodb:Query")
# DeleteItem: every function that ends an instance deletes the slot item it held on its worker, in the
# transaction that frees the slot (store/slots.py), and the API's Powertools idempotency removes the
# record of a request whose handler failed.
WRITE_ACTIONS: Final = (
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:ConditionCheckItem",
    "dynamodb:DeleteItem",
)
# Unconditional puts and deletes of many items: discovery writes the orphan breaker's pages of held-back
# ids before its head refers to them, and deletes the pages no head refers to any more (store/breakers.py).
BATCH_WRITE_ACTIONS: Final = ("dynamodb:BatchWriteItem",)


class FleetTable(Construct):
    """On-demand, point-in-time recovery, encrypted; protected from deletion when the stage retains data.

    `deferred_indexes` are indexes of the shared definition this deploy leaves out: CloudFormation adds
    one global secondary index per stack update, so an upgrade that brings two deploys twice
    (docs/deploy.md, "Upgrading the table").
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        retain: bool,
        deferred_indexes: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__(scope, construct_id)
        attribute_types = {
            definition["AttributeName"]: _ATTRIBUTE_TYPES[definition["AttributeType"]]
            for definition in schema.attribute_definitions()
        }

        def attribute(name: str) -> dynamodb.Attribute:
            return dynamodb.Attribute(name=name, type=attribute_types[name])

        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=attribute(schema.PARTITION_KEY),
            sort_key=attribute(schema.SORT_KEY),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            time_to_live_attribute=schema.TTL_ATTRIBUTE,
            deletion_protection=retain,
            removal_policy=RemovalPolicy.RETAIN if retain else RemovalPolicy.DESTROY,
        )
        self.index_names: list[str] = []
        for index in schema.global_secondary_indexes(deferred_indexes):
            keys = {key["KeyType"]: key["AttributeName"] for key in index["KeySchema"]}
            sort_key = keys.get("RANGE")
            projection = index["Projection"]
            self.table.add_global_secondary_index(
                index_name=index["IndexName"],
                partition_key=attribute(keys["HASH"]),
                sort_key=attribute(sort_key) if sort_key else None,
                projection_type=_PROJECTIONS[projection["ProjectionType"]],
                non_key_attributes=projection.get("NonKeyAttributes"),
            )
            self.index_names.append(index["IndexName"])

    @property
    def table_name(self) -> str:
        return self.table.table_name

    def index_arns(self) -> list[str]:
        # Named indexes instead of CDK's `index/*`, so the grant needs no wildcard.
        return [f"{self.table.table_arn}/index/{name}" for name in self.index_names]

    def grant_data(self, role: iam.IRole, *, batch_write: bool = False) -> None:
        """Item reads and conditional writes on the table and its indexes (indexes are read-only)."""
        actions = [*READ_ACTIONS, *WRITE_ACTIONS, *(BATCH_WRITE_ACTIONS if batch_write else ())]
        allow(role, actions=actions, resources=[self.table.table_arn])
        allow(role, actions=["dynamodb:Query"], resources=self.index_arns())
