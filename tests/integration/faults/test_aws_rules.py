"""AWS's limits on the real clients: each exceeded through a client, answered as AWS answers it, and met
just under the limit without a complaint.

Single-request limits (item, key, transaction, batch and expression sizes, the 1 MB page) are DynamoDB
Local's own; the tests hold it to DynamoDB's figures. Throughput limits are fleetkeeper_local.aws_rules':
those tests run their own rules on a clock that stands still, so the arithmetic is AWS's figures and
not the laptop's speed (DynamoDB Local writes far fewer units a second than one partition takes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from fleetkeeper.cloud.clients import client
from fleetkeeper_local.aws_rules import TABLE_THROTTLED, AwsRules, Limits
from fleetkeeper_local.images import stock_image

pytestmark = pytest.mark.integration

KB = 1024
ITEM_LIMIT = 400 * KB
# Attribute names and key values of the test items: PK "k", SK "s", "d" holding the payload.
OVERHEAD = len("PK") + len("SK") + len("d")
NO_RETRIES = Config(retries={"mode": "standard", "total_max_attempts": 1})


class StoppedClock:
    """A monotonic clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> StoppedClock:
    return StoppedClock()


@pytest.fixture
def rules_at(aws_rules: AwsRules | None, clock: StoppedClock) -> Callable[..., Any]:
    """Install rules of the test's own, on the stopped clock, in place of the session's."""

    @contextmanager
    def install(limits: Limits | None = None) -> Iterator[AwsRules]:
        suspended = aws_rules.suspended() if aws_rules is not None else _nothing()
        with suspended, AwsRules(limits, clock=clock).installed() as rules:
            yield rules

    return install


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def item(pk: str, sk: str = "s", size: int = 0, **more: Any) -> dict[str, Any]:
    """An item of `size` bytes as DynamoDB counts them (names and values), padded in attribute d."""
    pad = size - OVERHEAD - len(pk) - len(sk) - sum(len(k) + len(v) for k, v in more.items())
    return {
        "PK": {"S": pk},
        "SK": {"S": sk},
        "d": {"S": "x" * max(pad, 1)},
        **{k: {"S": v} for k, v in more.items()},
    }


def error_of(call: Callable[[], Any]) -> dict[str, Any]:
    with pytest.raises(ClientError) as raised:
        call()
    return dict(raised.value.response)


def exists(table: str, pk: str, sk: str = "s") -> bool:
    answer = client("dynamodb").get_item(TableName=table, Key={"PK": {"S": pk}, "SK": {"S": sk}})
    return "Item" in answer


# ---- single-request limits (DynamoDB Local's own) ------------------------------------------------------


def test_given_an_item_of_400_kb_then_it_is_written_and_one_byte_more_is_refused(table_name: str) -> None:
    ddb = client("dynamodb")
    ddb.put_item(TableName=table_name, Item=item("fits", size=ITEM_LIMIT))

    error = error_of(lambda: ddb.put_item(TableName=table_name, Item=item("big", size=ITEM_LIMIT + 1)))

    assert error["Error"] == {
        "Code": "ValidationException",
        "Message": "Item size has exceeded the maximum allowed size",
    }
    assert exists(table_name, "fits")
    assert not exists(table_name, "big")


def test_given_an_update_then_the_item_after_it_must_stay_within_400_kb(table_name: str) -> None:
    ddb = client("dynamodb")
    ddb.put_item(TableName=table_name, Item=item("grows", size=300 * KB))
    key = {"PK": {"S": "grows"}, "SK": {"S": "s"}}

    def add(size: int) -> Any:
        return ddb.update_item(
            TableName=table_name,
            Key=key,
            UpdateExpression="SET e = :v",
            ExpressionAttributeValues={":v": {"S": "y" * size}},
        )

    error = error_of(lambda: add(ITEM_LIMIT - 300 * KB))  # one byte over with the name "e"
    add(ITEM_LIMIT - 300 * KB - 1)

    assert error["Error"]["Code"] == "ValidationException"
    assert error["Error"]["Message"] == "Item size to update has exceeded the maximum allowed size"


def test_given_a_transaction_that_grows_an_item_past_400_kb_then_it_is_cancelled_for_that_item(
    table_name: str,
) -> None:
    ddb = client("dynamodb")
    ddb.put_item(TableName=table_name, Item=item("grows", size=300 * KB))
    update = {
        "TableName": table_name,
        "Key": {"PK": {"S": "grows"}, "SK": {"S": "s"}},
        "UpdateExpression": "SET e = :v",
        "ExpressionAttributeValues": {":v": {"S": "y" * 150 * KB}},
    }
    other = {"Put": {"TableName": table_name, "Item": item("other")}}

    error = error_of(lambda: ddb.transact_write_items(TransactItems=[other, {"Update": update}]))

    assert error["Error"]["Code"] == "TransactionCanceledException"
    assert error["CancellationReasons"] == [
        {"Code": "None"},
        {"Code": "ValidationError", "Message": "Item size to update has exceeded the maximum allowed size"},
    ]
    assert not exists(table_name, "other")


def test_given_transactions_then_100_items_and_4_mb_are_taken_and_more_is_refused(table_name: str) -> None:
    ddb = client("dynamodb")

    def puts(count: int, size: int = 0, prefix: str = "t") -> list[dict[str, Any]]:
        return [
            {"Put": {"TableName": table_name, "Item": item(f"{prefix}{n}", size=size)}} for n in range(count)
        ]

    ddb.transact_write_items(TransactItems=puts(100))
    too_many = error_of(lambda: ddb.transact_write_items(TransactItems=puts(101, prefix="u")))
    ddb.transact_write_items(TransactItems=puts(10, 390 * KB, "m"))  # 3.9 MB
    too_big = error_of(lambda: ddb.transact_write_items(TransactItems=puts(11, 390 * KB, "n")))

    assert too_many["Error"]["Code"] == "ValidationException"
    assert "less than or equal to 100" in too_many["Error"]["Message"]
    assert too_big["Error"]["Code"] == "ValidationException"
    assert "cannot exceed 4MB" in too_big["Error"]["Message"]
    assert not exists(table_name, "n0")


def test_given_reads_in_a_transaction_then_100_items_are_taken_and_101_refused(table_name: str) -> None:
    ddb = client("dynamodb")

    def gets(count: int) -> list[dict[str, Any]]:
        return [
            {"Get": {"TableName": table_name, "Key": {"PK": {"S": f"g{n}"}, "SK": {"S": "s"}}}}
            for n in range(count)
        ]

    ddb.transact_get_items(TransactItems=gets(100))
    error = error_of(lambda: ddb.transact_get_items(TransactItems=gets(101)))

    assert error["Error"]["Code"] == "ValidationException"
    assert "less than or equal to 100" in error["Error"]["Message"]


def test_given_batches_then_25_writes_and_100_reads_are_taken_and_one_more_is_refused(
    table_name: str,
) -> None:
    ddb = client("dynamodb")

    def writes(count: int) -> dict[str, Any]:
        return {table_name: [{"PutRequest": {"Item": item(f"b{n}")}} for n in range(count)]}

    def reads(count: int) -> dict[str, Any]:
        return {table_name: {"Keys": [{"PK": {"S": f"b{n}"}, "SK": {"S": "s"}} for n in range(count)]}}

    ddb.batch_write_item(RequestItems=writes(25))
    ddb.batch_get_item(RequestItems=reads(100))
    too_many_writes = error_of(lambda: ddb.batch_write_item(RequestItems=writes(26)))
    too_many_reads = error_of(lambda: ddb.batch_get_item(RequestItems=reads(101)))

    assert too_many_writes["Error"]["Code"] == "ValidationException"
    assert too_many_reads["Error"] == {
        "Code": "ValidationException",
        "Message": "Too many items requested for the BatchGetItem call",
    }


def test_given_expressions_then_4_kb_and_255_character_placeholders_are_taken_and_more_is_refused(
    table_name: str,
) -> None:
    ddb = client("dynamodb")
    key = {"PK": {"S": "e"}, "SK": {"S": "s"}}

    def update(expression: str, names: dict[str, str] | None = None, value: str = ":v") -> Any:
        return ddb.update_item(
            TableName=table_name,
            Key=key,
            UpdateExpression=expression,
            ExpressionAttributeValues={value: {"S": "1"}},
            **({"ExpressionAttributeNames": names} if names else {}),
        )

    update("SET a = :v".ljust(4096))
    long_expression = error_of(lambda: update("SET a = :v".ljust(4097)))
    name = "#" + "n" * 254
    update(f"SET {name} = :v", {name: "a"})
    long_name = error_of(lambda: update(f"SET {name}n = :v", {f"{name}n": "a"}))
    value = ":" + "v" * 254
    update(f"SET a = {value}", value=value)
    long_value = error_of(lambda: update(f"SET a = {value}v", value=f"{value}v"))

    assert long_expression["Error"]["Code"] == "ValidationException"
    assert "Expression size has exceeded the maximum allowed size" in long_expression["Error"]["Message"]
    for error in (long_name, long_value):
        assert error["Error"]["Code"] == "ValidationException"
        assert "contains a key that is too long" in error["Error"]["Message"]


def test_given_expressions_then_300_operators_100_in_operands_and_32_levels_are_taken_and_more_refused(
    table_name: str,
) -> None:
    ddb = client("dynamodb")

    def none_of(count: int) -> Any:
        # NOT (a = :v0 OR ... OR a = :vN): count comparisons, count - 1 ORs and a NOT; true without "a".
        values = {f":v{n}": {"N": str(n)} for n in range(count)}
        return ddb.put_item(
            TableName=table_name,
            Item=item("ops"),
            ConditionExpression="NOT (" + " OR ".join(f"a = {v}" for v in values) + ")",
            ExpressionAttributeValues=values,
        )

    def one_of(count: int) -> Any:
        values = {f":v{n}": {"N": str(n)} for n in range(count)}
        return ddb.put_item(
            TableName=table_name,
            Item=item("in"),
            ConditionExpression=f"attribute_not_exists(a) OR a IN ({', '.join(values)})",
            ExpressionAttributeValues=values,
        )

    def nested(levels: int) -> Any:
        value: dict[str, Any] = {"S": "x"}
        for _ in range(levels - 1):
            value = {"M": {"m": value}}
        return ddb.put_item(TableName=table_name, Item={**item("deep"), "n": value})

    none_of(150)  # 300 operators
    too_many_operators = error_of(lambda: none_of(151))
    one_of(100)
    too_many_operands = error_of(lambda: one_of(101))
    nested(32)
    too_deep = error_of(lambda: nested(33))

    assert "too many operators" in too_many_operators["Error"]["Message"]
    assert "too many operands" in too_many_operands["Error"]["Message"]
    assert too_deep["Error"]["Message"].startswith("Nesting Levels have exceeded supported limits")
    for error in (too_many_operators, too_many_operands, too_deep):
        assert error["Error"]["Code"] == "ValidationException"


def test_given_keys_then_a_2048_byte_partition_key_and_1024_byte_sort_key_are_taken_and_longer_refused(
    table_name: str,
) -> None:
    ddb = client("dynamodb")
    ddb.put_item(TableName=table_name, Item={"PK": {"S": "p" * 2048}, "SK": {"S": "s" * 1024}})

    long_partition = error_of(
        lambda: ddb.put_item(TableName=table_name, Item={"PK": {"S": "p" * 2049}, "SK": {"S": "s"}})
    )
    long_sort = error_of(
        lambda: ddb.put_item(TableName=table_name, Item={"PK": {"S": "p"}, "SK": {"S": "s" * 1025}})
    )
    long_index_key = error_of(
        lambda: ddb.put_item(TableName=table_name, Item=item("i", GSI1PK="p" * 2049, GSI1SK="s"))
    )

    for error in (long_partition, long_sort, long_index_key):
        assert error["Error"]["Code"] == "ValidationException"
    assert not exists(table_name, "i")


def test_given_a_partition_of_more_than_1_mb_then_a_query_answers_a_page_of_about_1_mb(
    table_name: str,
) -> None:
    ddb = client("dynamodb")
    for n in range(12):
        ddb.put_item(TableName=table_name, Item=item("page", f"{n:02}", size=100 * KB))
        # 100 write units each, into one partition that takes 1,000 a second: paced, not throttled.
        time.sleep(0.12)

    page = ddb.query(
        TableName=table_name,
        KeyConditionExpression="PK = :p",
        ExpressionAttributeValues={":p": {"S": "page"}},
    )

    # DynamoDB stops once it has read 1 MB, the item that crosses it included, and says where to go on.
    assert page["Count"] <= 11
    assert "LastEvaluatedKey" in page


# ---- throughput per partition key value --------------------------------------------------------------


def test_given_writes_to_one_partition_then_1000_units_a_second_are_taken_and_the_next_is_throttled(
    table_name: str, rules_at: Callable[..., Any], clock: StoppedClock
) -> None:
    with rules_at() as rules:
        ddb = boto3.client("dynamodb", config=NO_RETRIES)
        for n in range(10):  # 100 units each: the 1,000 a second the partition takes
            ddb.put_item(TableName=table_name, Item=item("hot", f"{n}", size=100 * KB))
        throttled = error_of(lambda: ddb.put_item(TableName=table_name, Item=item("hot", "10", size=KB)))
        elsewhere = ddb.put_item(TableName=table_name, Item=item("cold", size=100 * KB))
        clock.now += 1.0  # a second later the bucket has refilled
        ddb.put_item(TableName=table_name, Item=item("hot", "11", size=KB))

    assert throttled["Error"] == {"Code": "ThrottlingException", "Message": TABLE_THROTTLED}
    assert throttled["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert throttled["throttlingReasons"] == [
        {
            "reason": "TableWriteKeyRangeThroughputExceeded",
            "resource": f"arn:aws:dynamodb:us-east-1:123456789012:table/{table_name}",
        }
    ]
    assert elsewhere["ResponseMetadata"]["HTTPStatusCode"] == 200
    assert not exists(table_name, "hot", "10")  # a throttled write never happened
    assert exists(table_name, "hot", "11")
    assert rules.summary() == {"dynamodb:TableWriteKeyRangeThroughputExceeded": 1}
    assert rules.hottest()[0] == (f"{table_name}:hot", pytest.approx(10 * 100 + 1))


def test_given_items_that_share_an_index_partition_then_the_index_throttles_the_tables_writes(
    table_name: str, rules_at: Callable[..., Any]
) -> None:
    with rules_at() as rules:
        ddb = boto3.client("dynamodb", config=NO_RETRIES)
        for n in range(10):  # distinct table partitions, one index partition: 1,000 index units
            ddb.put_item(TableName=table_name, Item=item(f"w{n}", size=100 * KB, GSI1PK="HOT", GSI1SK=f"{n}"))
        throttled = error_of(
            lambda: ddb.put_item(TableName=table_name, Item=item("w10", GSI1PK="HOT", GSI1SK="10"))
        )
        # An item that leaves the hot index partition still writes to it (the entry is deleted there).
        moving = error_of(
            lambda: ddb.update_item(
                TableName=table_name,
                Key={"PK": {"S": "w1"}, "SK": {"S": "s"}},
                UpdateExpression="SET GSI1PK = :cold",
                ExpressionAttributeValues={":cold": {"S": "COLD"}},
            )
        )
        ddb.put_item(TableName=table_name, Item=item("w11", GSI1PK="COLD", GSI1SK="11"))

    assert throttled["Error"]["Code"] == "ThrottlingException"
    assert throttled["Error"]["Message"].startswith(
        "Throughput exceeds the current capacity for one or more global secondary indexes."
    )
    assert throttled["throttlingReasons"] == [
        {
            "reason": "IndexWriteKeyRangeThroughputExceeded",
            "resource": f"arn:aws:dynamodb:us-east-1:123456789012:table/{table_name}/index/by_status",
        }
    ]
    assert moving["Error"]["Code"] == "ThrottlingException"
    assert not exists(table_name, "w10")
    assert rules.summary() == {"dynamodb:IndexWriteKeyRangeThroughputExceeded": 2}
    assert rules.hottest()[0] == (f"{table_name}/by_status:HOT", pytest.approx(1000))


def test_given_an_item_written_before_then_its_index_partition_is_read_out_of_band_and_throttles_it(
    table_name: str, rules_at: Callable[..., Any]
) -> None:
    """The rules have seen neither the item nor its index keys: an update that does not name the index
    keys still rewrites the item's entry in the index (projection ALL), on its hot partition."""
    ddb = client("dynamodb")
    ddb.put_item(TableName=table_name, Item=item("old", GSI1PK="HOT", GSI1SK="old"))
    with rules_at():
        fresh = boto3.client("dynamodb", config=NO_RETRIES)
        for n in range(10):
            fresh.put_item(
                TableName=table_name, Item=item(f"w{n}", size=100 * KB, GSI1PK="HOT", GSI1SK=f"{n}")
            )
        throttled = error_of(
            lambda: fresh.update_item(
                TableName=table_name,
                Key={"PK": {"S": "old"}, "SK": {"S": "s"}},
                UpdateExpression="SET e = :v",
                ExpressionAttributeValues={":v": {"S": "1"}},
            )
        )

    assert throttled["throttlingReasons"][0]["reason"] == "IndexWriteKeyRangeThroughputExceeded"


def test_given_a_transaction_with_one_hot_item_then_it_is_cancelled_with_a_throttling_reason_for_it(
    table_name: str, rules_at: Callable[..., Any]
) -> None:
    with rules_at():
        ddb = boto3.client("dynamodb", config=NO_RETRIES)
        for n in range(10):
            ddb.put_item(TableName=table_name, Item=item("hot", f"{n}", size=100 * KB))
        error = error_of(
            lambda: ddb.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": table_name, "Item": item("calm")}},
                    {"Put": {"TableName": table_name, "Item": item("hot", "tx")}},
                ]
            )
        )

    assert error["Error"]["Code"] == "TransactionCanceledException"
    assert error["CancellationReasons"] == [
        {"Code": "None"},
        {"Code": "ThrottlingError", "Message": TABLE_THROTTLED},
    ]
    assert not exists(table_name, "calm")


def test_given_reads_of_one_partition_then_3000_units_a_second_are_taken_and_the_next_is_throttled(
    table_name: str, rules_at: Callable[..., Any]
) -> None:
    client("dynamodb").put_item(TableName=table_name, Item=item("read", size=ITEM_LIMIT))
    key = {"PK": {"S": "read"}, "SK": {"S": "s"}}
    with rules_at() as rules:
        ddb = boto3.client("dynamodb", config=NO_RETRIES)
        for _ in range(30):  # 100 units each, strongly consistent: 3,000
            ddb.get_item(TableName=table_name, Key=key, ConsistentRead=True)
        throttled = error_of(lambda: ddb.get_item(TableName=table_name, Key=key))
        # Reads and writes have buckets of their own.
        ddb.put_item(TableName=table_name, Item=item("read", "other"))

    assert throttled["Error"] == {"Code": "ThrottlingException", "Message": TABLE_THROTTLED}
    assert throttled["throttlingReasons"][0]["reason"] == "TableReadKeyRangeThroughputExceeded"
    assert rules.hottest(writes=False)[0] == (f"{table_name}:read", pytest.approx(3000))


def test_given_queries_of_an_index_partition_then_they_draw_on_its_read_bucket(
    table_name: str, rules_at: Callable[..., Any]
) -> None:
    ddb = client("dynamodb")
    for n in range(3):
        ddb.put_item(TableName=table_name, Item=item(f"q{n}", size=ITEM_LIMIT, GSI1PK="LIST", GSI1SK=f"{n}"))
    with rules_at(Limits(dynamodb_scale=0.1)) as rules:  # 300 read units a second
        fresh = boto3.client("dynamodb", config=NO_RETRIES)

        def query() -> Any:
            return fresh.query(
                TableName=table_name,
                IndexName="by_status",
                KeyConditionExpression="GSI1PK = :p",
                ExpressionAttributeValues={":p": {"S": "LIST"}},
            )

        query()  # 1.2 MB eventually consistent: 150 units
        query()
        throttled = error_of(query)

    assert throttled["throttlingReasons"][0]["reason"] == "IndexReadKeyRangeThroughputExceeded"
    assert rules.hottest(writes=False)[0][0] == f"{table_name}/by_status:LIST"


def test_given_scaled_limits_then_a_partition_takes_that_share_of_aws_rate(
    table_name: str, rules_at: Callable[..., Any]
) -> None:
    with rules_at(Limits(dynamodb_scale=0.01)):  # 10 write units a second
        ddb = boto3.client("dynamodb", config=NO_RETRIES)
        for n in range(10):
            ddb.put_item(TableName=table_name, Item=item("slow", f"{n}"))
        throttled = error_of(lambda: ddb.put_item(TableName=table_name, Item=item("slow", "10")))

    assert throttled["Error"]["Code"] == "ThrottlingException"


def test_given_the_rules_then_consumed_capacity_reaches_the_caller_only_as_asked(table_name: str) -> None:
    ddb = client("dynamodb")

    plain = ddb.put_item(TableName=table_name, Item=item("c1"))
    total = ddb.put_item(TableName=table_name, Item=item("c2"), ReturnConsumedCapacity="TOTAL")
    indexes = ddb.put_item(
        TableName=table_name, Item=item("c3", GSI1PK="A", GSI1SK="B"), ReturnConsumedCapacity="INDEXES"
    )

    assert "ConsumedCapacity" not in plain
    assert total["ConsumedCapacity"] == {"TableName": table_name, "CapacityUnits": 1.0}
    assert indexes["ConsumedCapacity"]["GlobalSecondaryIndexes"] == {"by_status": {"CapacityUnits": 1.0}}


# ---- EC2 request and resource rates ------------------------------------------------------------------


def test_given_unfiltered_describe_instances_then_50_pass_and_the_51st_is_refused_in_that_region_only(
    ec2: Any, rules_at: Callable[..., Any]
) -> None:
    with rules_at() as rules:
        east = boto3.client("ec2", config=NO_RETRIES)
        for _ in range(50):
            east.describe_instances()
        refused = error_of(east.describe_instances)
        # Filtered or paginated calls draw on the larger bucket; another region on its own.
        for _ in range(100):
            east.describe_instances(Filters=[{"Name": "instance-state-name", "Values": ["running"]}])
        filtered = error_of(lambda: east.describe_instances(MaxResults=5))
        boto3.client("ec2", region_name="us-west-2", config=NO_RETRIES).describe_instances()

    assert refused["Error"] == {"Code": "RequestLimitExceeded", "Message": "Request limit exceeded."}
    assert refused["ResponseMetadata"]["HTTPStatusCode"] == 503
    assert filtered["Error"]["Code"] == "RequestLimitExceeded"
    assert rules.summary() == {"ec2:RequestLimitExceeded:DescribeInstances": 2}


def test_given_run_instances_then_its_request_bucket_takes_5_calls_and_its_resource_bucket_1000_machines(
    ec2: Any, rules_at: Callable[..., Any], clock: StoppedClock
) -> None:
    image = stock_image(ec2)
    with rules_at():
        east = boto3.client("ec2", config=NO_RETRIES)

        def run(count: int) -> Any:
            return east.run_instances(ImageId=image, InstanceType="m5.large", MinCount=count, MaxCount=count)

        for _ in range(5):  # five calls, five machines: 995 machine tokens left
            run(1)
        sixth = error_of(lambda: run(1))
        clock.now += 0.5  # a call token back, and a machine token: 996
        run(996)
        clock.now += 0.5
        machines = error_of(lambda: run(2))  # a call token, but one machine token only
        run(1)

    assert sixth["Error"]["Code"] == "RequestLimitExceeded"
    assert machines["Error"]["Code"] == "RequestLimitExceeded"


def test_given_a_throttled_call_then_the_production_client_retries_it_as_the_sdk_does_on_aws(
    ec2: Any, rules_at: Callable[..., Any], clock: StoppedClock
) -> None:
    filtered: dict[str, Any] = {"Filters": [{"Name": "instance-state-name", "Values": ["running"]}]}
    with rules_at() as rules:
        harness = boto3.client("ec2", config=NO_RETRIES)
        for _ in range(100):  # the bucket's 100 tokens
            harness.describe_instances(**filtered)

        def refill_once_refused() -> None:
            while not rules.summary():
                time.sleep(0.01)
            clock.now += 1.0  # 20 tokens back

        threading.Thread(target=refill_once_refused, daemon=True).start()
        answer = client("ec2", "us-east-1").describe_instances(**filtered)

    # Refused, then answered on a later attempt: the SDK's standard retries at work, as against AWS.
    assert rules.summary() == {"ec2:RequestLimitExceeded:DescribeInstances": 1}
    assert answer["ResponseMetadata"]["RetryAttempts"] == 1
