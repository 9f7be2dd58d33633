"""CloudWatch adapter: the latest CPU, memory and disk readings of many instances in few calls."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

# GetMetricData takes at most 500 queries a call.
MAX_QUERIES_PER_CALL = 500


@dataclass(frozen=True)
class MetricSpec:
    key: str
    namespace: str
    metric_name: str
    stat: str = "Maximum"


# CPU comes from EC2 itself; memory and disk need the CloudWatch agent (its default metric names).
INSTANCE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("cpu", "AWS/EC2", "CPUUtilization"),
    MetricSpec("memory", "CWAgent", "mem_used_percent"),
    MetricSpec("disk", "CWAgent", "disk_used_percent"),
)


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MetricsGateway:
    def __init__(self, client: Any, specs: tuple[MetricSpec, ...] = INSTANCE_METRICS) -> None:
        self._client = client
        self._specs = specs

    def latest(
        self, instance_ids: Iterable[str], *, now: datetime, window: timedelta, period_seconds: int = 60
    ) -> dict[str, dict[str, float]]:
        """instance id -> {metric key: latest value within the window}; absent when nothing reported.

        One query per instance and metric, batched 500 to a GetMetricData call, instead of one
        GetMetricStatistics call per instance and metric.
        """
        queries: list[dict[str, Any]] = []
        owners: dict[str, tuple[str, str]] = {}
        for instance_id in sorted(set(instance_ids)):
            for spec in self._specs:
                query_id = f"m{len(queries)}"
                owners[query_id] = (instance_id, spec.key)
                queries.append(
                    {
                        "Id": query_id,
                        "MetricStat": {
                            "Metric": {
                                "Namespace": spec.namespace,
                                "MetricName": spec.metric_name,
                                "Dimensions": [{"Name": "InstanceId", "Value": instance_id}],
                            },
                            "Period": period_seconds,
                            "Stat": spec.stat,
                        },
                        "ReturnData": True,
                    }
                )
        readings: dict[str, dict[str, float]] = {}
        for batch in _chunks(queries, MAX_QUERIES_PER_CALL):
            request: dict[str, Any] = {
                "MetricDataQueries": batch,
                "StartTime": now - window,
                "EndTime": now,
                "ScanBy": "TimestampDescending",
            }
            while True:
                response = self._client.get_metric_data(**request)
                for result in response.get("MetricDataResults", []):
                    values = result.get("Values") or []
                    if not values:
                        continue
                    instance_id, key = owners[result["Id"]]
                    # Descending scan: the first value is the newest.
                    readings.setdefault(instance_id, {}).setdefault(key, float(values[0]))
                token = response.get("NextToken")
                if not token:
                    break
                request["NextToken"] = token
        return readings
