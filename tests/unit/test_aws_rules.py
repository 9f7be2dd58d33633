"""The AWS rules' own arithmetic: which EC2 bucket a call draws on, what an update does to an item's index
keys, how a bucket fills, and what FLEETKEEPER_AWS_RULES asks for."""

from __future__ import annotations

import pytest

from fleetkeeper_local import aws_rules
from fleetkeeper_local.aws_rules import (
    ENVIRONMENT,
    AwsRules,
    Limits,
    Rate,
    TokenBucket,
    updated_index_attributes,
)

INDEX_KEYS = frozenset({"GSI1PK", "GSI1SK"})


@pytest.mark.parametrize(
    ("action", "unfiltered", "bucket", "rate"),
    [
        ("DescribeInstances", True, "DescribeInstances:unfiltered", Rate(50, 10)),
        ("DescribeInstances", False, "DescribeInstances", Rate(100, 20)),
        ("DescribeImages", True, "DescribeImages", Rate(100, 20)),
        ("StopInstances", False, "StopInstances", Rate(50, 5)),
        ("RunInstances", False, "RunInstances", Rate(5, 2)),
        ("TerminateInstances", False, "TerminateInstances", Rate(100, 5)),
        ("CreateTags", False, "CreateTags", Rate(100, 10)),
        ("AuthorizeSecurityGroupIngress", False, "AuthorizeSecurityGroupIngress", Rate(50, 5)),
    ],
)
def test_given_an_ec2_action_then_it_draws_on_the_bucket_of_its_category(
    action: str, unfiltered: bool, bucket: str, rate: Rate
) -> None:
    assert Limits().ec2_request(action, unfiltered) == (bucket, rate)


def test_given_scaled_limits_then_rates_scale_and_no_bucket_holds_less_than_one_token() -> None:
    limits = Limits(dynamodb_scale=0.1, ec2_scale=0.1)

    assert limits.partition(write=True) == Rate(100, 100)
    assert limits.partition(write=False) == Rate(300, 300)
    assert limits.ec2_request("RunInstances", False) == ("RunInstances", Rate(1, 0.2))
    assert limits.ec2_resource("RunInstances") == Rate(100, 0.2)
    assert limits.ec2_resource("DescribeInstances") is None


def test_given_a_bucket_then_it_refills_at_its_rate_up_to_its_capacity_and_may_go_into_debt() -> None:
    bucket = TokenBucket(Rate(10, 2), now=0.0)

    bucket.take(15, now=0.0)
    assert bucket.level(now=0.0) == -5
    assert bucket.level(now=3.0) == 1
    assert bucket.level(now=100.0) == 10


@pytest.mark.parametrize(
    ("expression", "after"),
    [
        ("SET #a = :pk, other = :x", {"GSI1PK": "new", "GSI1SK": "old-sk"}),
        ("SET active = active + :one", {"GSI1PK": "old", "GSI1SK": "old-sk"}),
        ("SET GSI1PK = :pk REMOVE #b", {"GSI1PK": "new"}),
        ("set GSI1SK = :sk, GSI1PK = :pk", {"GSI1PK": "new", "GSI1SK": "new-sk"}),
        ("SET #v = :set DELETE #ids :id", {"GSI1PK": "old", "GSI1SK": "old-sk"}),
        ("SET GSI1PK = if_not_exists(GSI1PK, :pk)", None),
        ("ADD GSI1SK :sk", None),
    ],
)
def test_given_an_update_expression_then_the_index_keys_after_it_are_known_or_left_to_dynamodb(
    expression: str, after: dict[str, str] | None
) -> None:
    names = {"#a": "GSI1PK", "#b": "GSI1SK", "#v": "version", "#ids": "ids"}
    values = {":pk": "new", ":sk": "new-sk", ":x": "x", ":one": "1", ":set": "s", ":id": "i"}

    result = updated_index_attributes(
        {"GSI1PK": "old", "GSI1SK": "old-sk"}, expression, names, values, INDEX_KEYS
    )

    assert result == after


@pytest.mark.parametrize(
    ("value", "limits"),
    [
        ("", Limits()),
        ("on", Limits()),
        ("0.25", Limits(dynamodb_scale=0.25, ec2_scale=0.25)),
        ("dynamodb=0.1, ec2=2", Limits(dynamodb_scale=0.1, ec2_scale=2)),
        ("dynamodb=0.5", Limits(dynamodb_scale=0.5)),
    ],
)
def test_given_the_environment_then_the_rules_take_its_figures(
    value: str, limits: Limits, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENVIRONMENT, value)

    rules = AwsRules.from_environ()

    assert rules is not None
    assert rules.limits == limits


@pytest.mark.parametrize("value", ["off", "0", "false"])
def test_given_off_then_there_are_no_rules(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENVIRONMENT, value)

    assert AwsRules.from_environ() is None


@pytest.mark.parametrize("value", ["fast", "s3=0.1", "-1", "dynamodb=0"])
def test_given_a_bad_value_then_the_error_names_the_variable(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENVIRONMENT, value)

    with pytest.raises(ValueError, match=ENVIRONMENT):
        AwsRules.from_environ()


def test_given_many_partitions_then_full_buckets_are_forgotten_and_spent_ones_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(aws_rules, "_MAX_BUCKETS", 3)
    now = [0.0]
    rules = AwsRules(clock=lambda: now[0])
    spent = rules._bucket(("spent",), Rate(10, 1))
    spent.take(10, now[0])
    rules._bucket(("full-1",), Rate(10, 1))
    rules._bucket(("full-2",), Rate(10, 1))

    rules._bucket(("new",), Rate(10, 1))

    assert set(rules._buckets) == {("spent",), ("new",)}
    assert rules._bucket(("spent",), Rate(10, 1)) is spent
