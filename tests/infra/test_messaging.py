"""The operators' topic is KMS-encrypted and reachable by alarms; the DLQs are encrypted and TLS-only."""

from __future__ import annotations

from tests.infra.helpers import flat, properties, resources


def test_given_the_topic_then_it_is_encrypted_with_a_rotating_key(dev):
    (topic,) = properties(dev, "AWS::SNS::Topic")
    (key_id,) = resources(dev, "AWS::KMS::Key")
    assert topic["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert resources(dev, "AWS::KMS::Key")[key_id]["Properties"]["EnableKeyRotation"] is True


def test_given_the_key_policy_then_cloudwatch_alarms_can_encrypt_for_the_topic(dev):
    (key,) = properties(dev, "AWS::KMS::Key")
    statements = key["KeyPolicy"]["Statement"]
    cloudwatch = [s for s in statements if s.get("Principal") == {"Service": "cloudwatch.amazonaws.com"}]
    assert cloudwatch
    assert set(cloudwatch[0]["Action"]) == {"kms:Decrypt", "kms:GenerateDataKey"}


def test_given_the_topic_policy_then_it_refuses_plain_http_and_admits_this_accounts_alarms(dev):
    (policy,) = properties(dev, "AWS::SNS::TopicPolicy")
    statements = policy["PolicyDocument"]["Statement"]
    deny = [s for s in statements if s["Effect"] == "Deny"]
    assert deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
    (alarms,) = [s for s in statements if s["Effect"] == "Allow"]
    assert alarms["Principal"] == {"Service": "cloudwatch.amazonaws.com"}
    assert flat(alarms["Condition"]["ArnLike"]["aws:SourceArn"]).endswith(":alarm:*")


def test_given_an_alarm_email_then_it_is_subscribed_and_otherwise_nobody_is(dev, pinned):
    assert properties(dev, "AWS::SNS::Subscription") == []
    (subscription,) = properties(pinned, "AWS::SNS::Subscription")
    assert subscription["Protocol"] == "email"
    assert subscription["Endpoint"] == "fleet-ops@example.com"


def test_given_the_dead_letter_queues_then_they_are_encrypted_and_tls_only(dev):
    queues = resources(dev, "AWS::SQS::Queue")
    assert len(queues) == 2
    for queue in queues.values():
        assert queue["Properties"]["SqsManagedSseEnabled"] is True
        assert queue["Properties"]["MessageRetentionPeriod"] == 14 * 24 * 3600
    for policy in properties(dev, "AWS::SQS::QueuePolicy"):
        denies = [s for s in policy["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
        assert denies[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
