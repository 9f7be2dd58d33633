"""AWS list prices the cost model uses, in one place, with the date they were taken.

US East (N. Virginia), on-demand, no free tier, in US dollars. Prices change: re-check them against the
AWS pricing pages before quoting a figure, and update PRICES_AS_OF with them.
"""

from __future__ import annotations

from typing import Final

PRICES_AS_OF: Final = "2025-06 (us-east-1 list prices)"

# Step Functions Standard: per state transition.
SFN_TRANSITION: Final = 0.025 / 1_000
# Lambda on Arm (Graviton): per request and per GB-second of duration.
LAMBDA_REQUEST: Final = 0.20 / 1_000_000
LAMBDA_GB_SECOND_ARM: Final = 0.0000133334
# DynamoDB on-demand: per write and read request unit (the November 2024 prices).
DDB_WRITE_UNIT: Final = 0.625 / 1_000_000
DDB_READ_UNIT: Final = 0.125 / 1_000_000
# EventBridge custom events (per event put) and EventBridge Scheduler invocations.
EVENTBRIDGE_EVENT: Final = 1.00 / 1_000_000
SCHEDULER_INVOCATION: Final = 1.00 / 1_000_000
# API Gateway REST API: per request (first 333 million a month).
API_GATEWAY_REQUEST: Final = 3.50 / 1_000_000
# CloudWatch: a custom metric per month (first 10,000), a standard alarm per month, a metric read by
# GetMetricData (charged per metric requested, not per call).
CW_METRIC_MONTH: Final = 0.30
CW_ALARM_MONTH: Final = 0.10
CW_GET_METRIC_DATA_METRIC: Final = 0.01 / 1_000
# SNS: per published message (first million free; the alert volume is tiny either way).
SNS_PUBLISH: Final = 0.50 / 1_000_000

# EC2 on-demand Linux, per instance-hour while running (billed from running to stopping or terminating),
# and the EBS gp3 volume a worker keeps while it exists, running or stopped, per GB-month.
EC2_HOUR: Final = {"m6i.xlarge": 0.192}
EBS_GP3_GB_MONTH: Final = 0.08

# Lambda SnapStart for Python: the snapshot cache per GB-second while a published version is active
# (restores, per GB restored, are priced per cold start and negligible beside it).
SNAPSTART_CACHE_GB_SECOND: Final = 0.0000015046

SECONDS_PER_MONTH: Final = 30 * 24 * 3600
