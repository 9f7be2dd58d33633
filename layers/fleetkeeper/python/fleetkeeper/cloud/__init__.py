"""Adapters for AWS services other than DynamoDB: EC2, Step Functions, EventBridge, SNS, CloudWatch."""
